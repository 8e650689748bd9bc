"""One writer per target, on every backend: every command that touches a target holds its
lock for as long as it runs, so that a clean cannot remove a version from under a save or
a restore, two saves cannot journal over each other, and whoever comes second is refused
at once (exit 2), told who holds the target:

    target.path = '/ck' is in use by stampede save, pid 4242 on host node7 since
    2026-12-03T09:40:01+0000

By construction: a command's registration declares how it uses the target
(`commands.flags.add_job_arguments(access=...)`: write, read or none) and the one place a
job command gets its ranks (`commands.flags.job_world`) takes the lock as declared; the CLI
lets it go when the command ends (cli.main, release_held), and tests/checkpoint/test_lock.py
runs every registered command that takes a job file against a held target.

    write   prepare, save, cycle, rejoin (and --clean), clean: exclusive
    read    run: shared with other runs, exclusive of every writer. A restore must not
            have its files removed under it (clean during a run once failed the run
            half-way), and two restores of one target at once may both measure (each
            then measures a shared storage, as it would on a cluster); so a reader
            excludes writers only.
    none    plan (no I/O), loaders (existing checkpoints only: stampede writes no lock
            file into a checkpoint it did not make, nor for `run --checkpoint`), and the
            commands that launch others (sweep, assess, slurm): those lock for themselves

How each backend holds it (the backend contract, stampede.backends.base):

- POSIX (`capabilities.local_files`): TARGET/stampede-lock, flock(2)ed (LOCK_EX by a
  writer, LOCK_SH by a reader); it names the last holder. The kernel releases an flock
  when its holder exits, SIGKILL included: no stale lock. The file stays (unlinking it
  while others may hold it open would let two writers lock two files); clean removes it
  last. On a kernel NFS mount Linux turns flock into a lock the server arbitrates; on
  Lustre it needs `-o flock`; where the file system refuses locks (ENOLCK, EOPNOTSUPP,
  ENOSYS) the command goes on and says the target is not locked.
- Exclusive create (`capabilities.exclusive_create`: nfs:// through libnfs, whose ranks
  have no kernel flock; s3:// through stampede's client): a writer creates
  TARGET/stampede-lock only if none is there (NFS CREATE GUARDED/EXCLUSIVE; S3 `PUT` with
  `If-None-Match: *`), holding its record (command, pid, host, since, the process's start
  time), and removes it when done; a reader creates its own TARGET/stampede-readers/NAME
  the same way, then looks for a writer's lock; a writer, holding its lock, looks for
  readers (each side creates first and looks second, so of two at once at least one sees
  the other). A lock whose holder is gone (the same host, and no process of that pid and
  start time) is stale: said, removed, and taken over. One from another host cannot be
  judged from here: refused, and the hint names the file to remove once that run is gone.
  (Two commands that find one stale lock at the same moment may both take it over: the
  removal is not conditional. It needs a killed command and two new ones in one instant.)
  An S3-compatible server that does not honour If-None-Match (it answers 501) is not
  locked, and the command says so; one that ignores the header silently cannot be told
  apart (SeaweedFS, the suite's server, honours it: 412 on the second create).
- Anything else (fsspec's stores): not locked, and the command says so.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from stampede import mpi
from stampede.errors import CheckpointError

if TYPE_CHECKING:
    from stampede.backends.base import Backend, Exclusive

Access = Literal["write", "read", "none"]
LOCK_NAME = "stampede-lock"
READERS_DIR = "stampede-readers"   # a reader's lock each, where there is no flock
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
RECORD_BYTES = 4096


class TargetLock:
    """The lock of one target, taken by take() on one process (rank 0) and held until
    release(). `created_root`: take() made the target directory (POSIX), which the writer
    then records so that clean removes it."""

    def __init__(self, target: str, command: str, access: Access = "write",
                 backend: Backend | None = None) -> None:
        self.target, self.command, self.access = target, command, access
        self.backend = backend
        self.created_root = False
        self.created_file = False
        self.note = ""             # said when the target is not locked, or a lock taken over
        self.held = False
        self._descriptor: int | None = None
        self._lease = ""           # the file or object held where there is no flock
        self._record = _record(command)

    @property
    def path(self) -> Path:
        return Path(self.target) / LOCK_NAME

    def take(self) -> None:
        """Hold the target (POSIX: make its directory if it is not there, for a writer);
        a CheckpointError naming the holder when another command holds it."""
        backend = self.backend
        if backend is None or backend.capabilities.local_files:
            self._flock()
            return
        from stampede.backends.base import exclusive

        store = exclusive(backend)
        if store is None:
            self.note = (f"target.path = {self.target!r}: not locked: the {backend.name} "
                         "backend has no exclusive create, so one writer at a time is not "
                         "enforced here")
            return
        self._create(store)

    # --- POSIX: flock ------------------------------------------------------------------

    def _flock(self) -> None:
        root = Path(self.target)
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            return   # the command's own checks refuse it, in their words
        if self.access == "read" and not root.is_dir():
            return   # nothing to read: the reader says so in its words
        self.created_root = not root.exists()
        self.created_file = not self.path.exists()
        try:
            root.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            self._undo_root()
            if self.access == "read":   # a read-only checkpoint: a reader goes on unlocked
                self.note = (f"target.path = {self.target!r}: not locked: cannot create its "
                             f"lock ({error.strerror or error})")
                return
            raise CheckpointError(f"target.path = {self.target!r}: cannot create it or its "
                                  f"lock ({error.strerror or error})") from None
        how = fcntl.LOCK_SH if self.access == "read" else fcntl.LOCK_EX
        try:
            fcntl.flock(descriptor, how | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in UNSUPPORTED:
                self.note = (f"target.path = {self.target!r}: not locked: the file system "
                             f"does not lock ({error.strerror}), so one writer at a time is "
                             "not enforced here")
                self._descriptor = descriptor
                return
            found = _parsed(_pread(descriptor))
            os.close(descriptor)
            self._undo_created()
            raise in_use(self.target, found, str(self.path), flock=True) from None
        self._descriptor, self.held = descriptor, True
        with suppress(OSError):            # naming the holder is a courtesy: a full disk
            os.ftruncate(descriptor, 0)    # must not stop the command that holds the lock
            os.pwrite(descriptor, json.dumps(self._record).encode() + b"\n", 0)

    # --- elsewhere: an exclusively created file or object --------------------------------

    def _create(self, store: Exclusive) -> None:
        from stampede.backends.base import missing_root

        mine = json.dumps(self._record).encode() + b"\n"
        # creating the lock makes a server's directory (NFS): the writer records it as its
        self.created_root = self.access == "write" and missing_root(store)   # own (clean)
        if self.access == "read":
            name = f"{READERS_DIR}/{self._record['host']}-{self._record['pid']}-" \
                   f"{self._record['nonce']}"
            self._claim(store, name, mine)
            try:
                self._refuse_if_held(store, LOCK_NAME)
            except CheckpointError:
                self.release()
                raise
            return
        self._claim(store, LOCK_NAME, mine)
        try:
            for name in store.names(READERS_DIR):
                self._refuse_if_held(store, name)
        except CheckpointError:
            self.release()
            raise

    def _claim(self, store: Exclusive, name: str, mine: bytes) -> None:
        """Create `name` holding our record; a stale one in the way is said and taken over
        (once); a live one refused."""
        for attempt in range(2):
            try:
                store.create_new(name, mine)
            except FileExistsError:
                found = store.get_bytes(name)
                if found is None:
                    continue            # let go between our create and our read: again
                record = _parsed(found)
                if record.get("nonce") == self._record["nonce"]:
                    break               # ours: a retried create whose first one landed
                if attempt == 0 and stale(record):
                    self._took_over(record)
                    store.remove(name)
                    continue
                raise in_use(self.target, record, f"{self.target.rstrip('/')}/{name}") from None
            except OSError as error:
                if error.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    self.note = (f"target.path = {self.target!r}: not locked: {error.strerror}"
                                 ", so one writer at a time is not enforced here")
                    return
                raise CheckpointError(f"target.path = {self.target!r}: cannot create its "
                                      f"lock {name} ({error.strerror or error})") from None
            break
        self._lease, self.held = name, True

    def _refuse_if_held(self, store: Exclusive, name: str) -> None:
        """The other side's lock `name`, if any: stale, removed (said); live, refused."""
        found = store.get_bytes(name)
        if found is None:
            return
        record = _parsed(found)
        if stale(record):
            self._took_over(record)
            with suppress(OSError):
                store.remove(name)
            return
        raise in_use(self.target, record, f"{self.target.rstrip('/')}/{name}")

    def _took_over(self, record: dict[str, object]) -> None:
        self.note = (f"target.path = {self.target!r}: the lock left by {describe(record)}, "
                     "which is gone (a run that did not finish), taken over")

    # --- letting go ----------------------------------------------------------------------

    def release(self) -> None:
        """Let go (a POSIX lock file stays for the next one; clean removes it)."""
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
        if self._lease and self.backend is not None:
            with suppress(OSError):
                self.backend.remove(self._lease)
            if self._lease.startswith(READERS_DIR + "/") and \
                    self.backend.capabilities.has_directories:
                with suppress(OSError):   # the last reader out takes the directory
                    self.backend.rmdir(self.backend.path(READERS_DIR))
            self._lease = ""
        self.held = False

    def abandon(self) -> None:
        """The command was refused before it wrote anything: let go, and take back what
        take() made (the lock file, the directory)."""
        self.release()
        self._undo_created()

    def tidy(self) -> None:
        """The command is done: let go, and where it made the lock file and nothing else
        stayed beside it (a rejoin removes all it wrote), take it back with the directory
        it made."""
        self.release()
        root = Path(self.target)
        if self.backend is not None:
            self._undo_root()      # its lock gone with release(): removed if empty
        elif self.created_file and root.is_dir() and \
                [path.name for path in root.iterdir()] == [LOCK_NAME]:
            self._undo_created()

    def _undo_created(self) -> None:
        if self.created_file:
            self.path.unlink(missing_ok=True)
            self.created_file = False
        self._undo_root()

    def _undo_root(self) -> None:
        """The directory take() made, removed if it is empty (a server's too)."""
        if not self.created_root:
            return
        with suppress(OSError):
            if self.backend is not None and self.backend.capabilities.has_directories:
                self.backend.rmdir(self.backend.path(""))
            elif self.backend is None:
                Path(self.target).rmdir()
            self.created_root = False


