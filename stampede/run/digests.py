"""The hashes the run package computes over bytes it read or wrote back (run.verify,
save.validate, a rejoin's replicas): sha256 or xxh3, fed in order (Digest)."""

from __future__ import annotations

from typing import Protocol


class Digest(Protocol):
    """A running hash (hashlib's, xxhash's): fed the bytes in order, then asked for its hex."""

    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


def new_digest(algorithm: str) -> Digest:
    """A fresh hash of `algorithm`: xxh3 (128-bit), else sha256."""
    if algorithm == "xxh3":
        import xxhash
        return xxhash.xxh3_128()
    import hashlib
    return hashlib.sha256()
