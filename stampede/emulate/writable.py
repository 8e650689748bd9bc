"""The writable metadata server (`emulate-mds --writable`): what a save asks of a file
system, each metadata request held in a slot of its own service time, as the read side's
are (stampede.emulate.mds).

    create    a new file (the kernel sends it for a name its LOOKUP found missing)  --create-s
    mkdir     a new directory                                                      --mkdir-s
    rename    an entry moved or renamed                                            --rename-s
    unlink    a file removed                                                       --unlink-s
    rmdir     a directory removed                                                  --rmdir-s
    fsync     fsync(2) of a file; fsyncdir of a directory, the same time           --fsync-s
    setattr   truncate, chmod, chown, utimens                                      --service-s

Each of those flags defaults to --service-s. Writes (and flush, the close's handshake)
pass straight through, as reads do: bytes are the data path, not the metadata server's.
Each request does the real operation on DIR inside its slot, fsync too: where that takes
longer than the service time (an fsync of a disk-backed DIR: 7 ms held for 5 ms asked on
this VM), the slot is held as long as it takes, and the summary's held time shows it; a
DIR on tmpfs makes the real part free.

The directory's lock (--serialize-dir). create, mkdir, rename, unlink and rmdir change a
directory's entries; with --serialize-dir they queue one at a time, in arrival order, on
a lock per parent directory (rename: both parents, in path order, so that no two renames
wait for each other in a circle) before they take a slot. N ranks creating a file each in
one directory then take N service times; spread over F directories, N / F (with C >= F
slots): the create storm of the `sharded` layout against `fan-out`. Servers hold such a
lock: a local file system's VFS takes the parent directory's lock exclusively for each of
these (knfsd serves NFS through it); Lustre's MDS shares it for creates of distinct names
(parallel directory operations), which --serialize-dir off stands for. --serialize-inode
also queues fsync and setattr of one file.

Through one mount the kernel is the directory's lock already: its VFS holds the parent's
lock exclusively across a create, mkdir, rename, unlink or rmdir request, FUSE's round
trip included, so such requests in one directory reach the emulator one at a time
whatever the flag (4 threads creating a file each at once, --create-s 0.05: 214 ms in
one directory without --serialize-dir, 217 ms with; 55 and 56 ms in four directories).
That is what ranks on one node meet on any file system; --serialize-dir is the server's
lock, which clients on many nodes meet, and decides only where requests can arrive
together (the server in-process, tests/emulate/test_writable.py). The summary shows per
op how many were in service at once: 1 for one directory's creates, 4 over four.

Who may: the kernel checks no permissions (see mds), so the server does, by mode bits: a
caller needs write and search permission on each parent directory an entry op changes,
write permission to open a file for writing or truncate it, and must own a file to chmod,
chown (root only) or set its times; sticky directories and ACLs are not known to it.
New files and directories belong to the caller (its uid and primary gid), with the mode
it asked for (the kernel has applied the caller's umask).
"""

from __future__ import annotations

import argparse
import errno
import os
from collections.abc import Callable, Mapping
from typing import Any

from stampede.emulate.mds import METADATA_OPS, READ, SEARCH, WRITE, FifoLock, MetadataServer, Result
from stampede.emulate.service import ServiceLog
from stampede.units import BYTES_PER_KIB

ENTRY_OPS = ("create", "mkdir", "rename", "unlink", "rmdir")   # change a directory's entries
WRITE_OPS = (*ENTRY_OPS, "fsync", "fsyncdir", "setattr")
TIMED_FLAGS = {"create": "create", "mkdir": "mkdir", "rename": "rename", "unlink": "unlink",
               "rmdir": "rmdir", "fsync": "fsync", "fsyncdir": "fsync"}   # op -> its --OP-s flag
WRITE_FLAGS = tuple(dict.fromkeys(TIMED_FLAGS.values()))
MODE_BITS = 0o7777
# The most a FUSE write request carries: libfuse 2's, kept (libfuse 3 would take 1 MiB) so
# that a save through the emulator makes the requests it always made
MAX_WRITE_BYTES = 128 * BYTES_PER_KIB


def write_times(args: argparse.Namespace) -> dict[str, float]:
    """Each --OP-s flag's service time (WRITE_FLAGS), --service-s where not given."""
    return {flag: args.service_s if getattr(args, f"{flag}_s") is None else getattr(args, f"{flag}_s")
            for flag in WRITE_FLAGS}


def check_write_flags(args: argparse.Namespace) -> None:
    """Before anything is mounted: the write side's flags, each a finite number >= 0, and
    none without --writable (a read-only mount would never serve them)."""
    from stampede.errors import UsageError
    given = [f"--{flag}-s" for flag in WRITE_FLAGS if getattr(args, f"{flag}_s") is not None]
    given += ["--serialize-dir"] if args.serialize_dir else []
    if given and not args.writable:
        raise UsageError(f"{given[0]}: only with --writable (a read-only mount serves no create, "
                         "mkdir, rename, unlink, rmdir or fsync)")
    for flag in WRITE_FLAGS:
        value = getattr(args, f"{flag}_s")
        if value is not None and not (0 <= value < float("inf")):
            raise UsageError(f"--{flag}-s {value}: must be a finite number >= 0")


