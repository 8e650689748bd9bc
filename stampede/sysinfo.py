"""Facts about where a run happened, recorded in the sidecar: mounts, Slurm, the node,
and a kernel NFS mount's per-op counters (what a mount's type means: stampede.filesystems)."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from stampede.units import BYTES_PER_KIB


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fs_type: str
    options: str


def meminfo_bytes(key: str = "MemTotal", meminfo: str = "/proc/meminfo") -> int | None:
    """One field of /proc/meminfo in bytes (MemTotal, MemAvailable), None when unknown."""
    try:
        with open(meminfo) as stream:
            for line in stream:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * BYTES_PER_KIB
    except OSError:
        pass
    return None


def _unescape(field: str) -> str:
    # /proc/mounts escapes spaces, tabs, newlines and backslashes as octal.
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mount_of(path: str | Path, mounts_file: str = "/proc/mounts") -> Mount:
    """The mount that holds `path` (longest mount point that is a prefix of it)."""
    resolved = Path(path).resolve()
    while not resolved.exists() and resolved != resolved.parent:
        resolved = resolved.parent
    best = Mount("?", "/", "unknown", "")
    try:
        lines = Path(mounts_file).read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        mountpoint = Path(_unescape(fields[1]))
        if (resolved == mountpoint or mountpoint in resolved.parents) and \
                len(str(mountpoint)) >= len(best.mountpoint):
            best = Mount(fields[0], str(mountpoint), fields[2], fields[3])
    return best


def slurm_job_id() -> str:
    """The Slurm job this process runs in ("" outside Slurm): a column of every row."""
    return os.environ.get("SLURM_JOB_ID", "")


def slurm_variables() -> dict[str, str]:
    """SLURM_* variables of the job step, as the scheduler set them."""
    return {key: value for key, value in sorted(os.environ.items()) if key.startswith("SLURM_")}


# NFS mount options that change what a restore measures: attribute caching (ac*, actimeo)
# turns repeated stats into cache hits; vers, nconnect, rsize and proto set the data path.
NFS_KEYS = ("vers", "proto", "nconnect", "rsize", "wsize", "actimeo", "acregmin", "acregmax",
            "acdirmin", "acdirmax", "noac", "lookupcache", "hard", "soft", "timeo", "retrans")


def nfs_options(options: str) -> dict[str, str]:
    """The NFS mount options that matter, from /proc/mounts' option string."""
    found = {}
    for option in options.split(","):
        key, _, value = option.partition("=")
        if key in NFS_KEYS:
            found[key] = value or "on"
    return found


def node_facts() -> dict[str, object]:
    """What rank 0 records about its node (the target's mount: stampede.filesystems)."""
    from stampede import oploop

    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "metadata_loop": oploop.which()}


class OpCounters(NamedTuple):
    """One op's line of an NFS mount's per-op statistics (/proc/self/mountstats, RPC
    iostats 1.0 and 1.1; cumulative since the mount): calls, transmissions (more than
    calls: retransmits), major timeouts, bytes sent and received, and the milliseconds
    the calls spent queued, on the wire and in all (execute); errors from iostats 1.1."""

    ops: int
    transmissions: int
    timeouts: int
    bytes_sent: int
    bytes_recv: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int = 0


def nfs_mountstats(text: str, mountpoint: str) -> dict[str, OpCounters] | None:
    """The per-op table of the NFS mount at `mountpoint` in mountstats text (None where
    that mount has none: not NFS, or not mounted)."""
    found: dict[str, OpCounters] | None = None
    inside = in_table = False
    for line in text.splitlines():
        if line.startswith("device "):
            if inside and found is not None:
                break
            words = line.split()
            inside = len(words) > 4 and words[2:4] == ["mounted", "on"] and \
                _unescape(words[4]) == mountpoint
            in_table = False
            continue
        if not inside:
            continue
        stripped = line.strip()
        if stripped == "per-op statistics":
            in_table, found = True, {}
        elif in_table and found is not None and ":" in stripped:
            name, _, counts = stripped.partition(":")
            values = [int(value) for value in counts.split()]
            if 8 <= len(values) <= 9:
                found[name] = OpCounters(*values)
    return found


def mountstats_delta(before: dict[str, OpCounters], after: dict[str, OpCounters]
                     ) -> dict[str, dict[str, int]]:
    """What happened between two readings: per op that moved, each counter's increase."""
    delta = {}
    for name, counters in after.items():
        was = before.get(name, OpCounters(0, 0, 0, 0, 0, 0, 0, 0))
        moved = {field: now - then for field, now, then in zip(OpCounters._fields, counters, was)}
        if any(moved.values()):
            delta[name] = moved
    return delta


def read_mountstats(mountpoint: str, path: str = "/proc/self/mountstats"
                    ) -> dict[str, OpCounters] | None:
    """nfs_mountstats of this machine's mount (None: not NFS, or unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    return nfs_mountstats(text, mountpoint)
