"""Deterministic checkpoint bytes.

Every block is a seeded pseudo-random pattern (so compression and deduplication in the
storage cannot flatter a result) whose first 16 bytes stamp the file and the offset (so
no two blocks are equal and a misplaced read changes the hash). The bytes at an offset are
a pure function of (file, offset), whoever writes them.

Bit 6 of every odd byte is cleared, in the pattern and in the stamp, so that read as
little-endian float16, bfloat16 or float32 no element has all its exponent bits set: the
bytes are finite numbers, and `run.check_finite` passes on a good checkpoint.
"""

from __future__ import annotations

import struct
import zlib
from typing import Protocol

import numpy as np

CONTENT_SEED = 20260901
_STAMP = struct.Struct("<QQ")
_FINITE_MASK = 0xBF   # applied to odd bytes: bit 14 of each 16-bit word, bit 30 of each 32


def content_label(relpath: str, tensor: str) -> str:
    """What names a piece of content: the file, and the tensor in a formatted file (whose
    offsets are then relative to the tensor's first byte)."""
    return f"{relpath}:{tensor}" if tensor else relpath


def _finite(data: bytes) -> bytes:
    array = np.frombuffer(data, dtype=np.uint8).copy()
    array[1::2] &= _FINITE_MASK
    return array.tobytes()


class CopiedContent(Protocol):
    """Bytes of another checkpoint that prepare writes instead of synthetic ones (`prepare
    --from`: stampede.existing.relayout): filled by the same calls, and not regenerable,
    so the manifest records where they came from."""

    record: dict[str, object]   # the manifest's `source` entry: path, format, bytes

    def fill(self, view: memoryview, label: str, offset: int) -> None: ...

    def close(self) -> None: ...


class ContentSource:
    def __init__(self, block_bytes: int, seed: int = CONTENT_SEED) -> None:
        self.block_bytes = block_bytes
        pattern = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)
        self._pattern = memoryview(_finite(pattern.tobytes()))

    def fill(self, view: memoryview, label: str, offset: int) -> None:
        """Write the content of `label` (content_label) at `offset` into `view` (one block
        or less, starting on a block boundary of the block size it was made with)."""
        length = len(view)
        view[:] = self._pattern[:length]
        stamp = _finite(_STAMP.pack(zlib.crc32(label.encode()), offset))
        view[: min(length, _STAMP.size)] = stamp[:length]