class WritableServer(MetadataServer):
    """MetadataServer plus the save's requests; `op_s` maps an op of WRITE_OPS to its
    service time (the others take service_s)."""

    OPS = (*METADATA_OPS, *WRITE_OPS)

    def __init__(self, backing: str, service_s: float, threads: int, serialize: bool = False,
                 jitter_s: float = 0.0, caller: Callable[[], tuple[int, int, int]] | None = None,
                 on_mount: Callable[[], None] | None = None, *,
                 op_s: Mapping[str, float] | None = None, serialize_dir: bool = False,
                 log: ServiceLog | None = None) -> None:
        super().__init__(backing, service_s, threads, serialize, jitter_s, caller, on_mount,
                         log=log)
        self.op_s = {op: (op_s or {}).get(op, service_s) for op in WRITE_OPS}
        self.serialize_dir = serialize_dir
        self._dir_locks: dict[str, FifoLock] = {}

    def init_with_config(self, conn: Any, config: object) -> None:
        """At mount (mfusepy calls it instead of init): writes capped at MAX_WRITE_BYTES a
        request, then the mount announced."""
        conn.max_write = MAX_WRITE_BYTES
        self.init("/")

    # --- how a request is served ---------------------------------------------------------

    def _entry(self, op: str, paths: tuple[str, ...], work: Callable[[], Result]) -> Result:
        """An entry op on `paths`: its parents' locks (--serialize-dir), in path order."""
        parents = sorted({os.path.dirname(path.rstrip("/")) or "/" for path in paths})
        locks = [self._lock(self._dir_locks, "dir", parent) for parent in parents] \
            if self.serialize_dir else []
        return self._held(op, paths, self.op_s[op], locks, work)

    def _on_file(self, op: str, path: str, work: Callable[[], Result]) -> Result:
        """fsync or setattr of a file: queued on the file's lock with --serialize-inode."""
        locks = [self._lock(self._path_locks, "file", path)] if self.serialize else []
        return self._held(op, (path,), self.op_s[op], locks, work)

    def _check_parents(self, *paths: str) -> None:
        """Write and search permission on each path's parent directory."""
        for path in paths:
            parent = os.path.dirname(self._real(path).rstrip("/"))
            self._check(os.stat(parent), WRITE | SEARCH)

    def _give(self, real: str, mode: int) -> None:
        """A new entry: the mode asked, the caller's ownership."""
        uid, gid, _ = self._caller()
        os.lchown(real, uid, gid)           # first: a chown clears set-id bits
        os.chmod(real, mode & MODE_BITS)

    # --- entry ops: the directory's lock -------------------------------------------------

    def create(self, path: str, mode: int, fi: object = None) -> int:
        real = self._real(path)

        def create_file() -> int:
            self._check_parents(path)
            descriptor = os.open(real, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                self._give(real, mode)
            except OSError:
                os.close(descriptor)
                os.unlink(real)
                raise
            return descriptor

        return self._entry("create", (path,), create_file)

    def mkdir(self, path: str, mode: int) -> None:
        real = self._real(path)

        def make_directory() -> None:
            self._check_parents(path)
            os.mkdir(real, 0o700)
            self._give(real, mode)

        return self._entry("mkdir", (path,), make_directory)

    def rename(self, old: str, new: str) -> None:
        def move() -> None:
            self._check_parents(old, new)
            os.rename(self._real(old), self._real(new))

        return self._entry("rename", (old, new), move)

    def unlink(self, path: str) -> None:
        def remove() -> None:
            self._check_parents(path)
            os.unlink(self._real(path))

        return self._entry("unlink", (path,), remove)

    def rmdir(self, path: str) -> None:
        def remove() -> None:
            self._check_parents(path)
            os.rmdir(self._real(path))

        return self._entry("rmdir", (path,), remove)

    # --- durability ----------------------------------------------------------------------

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        return self._on_file("fsync", path,
                             lambda: os.fdatasync(fh) if datasync else os.fsync(fh))

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        def sync_directory() -> None:
            descriptor = os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)

        return self._held("fsyncdir", (path,), self.op_s["fsyncdir"], [], sync_directory)

    # --- opening for writing, attributes -------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        access = flags & os.O_ACCMODE
        if access == os.O_RDONLY:
            return super().open(path, flags)
        want = WRITE | (READ if access == os.O_RDWR else 0)

        def open_file() -> int:
            # O_CREAT never comes here (create does); O_TRUNC does: libfuse 3 asks for
            # atomic truncation on open (libfuse 2's kernel sent a setattr after it)
            descriptor = os.open(self._real(path),
                                 access | (flags & os.O_TRUNC) | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                self._check(os.fstat(descriptor), want)
            except OSError:
                os.close(descriptor)
                raise
            return descriptor

        return self._serve("open", path, False, open_file)

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        def cut() -> None:
            if fh is not None:
                os.ftruncate(fh, length)
                return
            self._check(os.lstat(self._real(path)), WRITE)
            os.truncate(self._real(path), length)

        return self._on_file("setattr", path, cut)

    def _owner_only(self, path: str, change: Callable[[str], None]) -> None:
        def work() -> None:
            real = self._real(path)
            uid, _, _ = self._caller()
            if uid not in (0, os.lstat(real).st_uid):
                raise OSError(errno.EPERM, os.strerror(errno.EPERM))
            change(real)

        return self._on_file("setattr", path, work)

    def chmod(self, path: str, mode: int) -> None:
        return self._owner_only(path, lambda real: os.chmod(real, mode & MODE_BITS))

    def chown(self, path: str, uid: int, gid: int) -> None:
        if self._caller()[0] != 0:      # giving a file away, or to a group: root's alone here
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        return self._owner_only(path, lambda real: os.lchown(real, uid, gid))

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        return self._owner_only(path, lambda real: os.utime(real, ns=times, follow_symlinks=False)
                                if times is not None else os.utime(real, follow_symlinks=False))

    # --- data: straight through ----------------------------------------------------------

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def flush(self, path: str, fh: int) -> int:
        return 0
