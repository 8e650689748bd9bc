"""One writer per target: `prepare`, `save` (and `cycle`'s save) and `clean` hold the
target's lock for as long as they write into it, so that a clean cannot remove a version
from under a save, two saves cannot journal over each other, and whoever comes second is
refused at once (exit 2), told who holds the target.

    TARGET/stampede-lock    flock(2)ed by the writer; it names the holder (host, pid,
                            command, since when) for the one refused

The kernel releases an flock when its holder exits, SIGKILL included: there is no stale
lock to clear by hand. The file itself stays (unlinking it while others may hold it open
would let two writers lock two different files); `clean` removes it last, with the
directory. On NFS, Linux turns flock into a lock the server arbitrates (every client
sees it); on Lustre it needs the clients' `-o flock` mount option, and where the file
system refuses locks (ENOLCK, EOPNOTSUPP, ENOSYS) the writer goes on and says that the
target is not locked. Object stores (s3://) are not locked: their journal is one object,
and stampede has no lease on it yet. `run` only reads and takes no lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from stampede import mpi
from stampede.errors import CheckpointError

LOCK_NAME = "stampede-lock"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class TargetLock:
    """The lock of one POSIX target, taken by take() on rank 0 and held until release()
    (every other rank holds nothing). `created_root`: take() made the target directory,
    which the writer then records so that clean removes it."""

    def __init__(self, target: str, command: str) -> None:
        self.target, self.command = target, command
        self.created_root = False
        self.created_file = False
        self.note = ""             # said when the file system would not lock
        self._descriptor: int | None = None

    @property
    def path(self) -> Path:
        return Path(self.target) / LOCK_NAME

    def take(self) -> None:
        """Make the target directory if it is not there, lock it, name the holder; a
        CheckpointError naming the holder when another process writes into it."""
        root = Path(self.target)
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            return   # the writer's own checks refuse it, in their words
        self.created_root = not root.exists()
        self.created_file = not self.path.exists()
        try:
            root.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            self._undo_root()
            raise CheckpointError(f"target.path = {self.target!r}: cannot create it or its "
                                  f"lock ({error.strerror or error})") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in UNSUPPORTED:
                self.note = (f"target.path = {self.target!r}: the file system does not lock "
                             f"({error.strerror}): one writer at a time is not enforced here")
                self._descriptor = descriptor
                return
            holder = _holder(descriptor)
            os.close(descriptor)
            raise CheckpointError(f"target.path = {self.target!r} is in use: {holder}",
                                  hint="wait for it to finish, or give another target.path") \
                from None
        self._descriptor = descriptor
        record = {"host": socket.gethostname(), "pid": os.getpid(), "command": self.command,
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with suppress(OSError):            # naming the holder is a courtesy: a full disk
            os.ftruncate(descriptor, 0)    # must not stop the writer that holds the lock
            os.pwrite(descriptor, json.dumps(record).encode() + b"\n", 0)

    def release(self) -> None:
        """Let go (the file stays for the next writer; clean removes it)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def abandon(self) -> None:
        """The writer was refused before it wrote anything: let go, and take back what
        take() made (the lock file, the directory)."""
        self.release()
        if self.created_file:
            self.path.unlink(missing_ok=True)
        self._undo_root()

    def _undo_root(self) -> None:
        if self.created_root:
            with suppress(OSError):
                Path(self.target).rmdir()


def _holder(descriptor: int) -> str:
    """Who holds a lock, from what its file says."""
    try:
        record = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
        return (f"{record['command']} by pid {record['pid']} on {record['host']}, since "
                f"{record['since']}")
    except (OSError, ValueError, KeyError, TypeError):
        return "another stampede process holds its lock (it did not say which)"


@contextmanager
def held(comm: mpi.Comm, target: str, command: str, local: bool) -> Iterator[TargetLock]:
    """Collectively, around a writer: rank 0 holds `target`'s lock for the block (a
    refusal is every rank's CheckpointError, exit 2); only a POSIX target is locked
    (`local`). The writer calls abandon() on rank 0 when it refuses the target."""
    lock = TargetLock(target, command)
    if local:
        mpi.collective(comm, "locking the target", lock.take if comm.Get_rank() == 0
                       else (lambda: None), alone=True)
    try:
        yield lock
    finally:
        lock.release()

