"""`stampede emulate-mds`: a laptop-sized stand-in for an overloaded metadata server.

    stampede emulate-mds MOUNTPOINT --backing DIR [--service-s S] [--threads C]
                         [--serialize-inode] [--jitter-s J] [--attr-cache-s 0]
                         [--priority realtime|normal] [--summary-json PATH]
                         [--log PATH [--log-limit N]]
                         [--writable [--create-s S] [--mkdir-s S] [--rename-s S]
                          [--unlink-s S] [--rmdir-s S] [--fsync-s S] [--serialize-dir]]

It mounts a FUSE file system at MOUNTPOINT that shows DIR, read-only unless --writable. Data passes through
(read, release/close, readdir's names), but every metadata request - getattr (which also
answers the kernel's LOOKUP of a name), open, opendir, readdir, readlink - is served by one
of C service slots (a semaphore): the real operation runs in the slot, which is held until
S seconds (plus a uniform random [0, J) with --jitter-s) after it was taken, a deadline on
the monotonic clock (stampede.emulate.service has how it is held to within microseconds):
C metadata threads that each take S per request, as on an NFS server or a Lustre MDS under
load. With --serialize-inode, requests on the same file also queue one at a time, in arrival order,
on a lock per path (they wait for the lock before they take a slot): N ranks stat-ing one
shared file take N times as long as N ranks stat-ing a file each. Directories are not
serialized: lookups in one directory are shared (read) operations on real servers, and
the hot spot this models is the file.

The log (--log PATH): every request served, one JSON line each, written when the
emulator stops: the op, its path (a rename's two), the locks it queued on ("file:PATH"
with --serialize-inode, "dir:PATH" with --serialize-dir), the monotonic clock's times at
which it arrived, took its slot and left it, and the slot's number. It answers what a
latency can only suggest: how many requests one stat costs, that at most C were in
service at once, that requests on one lock never overlapped, that each held S. Kept in
memory up to --log-limit requests (default 200,000, about 50 MiB), the rest counted.

Precision. The summary at exit gives, per op, the time held next to the time asked (and
the most requests in service at once, of every op and of each); --summary-json writes it
for scripts. The server's threads run SCHED_FIFO (--priority realtime, the default, where
the kernel allows it), so that the ranks and whatever else runs on the machine do not
stretch the service: on a busy 2-core VM a slot then held S + 2-4 µs at the median and
1-4% over S on average at S >= 1 ms (the tail: the host deschedules the VM's CPUs at
times), and stampede's stat storm saw 1.007 S per request (bench/emulator_precision.py).
On top the clients see the round trip, which on that VM grew by about 0.1 ms a request
once S > 0 (idle CPUs wake up): (stat p50 - its value at S = 0) / requests was within 5%
of S from S = 4 ms.

The kernel's attribute and entry caches are off (attr_timeout = entry_timeout =
negative_timeout = --attr-cache-s, default 0), so every stat reaches the emulator: with
them off, stat(2) of MOUNTPOINT/dir/file costs one LOOKUP per path component below the
mount (the kernel revalidates each name) and one GETATTR of the file, i.e. three service
times for a checkpoint file (`sharded/shard-….raw`, `shared/checkpoint.raw`). Reads may
add GETATTRs of their own (the kernel checks the file size), as NFS clients do. The file
system is multithreaded (libfuse's worker pool grows with the requests in flight; its
cap is raised to thousands), so C slots really serve C requests at once; a single-threaded
FUSE daemon would serialize all. libfuse 3 asks the kernel for parallel directory operations:
lookups and listings in one directory reach the emulator together, as first lookups of
names do on a real server (libfuse 2 could not: the kernel serialized them per directory).

Lifecycle: runs in the foreground until unmounted (`fusermount -u MOUNTPOINT`, exit 0),
Ctrl-C (SIGINT), SIGTERM or SIGHUP; each ends with the file system unmounted by libfuse
and a summary of the requests served on stderr. It also always asks the kernel to send it
SIGTERM when its parent process dies (prctl PR_SET_PDEATHSIG; there is no flag to turn it
off): an emulator left running would leave a slow mount behind. A parent that died before
that request was in place (a subshell, `( stampede emulate-mds ... & )`, exits before
Python has even started) is seen too: the emulator then exits with status 1 and mounts
nothing (`orphaned` has how it tells; a session leader, started by setsid or a
supervisor, is taken as meant to run detached). Run it with `&` from the shell that runs
the benchmark, or under a supervisor. Only SIGKILL leaves a stale mount ("Transport
endpoint is not connected"): `fusermount -u MOUNTPOINT` clears it.

Root only (it mounts with allow_other so that ranks of any user can use it). The kernel
does no permission checks (that would add a GETATTR per path component); the emulator
refuses open/readdir to other users by the backing files' mode bits (owner, the primary
group, others; supplementary groups are not known to it). Writes are refused (read-only):
prepare the checkpoint in DIR directly, then point target.path at MOUNTPOINT; or mount
it --writable (stampede.emulate.writable, below) and save through it.

Needs mfusepy and libfuse 3 (`pip install 'stampede[emulate]'`, `apt-get install fuse3`),
imported only when the command runs.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import stat
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, TypeVar

from stampede.emulate.service import (
    SPIN_S,
    Served,
    ServiceLog,
    ServiceTally,
    Slots,
    hold_until,
    spin_for,
)

if TYPE_CHECKING:
    from types import ModuleType

Result = TypeVar("Result")   # what a request's real operation returns, handed back
FUSE_HINT = "pip install 'stampede[emulate]' and apt-get install fuse3"
STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns", "st_mtime_ns",
               "st_ctime_ns", "st_blocks", "st_blksize", "st_rdev")
PR_SET_PDEATHSIG = 1
METADATA_OPS = ("getattr", "open", "opendir", "readdir", "readlink")


class FifoLock:
    """A lock granted in arrival order (threading.Lock lets a newcomer barge in)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            while self._serving != ticket:
                self._condition.wait()

    def __exit__(self, *exc_info: object) -> None:
        with self._condition:
            self._serving += 1
            self._condition.notify_all()


