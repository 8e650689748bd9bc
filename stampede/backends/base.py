"""The storage contract every backend implements, written once.

Paths given to a backend are relative to its target root. The hot-path methods (`stat`,
`open`, `read_into`, `close`) are called between two clock stamps, so a backend binds
them as directly as it can: every Python frame added here is added to every latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Backend(Protocol):
    name: str

    def path(self, relpath: str) -> Any:
        """The backend's own name for a checkpoint file (resolved once, before timing)."""

    def stat(self, path: Any) -> Any:
        """Fetch the file's metadata (stat(2) / HEAD)."""

    def opener(self, direct: bool) -> Callable[[Any], Any]:
        """A function path -> handle, opened for reading; direct = bypass the page cache.
        Bound once before the timed loop, so each open pays no option handling."""

    def read_into(self, handle: Any, buffer: memoryview, offset: int) -> int:
        """Read len(buffer) bytes at offset into buffer; return the count read."""

    def close(self, handle: Any) -> None:
        """Release the handle."""

    def list(self, path: Any) -> list[Any]:
        """Names in a directory (readdir / LIST of a prefix), in the backend's form."""

    def evict(self, path: Any, offset: int, length: int) -> None:
        """Drop this range's cached pages so the next read reaches storage."""

    def fs_type(self) -> str:
        """File-system type of the target (ext4, nfs4, lustre, tmpfs, ...)."""
