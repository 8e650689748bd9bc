"""The raw-read ceiling of a node, as records (pure): what the node's storage gives to
large sequential reads from a cold cache, with no loader and no layout in the way, at
1, 4, 16 and 32 concurrent streams, each stream count REPEATS times; the best stream
count's median is the node's ceiling. A layout's or a loader's efficiency is its storage
GB/s over the ceiling of the nodes that read.

Measured by stampede.run.ceiling before the run's first layout (`run.ceiling = true`);
kept in the sidecar (every stream count of every node) and, per run, in the restore
rows' columns ceiling_gbps, ceiling_gbps_max and ceiling_efficiency. GB = 10^9 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

STREAM_COUNTS = (1, 4, 16, 32)      # concurrent streams, each measured cold
# One cold read per stream count is one sample, and every efficiency is divided by the
# best of them: on a busy node a lucky or unlucky read moved it. The median of 3 steadies it.
REPEATS = 3
REQUEST_BYTES = 8 * 2**20           # one read request: large, as a restore's best case
BYTES_PER_GB = 1e9


@dataclass(frozen=True)
class StreamRead:
    """One stream count on one node: the bytes asked and read, the wall time from the
    streams' common start to the last one's end, and what mincore saw cached of the
    node's bytes after the eviction and before the start (0 when cold)."""

    streams: int
    bytes_asked: int
    bytes_read: int
    seconds: float
    resident_bytes_before: int

    @property
    def gbps(self) -> float:
        return self.bytes_read / self.seconds / BYTES_PER_GB if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class NodeCeiling:
    """One node's reads at every stream count (each repeat, in the order read), each
    stream count's median, and the best of those: its ceiling."""

    host: str
    reads: tuple[StreamRead, ...]

    @property
    def medians(self) -> tuple[StreamRead, ...]:
        """Per stream count (in the order first read), its median repeat by GB/s: a read
        that happened (the lower middle of an even count), not an average of reads."""
        counts = dict.fromkeys(read.streams for read in self.reads)
        found = []
        for streams in counts:
            finite = sorted((read for read in self.reads
                             if read.streams == streams and math.isfinite(read.gbps)),
                            key=lambda read: read.gbps)
            if finite:
                found.append(finite[(len(finite) - 1) // 2])
        return tuple(found)

    @property
    def best(self) -> StreamRead | None:
        return max(self.medians, key=lambda read: read.gbps, default=None)

    @property
    def gbps(self) -> float:
        best = self.best
        return best.gbps if best is not None else math.nan


@dataclass(frozen=True)
class Ceiling:
    """Every node's ceiling, measured at once (the nodes read together, as a restore's do)."""

    nodes: tuple[NodeCeiling, ...]
    messages: tuple[str, ...] = ()   # what went wrong on a node (an eviction, a read)

    @property
    def min_gbps(self) -> float:
        """The slowest node's ceiling: the one a restore waiting on every node meets."""
        return min((node.gbps for node in self.nodes), default=math.nan)

    @property
    def max_gbps(self) -> float:
        return max((node.gbps for node in self.nodes), default=math.nan)

    @property
    def total_gbps(self) -> float:
        """The nodes' ceilings summed: what the job's nodes could read together."""
        return sum(node.gbps for node in self.nodes) if self.nodes else math.nan

    def sidecar(self) -> dict[str, object]:
        """The sidecar's `ceiling`: per node, every read as measured (each stream count
        REPEATS times), its ceiling (the best stream count's median) and that count."""
        return {"request_bytes": REQUEST_BYTES, "messages": list(self.messages), "nodes": [
            {"host": node.host, "gbps": _finite(node.gbps),
             "best_streams": node.best.streams if node.best else None,
             "reads": [{"streams": read.streams, "bytes_asked": read.bytes_asked,
                        "bytes_read": read.bytes_read, "seconds": read.seconds,
                        "gbps": _finite(read.gbps),
                        "resident_bytes_before": read.resident_bytes_before}
                       for read in node.reads]}
            for node in self.nodes]}


def efficiency(storage_bytes: float, storage_s: float, nnodes: int, ceiling_gbps: float) -> float:
    """A layout's storage GB/s per node (its bytes from storage per iteration, over the
    nodes that read them and the storage window's seconds) over a node's ceiling: 1.0 when
    each node read as fast as raw large reads could; NaN when either is unknown."""
    if storage_s <= 0 or nnodes <= 0 or not math.isfinite(ceiling_gbps) or ceiling_gbps <= 0 \
            or not math.isfinite(storage_bytes):
        return math.nan
    return storage_bytes / nnodes / storage_s / BYTES_PER_GB / ceiling_gbps


def ceiling_columns(ceiling: Ceiling, storage_bytes: float, storage_s: float,
                    nnodes: int) -> dict[str, float]:
    """A restore's completion row: the slowest and fastest node's ceiling, and the
    layout's efficiency against the nodes' mean ceiling (their sum over the nodes)."""
    mean = ceiling.total_gbps / len(ceiling.nodes) if ceiling.nodes else math.nan
    return {"ceiling_gbps": ceiling.min_gbps, "ceiling_gbps_max": ceiling.max_gbps,
            "ceiling_efficiency": efficiency(storage_bytes, storage_s, nnodes, mean)}


def efficiency_text(value: float) -> str:
    """'0.93x': how a table says an efficiency; '' when there is none."""
    return f"{value:.2f}x" if isinstance(value, float) and math.isfinite(value) else ""


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def split_evenly(total: int, parts: int, align: int) -> list[tuple[int, int]]:
    """[start, end) of `parts` contiguous pieces of [0, total), each start a multiple of
    `align` (the last piece takes the rest; a piece may be empty when total is small)."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, not {parts}")
    step = -(-total // parts)
    step = -(-step // align) * align
    return [(min(k * step, total), min((k + 1) * step, total)) for k in range(parts)]


def pieces(files: Sequence[tuple[str, int]], start: int, end: int) -> list[tuple[str, int, int]]:
    """(file, offset, length) of the bytes [start, end) of the files laid end to end."""
    found, base = [], 0
    for name, size in files:
        lo, hi = max(start, base), min(end, base + size)
        if lo < hi:
            found.append((name, lo - base, hi - lo))
        base += size
    return found