def _host() -> str:
    # os.uname, not socket.gethostname: the same name, without importing socket on every
    # worker rank (stampede startup times what a worker of run imports)
    return os.uname().nodename


def _record(command: str) -> dict[str, object]:
    pid = os.getpid()
    return {"command": command, "pid": pid, "host": _host(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "started": process_start(pid),
            "nonce": os.urandom(6).hex()}


def process_start(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (/proc/PID/stat's 22nd field):
    with the pid, it names one process even after the pid is reused. None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(text.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def stale(record: dict[str, object]) -> bool:
    """The holder is gone: it ran on this host, and no process of its pid (and start time)
    runs here now. A holder on another host is never judged stale from here."""
    if record.get("host") != _host() or not isinstance(record.get("pid"), int):
        return False
    pid = record["pid"]
    assert isinstance(pid, int)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass                       # alive, someone else's
    started = record.get("started")
    return isinstance(started, int) and process_start(pid) not in (None, started)


def describe(record: dict[str, object]) -> str:
    """"stampede save, pid 4242 on host node7 since 2026-12-03T09:40:01+0000"."""
    if not {"command", "pid", "host", "since"} <= set(record):
        return "another stampede process (its lock does not say which)"
    return (f"{record['command']}, pid {record['pid']} on host {record['host']} since "
            f"{record['since']}")


def in_use(target: str, record: dict[str, object], lock_path: str,
           flock: bool = False) -> CheckpointError:
    """The refusal of a target another command holds: who holds it, and what to do."""
    hint = "wait for it to finish, or give another target.path"
    if not flock and record.get("host") not in (None, _host()):
        hint += (f"; if it no longer runs on {record['host']} (its node is gone), remove "
                 f"{lock_path} by hand")
    return CheckpointError(f"target.path = {target!r} is in use by {describe(record)}",
                           hint=hint)


def _pread(descriptor: int) -> bytes:
    try:
        return os.pread(descriptor, RECORD_BYTES, 0)
    except OSError:
        return b""


def _parsed(data: bytes) -> dict[str, object]:
    try:
        record = json.loads(data or b"{}")
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


# --- the lock a command holds (taken by commands.flags.job_world, let go by cli.main) -----

_HELD: list[TargetLock] = []


def hold(comm: mpi.Comm | None, target: str, storage_options: dict[str, object],
         command: str, access: Access) -> TargetLock:
    """Collectively (every rank of `comm`; None: this process alone), the command's lock
    on `target` taken by rank 0 for the rest of the command: a refusal is every rank's
    CheckpointError (exit 2). What the lock says (not locked, a stale lock taken over) is
    said on stderr by rank 0."""
    lock = TargetLock(target, command, access)
    root = comm is None or comm.Get_rank() == 0

    def take() -> None:
        from stampede.backends import open_backend

        backend = open_backend(target, storage_options)
        lock.backend = None if backend.capabilities.local_files else backend
        lock.take()

    if comm is None:
        take()
    else:
        mpi.collective(comm, "locking the target", take if root else (lambda: None),
                       alone=True)
    _HELD.append(lock)
    if root and lock.note:
        print(f"stampede: {lock.note}", file=sys.stderr, flush=True)
    return lock


def holding(target: str) -> TargetLock | None:
    """The lock this process holds on `target`, if any (the writer asks: what take()
    made, and clean: to let go before it removes the lock file)."""
    for lock in _HELD:
        if lock.target == target and lock.held:
            return lock
    return None


def writer_lock(target: str) -> TargetLock:
    """The lock this process holds on `target` (commands.flags.job_world took it), or an
    untaken one where it holds none (a caller of prepare or save_job from Python, which
    locks nothing): what a writer asks of it (created_root, abandon) is then a no-op."""
    return holding(target) or TargetLock(target, "", "write")


def release_held(refused: bool) -> None:
    """Every lock this process holds, let go (cli.main, when the command ends); `refused`
    (the command ended on a StampedeError): what the lock made is taken back where the
    writer left nothing in it."""
    while _HELD:
        lock = _HELD.pop()
        if refused:
            lock.abandon()
        else:
            lock.tidy()
