"""What a layout's statistics say, as frozen records that check themselves (a summary
with a negative duration cannot exist): latency percentiles, spreads over iterations, per
op and per restore, histograms. stampede.results.stats builds them on rank 0 (worker
ranks never import this module: at 16,384 ranks every module is a metadata storm, and
each dataclass costs a few compiles), stampede.results.model's LayoutRun carries them.
"""

from __future__ import annotations

from dataclasses import dataclass

NAN = float("nan")


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
    """Latency counts in buckets, 1 ns wide below 100 ns and log-spaced above:
    edges_s[i] <= latency < edges_s[i + 1].
    Fixed edges (HISTOGRAM_EDGES_S), so histograms of any runs add up bucket by bucket."""

    counts: tuple[int, ...]
    edges_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.counts) + 1 != len(self.edges_s) or min(self.counts, default=0) < 0:
            raise ValueError("a histogram needs one more edge than counts, and counts >= 0")


@dataclass(frozen=True)
class LayoutStats:
    layout: str
    iterations: int            # measured iterations that produced samples
    ops: tuple[OpStats, ...]
    restore: RestoreStats      # of the completion op
    completion_op: str = "restore"
    histograms: dict[str, Histogram] | None = None       # op -> latency histogram
    timeline: tuple[tuple[float, ...], ...] = ()         # rows of model.TIMELINE_COLUMNS
    samples: str = "exact"     # or "histogram": reduced per rank (stampede.results.histogram)
    unprotected_s: float = NAN  # a save's window without a published checkpoint (stats)
