"""Deterministic checkpoint bytes.

Every block is a seeded pseudo-random pattern (so compression and deduplication in the
storage cannot flatter a result) whose first 16 bytes stamp the file and the offset (so
no two blocks are equal and a misplaced read changes the hash). The bytes at an offset are
a pure function of (file, offset), whoever writes them.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

CONTENT_SEED = 20260901
_STAMP = struct.Struct("<QQ")


class ContentSource:
    def __init__(self, block_bytes: int, seed: int = CONTENT_SEED) -> None:
        pattern = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)
        self._pattern = memoryview(pattern.tobytes())

    def fill(self, view: memoryview, relpath: str, offset: int) -> None:
        """Write the content of `relpath` at `offset` into `view` (one block or less)."""
        length = len(view)
        view[:] = self._pattern[:length]
        stamp = _STAMP.pack(zlib.crc32(relpath.encode()), offset)
        view[: min(length, _STAMP.size)] = stamp[:length]