NamedLock = tuple[str, FifoLock]   # ("file:/path" or "dir:/path", the lock): the log names it


READ, WRITE, SEARCH = 4, 2, 1   # a mode's rwx bits, as the owner/group/other triples hold them


def permitted(status: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether the caller may do `want` (READ | WRITE | SEARCH bits) to this file by its
    mode bits: the owner's triple, the primary group's, or the others'; root may."""
    if uid == 0:
        return True
    if uid == status.st_uid:
        triple = (status.st_mode >> 6) & 0o7
    elif gid == status.st_gid:
        triple = (status.st_mode >> 3) & 0o7
    else:
        triple = status.st_mode & 0o7
    return triple & want == want


class MetadataServer:
    """mfusepy operations: metadata through C slots of service_s seconds, data straight
    through.

    mfusepy calls the method of each request's name; an OSError becomes the errno returned
    to the kernel. Operations not defined here (write, create, ...) are not registered:
    ENOSYS, and the mount is read-only anyway (stampede.emulate.writable has the writable
    server).
    """

    use_ns = True   # mfusepy: times in nanoseconds (st_*time_ns)
    OPS: tuple[str, ...] = METADATA_OPS   # the ops served (and tallied)

    def __init__(self, backing: str, service_s: float, threads: int, serialize: bool = False,
                 jitter_s: float = 0.0, caller: Callable[[], tuple[int, int, int]] | None = None,
                 on_mount: Callable[[], None] | None = None, spin_s: float = SPIN_S,
                 log: ServiceLog | None = None) -> None:
        self.backing = backing
        self.service_s, self.jitter_s, self.serialize = service_s, jitter_s, serialize
        self.threads = threads
        self._slots = Slots(threads)
        self.log = log
        self._caller = caller or (lambda: (0, 0, 0))
        self._on_mount = on_mount
        self.spin_s = spin_s
        self._guard = threading.Lock()
        self._path_locks: dict[str, FifoLock] = {}
        self.tally = ServiceTally(self.OPS)

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _serve(self, op: str, path: str, is_directory: bool, work: Callable[[], Result]) -> Result:
        """A read-side request: queued for the path (files, with --serialize-inode), then
        held for the service time (_held)."""
        locks = () if is_directory or not self.serialize else \
            (self._lock(self._path_locks, "file", path),)
        return self._held(op, (path,), self.service_s, locks, work)

    def _held(self, op: str, paths: tuple[str, ...], service_s: float, locks: Sequence[NamedLock],
              work: Callable[[], Result]) -> Result:
        """Wait for each lock in turn (callers order them), take a slot, run the real
        operation and hold the slot until take-time + the service time (a deadline: the
        operation's own time is part of the service, not added to it). Tallied, and
        logged (--log) with the slot, after the hold and before the slot and locks go."""
        arrived_s = time.monotonic()
        with ExitStack() as queued:
            for _, lock in locks:
                queued.enter_context(lock)
            with self._slots.taken() as slot:
                taken_s = time.monotonic()
                self.tally.started(op)
                asked_s = service_s + (random.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)
                try:
                    return work()
                finally:
                    hold_until(taken_s + asked_s, spin_for(asked_s, self.spin_s))
                    left_s = time.monotonic()
                    self.tally.add(op, asked_s, left_s - taken_s, taken_s - arrived_s)
                    if self.log is not None:
                        self.log.add(Served(op, paths, tuple(name for name, _ in locks),
                                            arrived_s, taken_s, left_s, slot))

    def _lock(self, table: dict[str, FifoLock], kind: str, key: str) -> NamedLock:
        """The lock of a file or a directory (kind), made on first use, with its name."""
        with self._guard:
            return f"{kind}:{key}", table.setdefault(key, FifoLock())

    def _lstat(self, path: str) -> os.stat_result | OSError:
        try:
            return os.lstat(self._real(path))
        except OSError as error:
            return error

    def _check(self, status: os.stat_result, want: int = READ) -> None:
        """EACCES unless the caller may `want` this file (the kernel checks nothing)."""
        uid, gid, _ = self._caller()
        if not permitted(status, uid, gid, want):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    # --- metadata: through the slots ------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        found = self._lstat(path)     # a missing name costs a service time too (negative lookup)
        is_directory = isinstance(found, os.stat_result) and stat.S_ISDIR(found.st_mode)

        def attributes() -> dict[str, int]:
            if isinstance(found, OSError):
                raise found
            result = {field: getattr(found, field) for field in STAT_FIELDS}
            for name in ("atime", "mtime", "ctime"):
                result[f"st_{name}"] = result.pop(f"st_{name}_ns")
            return result

        return self._serve("getattr", path, is_directory, attributes)

    def readlink(self, path: str) -> str:
        return self._serve("readlink", path, False,
                           lambda: os.readlink(self._real(path)))

    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))

        def open_file() -> int:
            descriptor = os.open(self._real(path), os.O_RDONLY)
            try:
                self._check(os.fstat(descriptor))
            except OSError:
                os.close(descriptor)
                raise
            return descriptor

        return self._serve("open", path, False, open_file)

    def opendir(self, path: str) -> int:
        def open_directory() -> int:
            self._check(os.stat(self._real(path)))
            return 0

        return self._serve("opendir", path, True, open_directory)

    def readdir(self, path: str, fh: int) -> list[str]:
        return self._serve("readdir", path, True,
                           lambda: [".", "..", *os.listdir(self._real(path))])

    # --- data and bookkeeping: straight through ---------------------------------------------

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        status = os.statvfs(self.backing)
        return {field: getattr(status, field) for field in
                ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                 "f_favail", "f_flag", "f_namemax")}

    def init(self, path: str) -> None:
        if self._on_mount is not None:
            self._on_mount()

    def summary(self) -> str:
        return self.tally.text()


