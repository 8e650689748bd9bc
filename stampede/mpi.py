"""MPI: the only module that imports mpi4py.

Every function takes `comm` as a parameter; only the CLI resolves COMM_WORLD (`world()`).
Without mpi4py installed, or outside mpiexec, a run is one rank (`SingleRank`).

Waits that are not timed must not spin: on oversubscribed nodes MPI busy-polls inside a
barrier and steals the core from the ranks still being measured. They use non-blocking
collectives tested with a short sleep (`_wait_politely`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar, cast

import numpy as np

from stampede.errors import StampedeError, UsageError, install_hint
from stampede.launcher import launcher_size

if TYPE_CHECKING:
    from mpi4py.MPI import Op
    from mpi4py.typing import BufSpec, BufSpecV, InPlace

T = TypeVar("T")
POLL_SLEEP_S = 0.0005


class Request(Protocol):
    """A non-blocking operation in flight (mpi4py's MPI.Request): tested, or waited for."""

    def Test(self) -> bool: ...  # noqa: N802 - mpi4py's spelling
    def Wait(self) -> bool: ...  # noqa: N802


class Comm(Protocol):
    """The communicator as stampede uses it: exactly the methods called on one, spelled as
    mpi4py's MPI.Comm spells them, so MPI.COMM_WORLD and its splits satisfy it as they are."""

    def Get_rank(self) -> int: ...  # noqa: N802
    def Get_size(self) -> int: ...  # noqa: N802
    def Abort(self, errorcode: int = 0) -> NoReturn: ...  # noqa: N802
    def Barrier(self) -> None: ...  # noqa: N802
    def Ibarrier(self) -> Request: ...  # noqa: N802
    def Free(self) -> None: ...  # noqa: N802
    def Split(self, color: int = 0, key: int = 0) -> Comm: ...  # noqa: N802
    def Split_type(self, split_type: int, key: int = 0) -> Comm: ...  # noqa: N802
    def Send(self, buf: BufSpec, dest: int, tag: int = 0) -> None: ...  # noqa: N802
    def Isend(self, buf: BufSpec, dest: int, tag: int = 0) -> Request: ...  # noqa: N802
    def Irecv(self, buf: BufSpec, source: int = ..., tag: int = ...) -> Request: ...  # noqa: N802
    def Bcast(self, buf: BufSpec, root: int = 0) -> None: ...  # noqa: N802
    def Gatherv(self, sendbuf: BufSpec | InPlace, recvbuf: BufSpecV | None,  # noqa: N802
                root: int = 0) -> None: ...
    def Allgatherv(self, sendbuf: BufSpec | InPlace, recvbuf: BufSpecV) -> None: ...  # noqa: N802
    def Allreduce(self, sendbuf: BufSpec | InPlace, recvbuf: BufSpec, op: Op = ...) -> None: ...  # noqa: N802
    def Iallreduce(self, sendbuf: BufSpec | InPlace, recvbuf: BufSpec,  # noqa: N802
                   op: Op = ...) -> Request: ...
    def Reduce(self, sendbuf: BufSpec | InPlace, recvbuf: BufSpec | None,  # noqa: N802
               op: Op = ..., root: int = 0) -> None: ...
    def bcast(self, obj: object, root: int = 0) -> object: ...
    def gather(self, sendobj: object, root: int = 0) -> list[object] | None: ...
    def allgather(self, sendobj: object) -> list[object]: ...


class SingleRank:
    """The communicator of a run without MPI: rank 0 of 1. Only what size-1 paths use."""

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's spelling
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def Abort(self, errorcode: int = 1) -> None:  # noqa: N802
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(errorcode)


def world() -> Comm:
    """COMM_WORLD when mpi4py is importable (this initialises MPI), else a single rank.

    A launcher that started N ranks whose MPI then sees one rank each (a foreign mpiexec,
    or mpi4py missing) would make N independent runs write the same files and archive:
    that is refused on every rank.
    """
    expected = launcher_size()
    try:
        from mpi4py import MPI
    except ImportError:
        if expected and expected > 1:
            raise UsageError(f"launched as {expected} ranks, but mpi4py is not installed",
                             hint=f"{install_hint('mpi')} built against your MPI (--no-binary mpi4py), "
                                  f"or {install_hint('mpich')} and its mpiexec") from None
        # SingleRank has only what size-1 paths call: every other method is behind a size test
        return cast(Comm, SingleRank())
    comm = MPI.COMM_WORLD
    if expected and expected > 1 and comm.Get_size() == 1:
        raise UsageError(f"launched as {expected} ranks, but MPI sees 1 rank in each process: "
                         "the launcher does not match the MPI library mpi4py uses",
                         hint="launch with the mpiexec of that MPI (for PyPI's MPICH: the venv's "
                              "bin/mpiexec), or srun --mpi=pmi2")
    return comm


def library_version(comm: Comm) -> str:
    if isinstance(comm, SingleRank):
        return "none (mpi4py not installed: one rank)"
    from mpi4py import MPI
    return str(MPI.Get_library_version()).strip().splitlines()[0]


def processor_name(comm: Comm) -> str:
    if isinstance(comm, SingleRank):
        import socket
        return socket.gethostname()
    from mpi4py import MPI
    return str(MPI.Get_processor_name())


def _wait_politely(request: Request, timeout_s: float | None) -> bool:
    """Test a non-blocking request, sleeping between tests; False on timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not request.Test():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(POLL_SLEEP_S)
    return True


def barrier(comm: Comm, timeout_s: float | None = None) -> bool:
    """Wait for every rank without spinning, then align exits with a real Barrier.

    The polite wait absorbs the long part (ranks arriving at different times); the final
    Barrier finds everyone present, so ranks leave it within microseconds of each other
    and a clock origin taken right after it is shared. False if the wait timed out.
    """
    if comm.Get_size() == 1:
        return True
    if not _wait_politely(comm.Ibarrier(), timeout_s):
        return False
    comm.Barrier()
    return True


def allreduce_sum(comm: Comm, values: np.ndarray, timeout_s: float | None = None) -> np.ndarray | None:
    """Element-wise sum over ranks of an int64 vector, waiting politely; None on timeout."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if comm.Get_size() == 1:
        return values.copy()
    from mpi4py import MPI
    result = np.empty_like(values)
    if not _wait_politely(comm.Iallreduce(values, result, op=MPI.SUM), timeout_s):
        return None
    return result


def gather_rows(comm: Comm, rows: np.ndarray, root: int = 0) -> list[np.ndarray] | None:
    """Gather each rank's 2-D int64 array to root with one Gatherv (no per-sample pickling).

    Returns the per-rank arrays on root (index = rank), None elsewhere.
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    width = rows.shape[1]
    if comm.Get_size() == 1:
        return [rows.copy()]
    counts = cast("list[int]", comm.gather(rows.size, root=root))
    if comm.Get_rank() != root:
        comm.Gatherv(rows.ravel(), None, root=root)
        return None
    received = np.empty(sum(counts), dtype=np.int64)
    comm.Gatherv(rows.ravel(), [received, counts], root=root)
    bounds = np.cumsum([0, *counts])
    return [received[lo:hi].reshape(-1, width) for lo, hi in zip(bounds[:-1], bounds[1:])]


def split(comm: Comm, color: int, by_node: bool = False, key: int | None = None) -> Comm:
    """The communicator of the ranks with the same color (and node, if by_node), ordered
    by `key` (default: world order, so a group's rank 0 is its lowest world rank)."""
    if comm.Get_size() == 1:
        return comm
    from mpi4py import MPI
    order = comm.Get_rank() if key is None else key
    if by_node:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        group = node.Split(color, key=order)
        node.Free()
        return group
    return comm.Split(color, key=order)


def free(group: Comm, world: Comm) -> None:
    """Release a communicator made by split (never the world one)."""
    if group is not world and group.Get_size() > 0 and not isinstance(group, SingleRank):
        group.Free()


def node_rank(comm: Comm) -> int:
    """This rank's index among the ranks on its node (its `local_rank`)."""
    if comm.Get_size() == 1:
        return 0
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    local = int(node.Get_rank())
    node.Free()
    return local


def node_min(comm: Comm, values: np.ndarray) -> np.ndarray:
    """Element-wise MIN of an int64 vector over the ranks of this rank's node."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if comm.Get_size() == 1:
        return values.copy()
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    result = np.empty_like(values)
    node.Allreduce(values, result, op=MPI.MIN)
    node.Free()
    return result


def reduce_to_root(comm: Comm, values: np.ndarray, how: str, root: int = 0) -> np.ndarray | None:
    """Element-wise sum, min or max of an int64 array over all ranks, on root only."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if comm.Get_size() == 1:
        return values.copy()
    from mpi4py import MPI
    result = np.empty_like(values) if comm.Get_rank() == root else None
    comm.Reduce(values, result, op={"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX}[how], root=root)
    return result


def bcast_bytes(group: Comm, view: memoryview, root: int = 0) -> None:
    """Broadcast a buffer in place (root sends, the others receive into it)."""
    if group.Get_size() > 1:
        from mpi4py import MPI
        group.Bcast([view, MPI.BYTE], root=root)


def allgather_bytes(group: Comm, view: memoryview, parts: tuple[tuple[int, int], ...]) -> None:
    """Complete a buffer in place: member i contributes parts[i] = (offset, length)."""
    if group.Get_size() > 1:
        from mpi4py import MPI
        counts = [length for _, length in parts]
        offsets = [offset for offset, _ in parts]
        group.Allgatherv(MPI.IN_PLACE, [view, counts, offsets, MPI.BYTE])


def scatter_bytes(group: Comm, view: memoryview, parts: tuple[tuple[int, int], ...],
                  length: int) -> None:
    """Root holds every member's bytes, member i's at parts[i] = (offset, length) in its
    view; each other member receives its `length` bytes at the front of its own view, and
    root moves its own part there. Point to point, not Scatterv: two members that hold one
    shard (replicas on one node) are sent the same bytes, which Scatterv forbids."""
    if group.Get_rank() == 0:
        if group.Get_size() > 1:
            from mpi4py import MPI
            sends = [group.Isend([view[offset:offset + count], MPI.BYTE], dest=member, tag=40)
                     for member, (offset, count) in enumerate(parts) if member]
            for request in sends:   # timed (op scatter), as the blocking Bcast is
                request.Wait()
        offset, count = parts[0]
        if offset:   # its own part last: the sends read the buffer's other parts first
            view[:count] = bytes(view[offset:offset + count]) if offset < count \
                else view[offset:offset + count]
    else:
        from mpi4py import MPI
        group.Irecv([view[:length], MPI.BYTE], source=0, tag=40).Wait()


def gather(comm: Comm, obj: T, root: int = 0) -> list[T] | None:
    """Small Python objects (host names, error messages) to root."""
    if comm.Get_size() == 1:
        return [obj]
    return cast("list[T] | None", comm.gather(obj, root=root))


def bcast(comm: Comm, obj: T, root: int = 0) -> T:
    if comm.Get_size() == 1:
        return obj
    return cast(T, comm.bcast(obj, root=root))


def collective(comm: Comm, what: str, action: Callable[[], T], alone: bool = False) -> T:
    """Run `action` on every rank; if it fails on any rank, raise on every rank.

    The error raised everywhere names each failing rank (up to ten), so rank 0 can print
    one report, and no rank is left waiting in a later collective for a rank that died.
    With one rank, or `alone` (the action runs on the root only: on_root), the error is
    said as it is, after `what`.
    """
    error: StampedeError | OSError | None = None
    result: T | None = None
    try:
        result = action()
    except (StampedeError, OSError) as caught:
        error = caught
    barrier(comm)
    single = alone or comm.Get_size() == 1
    message = None if error is None else (str(error) if single else
                                          f"rank {comm.Get_rank()}: {error}")
    status = 0 if error is None else getattr(error, "exit_status", 1)
    if comm.Get_size() == 1:
        reports = [(message, status)]
    else:
        reports = cast("list[tuple[str | None, int]]", comm.allgather((message, status)))
    failed = [(text, code) for text, code in reports if text is not None]
    if failed:
        exit_status = max(code for _, code in failed)
        lines = [text for text, _ in failed[:10]]
        more = f"\n  ... and {len(failed) - 10} more ranks" if len(failed) > 10 else ""
        summary = f"{what}: {lines[0]}" if single else \
            f"{what} failed on {len(failed)} of {len(reports)} ranks:\n  " + \
            "\n  ".join(str(line) for line in lines) + more
        raised = StampedeError(summary)
        raised.exit_status = exit_status
        raised.collective = True
        raise raised
    return result  # type: ignore[return-value]


def on_root(comm: Comm, what: str, action: Callable[[], T], root: int = 0) -> T:
    """Run `action` on root only (reading a manifest, creating a directory), collectively:
    its error is raised on every rank, its result broadcast to every rank."""
    result: T | None = collective(comm, what, action if comm.Get_rank() == root else lambda: None,
                                  alone=True)
    return bcast(comm, result, root=root)  # type: ignore[return-value]


# MPI_Abort ends every rank at once, and hydra, tearing the job down, can drop output its
# proxies have not forwarded yet: the very error that made the rank abort (a CI run once
# kept only a traceback's first line). Output flushed, a moment lets it through first.
OUTPUT_GRACE_S = 0.5


def abort(comm: Comm, message: str = "", status: int = 3) -> None:
    """Stop every rank of the job, `message` (if any) on stderr first: used when a rank
    cannot be reached any more, and by the CLI when one rank alone fails."""
    if message:
        print(f"stampede: rank {comm.Get_rank()}: {message}; aborting the MPI job",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    remove_shared_segments()
    time.sleep(OUTPUT_GRACE_S)
    comm.Abort(status)


SHM_PREFIX = "/dev/shm/mpich_shm_"


def remove_shared_segments(maps: str = "/proc/self/maps") -> list[str]:
    """Unlink the MPICH shared-memory segments (/dev/shm/mpich_shm_*) this process has
    mapped, and return their paths. MPICH removes them when its ranks finish; MPI_Abort
    kills them first, and the segments stayed in /dev/shm (2 MiB each, from every aborted
    job). Only those mapped here are this job's: another job's are never named. Every
    rank of the node maps them, so any aborting rank removes them; the mappings outlive
    the name, so the ranks still running are not disturbed. Best effort: a name already
    gone (another rank was first) or a /proc that cannot be read removes nothing."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            found = {line.split(None, 5)[5].strip() for line in lines
                     if line.count(" ") >= 5 and SHM_PREFIX in line}
    except OSError:
        return []
    removed = []
    for path in sorted(found):
        name = path[len(SHM_PREFIX):]
        if not path.startswith(SHM_PREFIX) or not name or "/" in name or " " in name:
            continue   # " (deleted)" and the like: not a name to unlink
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed
