"""POSIX backend, the baseline: os.stat, os.open, os.preadv into page-aligned buffers.

stat and close are bound straight to the os functions, so a timed stat costs the syscall
plus one Python call, as little as Python allows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

from stampede.sysinfo import mount_of


class PosixBackend:
    name = "posix"

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.stat = os.stat
        self.close = os.close

    def path(self, relpath: str) -> bytes:
        # bytes, encoded once here: os.stat/os.open then skip encoding on every timed call
        return os.fsencode(self.root / relpath)

    def opener(self, direct: bool) -> Callable[[bytes], int]:
        return partial(os.open, flags=os.O_RDONLY | (os.O_DIRECT if direct else 0))

    @staticmethod
    def read_into(handle: int, buffer: memoryview, offset: int) -> int:
        return os.preadv(handle, (buffer,), offset)

    @staticmethod
    def list(path: bytes) -> list[bytes]:
        return os.listdir(path)

    @staticmethod
    def evict(path: bytes | str | os.PathLike[str], offset: int, length: int) -> None:
        # DONTNEED drops clean pages only; prepare fsyncs, so checkpoint pages are clean.
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def fs_type(self) -> str:
        return mount_of(self.root).fs_type