def load_fuse() -> ModuleType:
    """mfusepy, imported now (it loads libfuse), or a UsageError (one line, the hint in it).
    libfuse 3 unless FUSE_LIBRARY_NAME or _PATH say otherwise: left to itself mfusepy
    takes libfuse 2 where both are installed."""
    import importlib
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    try:
        return importlib.import_module("mfusepy")
    except ImportError as error:
        raise _usage(f"emulate-mds needs mfusepy, which is not installed ({error}): "
                     f"{FUSE_HINT}") from None
    except OSError as error:     # mfusepy found, libfuse 3 not: "Unable to find libfuse"
        raise _usage(f"emulate-mds needs the libfuse 3 library ({error}): {FUSE_HINT}") from None


def _usage(message: str, hint: str = "") -> Exception:
    from stampede.errors import UsageError
    return UsageError(message, hint=hint)


def check_arguments(args: argparse.Namespace) -> tuple[str, str]:
    """Every refusal before anything is mounted: (backing, mountpoint), both absolute."""
    for name in ("service_s", "jitter_s", "attr_cache_s"):
        value = getattr(args, name)
        if not value >= 0 or value == float("inf"):
            raise _usage(f"--{name.replace('_', '-')} {value}: must be a finite number >= 0", "")
    if args.threads < 1:
        raise _usage(f"--threads {args.threads}: must be at least 1", "")
    if os.geteuid() != 0:
        raise _usage("emulate-mds mounts a FUSE file system (allow_other) and runs as root only",
                     "sudo stampede emulate-mds ...")
    backing = os.path.realpath(args.backing)
    mountpoint = os.path.realpath(args.mountpoint)
    if not os.path.isdir(backing):
        raise _usage(f"--backing {args.backing}: not a directory", "")
    try:   # a dead FUSE mount answers ENOTCONN: not a missing directory to mkdir
        if not stat.S_ISDIR(os.stat(mountpoint).st_mode):
            raise _usage(f"mountpoint {args.mountpoint}: not a directory", "")
    except FileNotFoundError:
        raise _usage(f"mountpoint {args.mountpoint}: no such directory",
                     f"mkdir {args.mountpoint}") from None
    except OSError as error:
        raise _usage(f"mountpoint {args.mountpoint}: {error.strerror} (a stale mount?)",
                     f"fusermount -u {args.mountpoint}") from None
    try:
        entries = os.listdir(mountpoint)
    except OSError as error:
        raise _usage(f"mountpoint {args.mountpoint}: {error.strerror} (a stale mount?)",
                     f"fusermount -u {args.mountpoint}") from None
    if entries:
        raise _usage(f"mountpoint {args.mountpoint}: not empty ({len(entries)} entries); "
                     "emulate-mds mounts only on an empty directory", "")
    if getattr(args, "log_limit", 1) < 1:
        raise _usage(f"--log-limit {args.log_limit}: must be at least 1", "")
    if os.path.commonpath([backing, mountpoint]) == backing:
        raise _usage(f"mountpoint {args.mountpoint} is inside --backing {args.backing}: the "
                     "file system would serve itself", "")
    return backing, mountpoint


def sigterm_when_parent_dies() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGTERM) for this process (also usable as a Popen
    preexec_fn, in the child before exec). OSError if the kernel refuses."""
    import ctypes
    import signal
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def die_with_parent(started_by: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (libfuse then unmounts and exits),
    then check that the parent is still `started_by`, the one read when the command began:
    RunFailed (nothing mounted) if it already died. In that order, a parent that dies at
    any time is seen by one of the two."""
    sigterm_when_parent_dies()
    if orphaned(started_by):
        from stampede.errors import RunFailed
        raise RunFailed(f"the process that started emulate-mds exited (its parent is now "
                        f"pid {os.getppid()}, which adopted it); not mounting, as nothing "
                        "would unmount it (start it with setsid to run it detached)")


def orphaned(started_by: int) -> bool:
    """Whether the process that started this one is gone: the parent is no longer
    `started_by`, or `started_by` itself was not the starter but the reaper (init or a
    subreaper) that adopted this process before Python ran its first line, as after
    `( stampede emulate-mds ... & )`, whose subshell exits at once.

    The second case is told by sessions: a child starts in its parent's session and leaves
    it only through setsid(2), which makes it the leader of a new one. A parent in another
    session, of a process that leads none, cannot be the one that started it. A session
    leader (started by setsid or a supervisor) is taken as meant to run on its own. A
    reaper in this process's own session (a container whose init leads the session that
    ran the subshell) cannot be told from a parent that started it: then the emulator
    runs, and stops with that reaper, through the parent-death signal.
    """
    parent = os.getppid()
    if parent != started_by:
        return True
    session = os.getsid(0)
    if session == os.getpid():
        return False
    try:
        return os.getsid(parent) != session
    except OSError:                  # the parent is already gone
        return True
