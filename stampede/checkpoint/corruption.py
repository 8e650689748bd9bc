"""Which bytes of a slice are corrupt: after a failed hash, regenerate what prepare wrote
(stampede.checkpoint.content is a pure function of file, tensor and offset) and compare byte by byte.
Untimed, and only ever run after a mismatch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stampede.checkpoint.content import ContentSource, content_label
from stampede.checkpoint.plan import Extent

Fetch = Callable[[int, int], memoryview]   # (offset in extent coordinates, length) -> bytes


def describe_difference(hold: Extent, extent: Extent, content_block_bytes: int,
                        fetch: Fetch, base: int | None = None) -> str:
    """'N byte(s) differ, first at X, last at Y' (offsets as the extent counts them: in the
    file, or from the tensor's first byte), or why it cannot say."""
    if content_block_bytes <= 0:
        return "(the manifest does not say how the content was written: no byte range)"
    try:
        first, last, count = _differences(hold, extent, content_block_bytes, fetch)
    except OSError as error:
        return f"(re-reading to locate the difference failed: {error})"
    if count == 0:
        return "yet a second read matches: the bytes changed between reads, or in transit"
    unit = f" of tensor {extent.tensor}" if extent.tensor else ""
    in_file = f" (file offsets {base + first}..{base + last})" if extent.tensor and base else ""
    return f"{count} byte(s) differ{unit}, first at offset {first}, last at offset {last}{in_file}"


def _differences(hold: Extent, extent: Extent, block_bytes: int,
                 fetch: Fetch) -> tuple[int, int, int]:
    """prepare wrote the hold extent block by block from its start: walk those blocks."""
    source = ContentSource(block_bytes)
    label = content_label(hold.relpath, hold.tensor)
    expected = memoryview(bytearray(block_bytes))
    first, last, count = -1, -1, 0
    stop = extent.offset + extent.length
    for block_offset, length in hold.blocks(block_bytes):
        low, high = max(block_offset, extent.offset), min(block_offset + length, stop)
        if low >= high:
            continue
        source.fill(expected[:length], label, block_offset)
        got = np.frombuffer(fetch(low, high - low), dtype=np.uint8)
        want = np.frombuffer(expected[low - block_offset:high - block_offset], dtype=np.uint8)
        if len(got) < len(want):   # the file ends early: every missing byte differs
            got = np.concatenate([got, np.full(len(want) - len(got), -1, dtype=np.int16)])
        where = np.flatnonzero(got != want)
        if where.size:
            first = low + int(where[0]) if first < 0 else first
            last = low + int(where[-1])
            count += int(where.size)
    return first, last, count
