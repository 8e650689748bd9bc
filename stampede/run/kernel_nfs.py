"""A POSIX target on a kernel NFS mount: what the layout's phase cost that mount in RPCs,
read from /proc/self/mountstats (stampede.sysinfo) on rank 0 before and after the layout
ran. The counters are the whole mount's on rank 0's node (every process using it, the
node's other ranks included), untimed, so nothing is added to a timed op."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from stampede.results.model import LayoutRun
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from stampede.mpi import Comm
    from stampede.sysinfo import OpCounters

# stampede.sysinfo is imported past each function's early return: every rank imports this
# module, rank 0 of a kernel NFS mount alone reads the counters.
SCOPE = "rank 0's node: the whole mount's counters (every process on that node using it)"


def mountpoint(comm: Comm, target: str) -> str:
    """Rank 0: the kernel NFS mount a POSIX target lies on ("" elsewhere, or not NFS)."""
    if comm.Get_rank() != 0 or not capabilities_for(target).local_files:
        return ""
    from stampede.sysinfo import mount_of

    mount = mount_of(target)
    return mount.mountpoint if mount.fs_type.startswith("nfs") else ""


def before(where: str) -> dict[str, OpCounters] | None:
    if not where:
        return None
    from stampede.sysinfo import read_mountstats

    return read_mountstats(where)


def counted(run: LayoutRun, where: str, start: dict[str, OpCounters] | None) -> LayoutRun:
    """The run with the mount's per-op deltas since `start` (unchanged where none)."""
    if not where or start is None:
        return run
    from stampede.sysinfo import mountstats_delta, read_mountstats

    end = read_mountstats(where)
    if end is None:
        return run
    return replace(run, kernel_nfs={"mount": where, "scope": SCOPE,
                                    "ops": mountstats_delta(start, end)})
