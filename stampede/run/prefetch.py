"""checkpoint.prefetch: the large-read prefetch of the loaders that halved a cold load.

Before each block a rank reads, the kernel is asked (posix_fadvise POSIX_FADV_WILLNEED) for
the bytes of the same extent up to `window_bytes` past the block's start that it has not
been asked for yet, so the disk works ahead of the reads: the window moves with the reads,
never past the extent's end (the rank's other bytes, and other ranks' bytes, are not its
to fetch), each byte asked for once per iteration. Inside the timed restore, as a loader's
own prefetch is. Only a handle that is a POSIX file descriptor is advised (the target's
rules refuse the option elsewhere).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Prefetch:
    """One rank's prefetch over one iteration's reads; `advised` keeps every request
    (file, offset, bytes) in the order made, for the sidecar's count and the tests."""

    window_bytes: int
    advised: list[tuple[str, int, int]] = field(default_factory=list)
    _asked_until: dict[tuple[str, int], int] = field(default_factory=dict)

    def ahead(self, relpath: str, handle: object, extent_start: int, extent_end: int,
              offset: int) -> None:
        """Before reading at file `offset` within the extent [extent_start, extent_end) of
        `relpath`: ask for what of [offset, offset + window) the extent holds and was not
        asked for yet."""
        if self.window_bytes <= 0 or not isinstance(handle, int):
            return
        key = (relpath, extent_start)
        start = max(offset, self._asked_until.get(key, extent_start))
        stop = min(offset + self.window_bytes, extent_end)
        if stop <= start:
            return
        os.posix_fadvise(handle, start, stop - start, os.POSIX_FADV_WILLNEED)
        self._asked_until[key] = stop
        self.advised.append((relpath, start, stop - start))

    def next_iteration(self) -> None:
        """A new iteration asks again (the cold state evicted what the last one fetched)."""
        self._asked_until.clear()
        self.advised.clear()
