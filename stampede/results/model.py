"""The model of results, at the bottom of the stack: what a run produced, as frozen
records that check themselves (a summary with a negative duration cannot exist). The
timed code (stampede.run) builds them, the statistics (stampede.results.stats) fill them,
the archive and the report read them; none of them does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from stampede.ops import TIMELINE_PHASES

NAN = float("nan")


def node_counts(hosts: tuple[str, ...] | list[str]) -> tuple[int, int]:
    """(nodes, most ranks on one node) from the host of each rank."""
    return len(set(hosts)), max((list(hosts).count(host) for host in set(hosts)), default=0)


@dataclass(frozen=True)
class Latency:
    """Latency percentiles of one op, in seconds, from `count` samples."""

    count: int
    min_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    p999_s: float
    max_s: float
    approximate: bool = False   # p50..p99.9 interpolated in a histogram bucket (min, max exact)

    def __post_init__(self) -> None:
        values = (self.min_s, self.p50_s, self.p90_s, self.p99_s, self.p999_s, self.max_s)
        if self.count and not all(0 <= a <= b for a, b in zip(values, values[1:])):
            raise ValueError(f"latency percentiles out of order or negative: {values}")


EMPTY_LATENCY = Latency(0, NAN, NAN, NAN, NAN, NAN, NAN)


@dataclass(frozen=True)
class Spread:
    """The median of a per-iteration value with its min and max."""

    median: float
    min: float
    max: float

    @property
    def relative(self) -> float:
        return (self.max - self.min) / self.median if self.median else NAN


EMPTY_SPREAD = Spread(NAN, NAN, NAN)


@dataclass(frozen=True)
class OpStats:
    op: str
    count: int                 # successful samples over all measured iterations
    errors: int                # failed samples
    bytes: int                 # bytes of successful samples, all iterations
    latency: Latency
    elapsed_s: Spread          # max(stop) - min(start) per iteration
    ops_per_s: Spread          # count / elapsed, per iteration
    agg_gbps: Spread           # bytes / elapsed / 1e9, per iteration


@dataclass(frozen=True)
class RestoreStats:
    time_to_last_rank_s: Spread
    first_done_s: Spread
    straggler_ratio: Spread
    slowest_ranks: tuple[tuple[int, float], ...]   # (rank, median restore s), slowest first
    per_rank_s: tuple[float, ...]                  # median restore s of each rank
    per_iteration_s: tuple[float, ...]             # time to last rank of each iteration
    storage_s: Spread          # first storage op start to last storage op stop, all ranks
    network_s: Spread          # the same over the exchange ops (bcast, allgather)
    storage_ops: Spread        # storage ops per iteration, all ranks (what a strategy saves)
    storage_bytes: Spread      # bytes read from storage per iteration, all ranks


@dataclass(frozen=True)
class Histogram:
    """Latency counts in log-spaced buckets: edges_s[i] <= latency < edges_s[i + 1].
    Fixed edges (HISTOGRAM_EDGES_S), so histograms of any runs add up bucket by bucket."""

    counts: tuple[int, ...]
    edges_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.counts) + 1 != len(self.edges_s) or min(self.counts, default=0) < 0:
            raise ValueError("a histogram needs one more edge than counts, and counts >= 0")


# Per rank and measured iteration (0-based, warmup dropped): its first op's start (the
# jitter delay included), the end of its first read (a whole block has arrived: "first
# byte"), the end of its last read, and when it was done; seconds on the phase's axis
# (stampede.run.clock), NaN where the layout has no such moment (a broadcast member reads none).
# Then the seconds the rank spent in each of stampede.ops.TIMELINE_PHASES (the sum of its
# samples' durations, so a broadcast's storage and network parts are told apart); older
# sidecars hold the six moments only.
TIMELINE_MOMENTS = ("rank", "iteration", "start_s", "first_byte_s", "last_read_s", "done_s")
TIMELINE_COLUMNS = TIMELINE_MOMENTS + tuple(
    f"{name.replace(' ', '_')}_s" for name in TIMELINE_PHASES)


@dataclass(frozen=True)
class LayoutStats:
    layout: str
    iterations: int            # measured iterations that produced samples
    ops: tuple[OpStats, ...]
    restore: RestoreStats      # of the completion op
    completion_op: str = "restore"
    histograms: dict[str, Histogram] | None = None       # op -> latency histogram
    timeline: tuple[tuple[float, ...], ...] = ()         # rows of TIMELINE_COLUMNS
    samples: str = "exact"     # or "histogram": reduced per rank (stampede.results.histogram)
    unprotected_s: float = NAN  # a save's window without a published checkpoint (stats)


@dataclass(frozen=True)
class RunContext:
    """Facts about one run, the same for all its layouts (complete on rank 0)."""

    run_id: str
    timestamp: str
    nranks: int
    hosts: tuple[str, ...]       # host of each rank
    backend: str
    fs_type: str
    mpi_library: str
    device: str = ""             # run.h2d: the devices the bytes went on to
    storage: dict[str, object] = field(default_factory=dict)   # backend settings, stripes
    checkpoint_format: str = ""  # an existing checkpoint's format, as found

    @property
    def nnodes(self) -> int:
        return node_counts(self.hosts)[0]

    @property
    def ranks_per_node(self) -> int:
        return node_counts(self.hosts)[1]


@dataclass(frozen=True)
class LayoutTrace:
    """--trace: one layout's rows on rank 0 (stampede.results.trace's TRACE_COLUMNS) and
    the names its file column indexes."""

    rows: np.ndarray
    files: list[str]


@dataclass(frozen=True)
class LayoutRun:
    """One layout's outcome on rank 0."""

    layout: str
    bytes_per_rank: int
    stats: LayoutStats | None    # None on ranks other than 0
    messages: tuple[str, ...]
    invalid_reason: str          # empty when valid
    retries: dict[str, int] = field(default_factory=dict)   # op -> requests retried
    resident_fraction: tuple[float, ...] = ()   # per measured iteration, cache residency
    bytes_total: int = 0         # all ranks' bytes, when they differ by rank (existing)
    digests: tuple[dict[str, object], ...] = ()   # existing checkpoints: what each rank read
    notes: tuple[str, ...] = ()  # warnings from the ranks (a drop_caches refused, ...)
    interrupted: bool = False    # stopped by a signal: not measured to the end
    iterations_done: int = 0     # when interrupted: the measured iterations it completed
                                 # (archived as incomplete; none: stopped in a warmup)
    phase: str = "restore"       # or "save" (stampede.run.save)
    restored_from: str = ""      # a saved version's directory (stampede.checkpoint.versions)
    cache_drops: tuple[int, ...] = ()   # per rank: page-cache drops it made (run.drop_caches)
    kernel_nfs: dict[str, object] = field(default_factory=dict)   # a kernel NFS mount's per-op
                                 # RPC deltas around the layout (stampede.run.kernel_nfs)
    trace: LayoutTrace | None = None   # --trace: every op's row on rank 0


