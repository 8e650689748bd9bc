"""How much of a file range is in the page cache: mincore(2) over a read-only mapping.

A "cold" result is only as cold as the eviction made it: the run measures residency
after evicting and before the timed phase, and the report prints it, so a cold number
read from a half-warm cache shows itself. Mapping a file and asking mincore reads no data
and faults no page in.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MAP_FAILED = ctypes.c_void_p(-1).value
PAGE = mmap.PAGESIZE


def resident_bytes(path: bytes | str, offset: int, length: int) -> tuple[int, int]:
    """(resident bytes, bytes asked) of [offset, offset + length) of `path`, counted in whole
    pages; length 0 = to the end of the file. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = size if length == 0 else min(offset + length, size)
        first = offset // PAGE * PAGE
        span = end - first
        if span <= 0:
            return 0, 0
        address = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, first)
        if address in (None, _MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        try:
            pages = (span + PAGE - 1) // PAGE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, span, vector):
                error = ctypes.get_errno()
                raise OSError(error, os.strerror(error))
            resident = int(np.count_nonzero(np.frombuffer(memoryview(vector).cast("B"), dtype=np.uint8) & 1))
        finally:
            _libc.munmap(address, span)
    finally:
        os.close(fd)
    return min(resident * PAGE, end - offset), end - offset
