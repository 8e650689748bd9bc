"""The untimed file calls of a backend that is one user-space client per rank
(stampede.backends.nfs through libnfs, stampede.backends.cephfs through libcephfs),
written once on the calls both clients have: directories made a component at a time,
small files read whole and replaced atomically (a temporary file beside it, made durable,
renamed over it), a file or an empty directory removed, the target's lock created only
where none is. Each backend keeps what differs: how it stats, creates and writes."""

from __future__ import annotations

import errno
import os
from contextlib import AbstractContextManager, suppress
from typing import Protocol

from stampede.backends.base import Writer

FILE_MODE = 0o640
DIR_MODE = 0o750


class Calls(Protocol):
    """What both user-space clients do (handles are ints; paths bytes from the mount's root)."""

    def fstat_size(self, handle: int, /) -> int: ...
    def open(self, path: bytes, flags: int, /) -> int: ...
    def close(self, handle: int, /) -> None: ...
    def fsync(self, handle: int, /) -> None: ...
    def mkdir(self, path: bytes, mode: int, /) -> None: ...
    def rmdir(self, path: bytes, /) -> None: ...
    def unlink(self, path: bytes, /) -> None: ...
    def rename(self, source: bytes, destination: bytes, /) -> None: ...
    def listdir(self, path: bytes, /) -> list[bytes]: ...


class ClientFiles:
    """The backend's untimed calls on its client (`client`), below its `root`."""

    client: Calls
    root: str

    # --- what the backend says -----------------------------------------------------------

    def path(self, relpath: str) -> bytes:
        raise NotImplementedError

    def read_into(self, handle: int, buffer: memoryview, offset: int) -> int:
        raise NotImplementedError

    def write_from(self, handle: int, view: memoryview, offset: int) -> int:
        raise NotImplementedError

    def open_writer(self, path: bytes) -> AbstractContextManager[Writer]:
        """A writer of one file (created if missing, never truncated), durable at its end."""
        raise NotImplementedError

    def create_exclusive(self, path: bytes) -> int:
        """A handle on a file created only where none is (FileExistsError otherwise)."""
        raise NotImplementedError

    def is_directory(self, path: bytes) -> bool:
        raise NotImplementedError

    # --- written once ----------------------------------------------------------------------

    def ensure_root(self) -> None:
        self.makedirs(self.root)

    def makedirs(self, directory: str) -> None:
        parts = [part for part in directory.split("/") if part]
        for depth in range(1, len(parts) + 1):
            with suppress(FileExistsError):
                self.client.mkdir(os.fsencode("/" + "/".join(parts[:depth])), DIR_MODE)

    def handle_size(self, handle: int) -> int:
        return self.client.fstat_size(handle)

    def get_bytes(self, relpath: str) -> bytes | None:
        try:
            handle = self.client.open(self.path(relpath), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = self.client.fstat_size(handle)
            data = bytearray(size)
            got = self.read_into(handle, memoryview(data), 0) if size else 0
        finally:
            self.client.close(handle)
        return bytes(data[:got])

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """Atomic: a temporary file beside it, made durable, renamed over it."""
        self._make_parent(relpath)
        directory, _, base = relpath.rpartition("/")
        temporary = f"{directory}/.{base}.tmp-{os.getpid()}" if directory else \
            f".{base}.tmp-{os.getpid()}"
        with suppress(FileNotFoundError):
            self.client.unlink(self.path(temporary))
        with self.writer(temporary) as writer:
            writer.write_at(0, memoryview(bytearray(data)))
        self.client.rename(self.path(temporary), self.path(relpath))

    def remove(self, relpath: str) -> None:
        path = self.path(relpath)
        try:
            self.client.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            if error.errno not in (errno.EISDIR, errno.EPERM, errno.EACCES):
                raise
            self.client.rmdir(path)

    def names(self, relpath: str = "") -> list[str]:
        """Every file below `relpath`, relative to the root, sorted (directories walked)."""
        found: list[str] = []
        pending = [relpath.strip("/")]
        while pending:
            directory = pending.pop()
            try:
                entries = self.client.listdir(self.path(directory))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for raw in entries:
                child = f"{directory}/{os.fsdecode(raw)}" if directory else os.fsdecode(raw)
                (pending if self.is_directory(self.path(child)) else found).append(child)
        return sorted(found)

    def writer(self, relpath: str) -> AbstractContextManager[Writer]:
        self._make_parent(relpath)
        return self.open_writer(self.path(relpath))

    def local_path(self, relpath: str) -> str | None:
        return None

    # --- untimed: the target's lock (stampede.checkpoint.lock) ----------------------------

    def create_new(self, relpath: str, data: bytes) -> None:
        """The file created only where none is (the server refuses a second, whatever
        client made the first), then the record written and made durable; where that
        fails (a full cluster), the file this call made is removed again: an empty lock
        left behind would hold the target for no one."""
        self._make_parent(relpath)
        path = self.path(relpath)
        handle = self.create_exclusive(path)
        try:
            try:
                if data:
                    self.write_from(handle, memoryview(bytearray(data)), 0)
                self.client.fsync(handle)
            finally:
                self.client.close(handle)
        except OSError:
            with suppress(OSError):
                self.client.unlink(path)
            raise

    def _make_parent(self, relpath: str) -> None:
        directory = relpath.rpartition("/")[0]
        self.makedirs(f"{self.root}/{directory}" if directory else self.root)
