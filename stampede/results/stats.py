"""Statistics over gathered samples: pure functions, no I/O, no MPI.

Definitions (also in the README and `stampede run --help`):
- elapsed of an op in an iteration = max(stop) - min(start) over all ranks' samples of
  that op (IOR). agg_gbps = sum(bytes) / elapsed / 1e9. Per-rank rates are never summed.
- latency percentiles of an op pool every successful sample of every measured iteration
  on every rank: min, p50, p90, p99, p99.9, max, with linear interpolation (numpy's
  default), exact (from int64 nanoseconds).
- restore (pseudo-op) = from the start of the phase (its node's first rank out of the
  start barrier, see stampede.run.clock) until the rank holds all its bytes.
  time_to_last_rank_s = max over ranks; first_done_s = min over ranks;
  straggler_ratio = max / median over ranks; each taken per iteration, then the median
  over iterations is reported with its min-max spread.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stampede.results.samples import ITER, NBYTES, NETWORK_OPS, OK, OP, OPS, RANK, START, STOP, STORAGE_OPS

NAN = float("nan")
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
# Below these, a result is printed but flagged (pyperf's format_checks spirit).
WIDE_SPREAD = 0.10          # (max - min) / median across iterations
SHORT_PHASE_S = 0.010       # barrier skew and timer calls become a visible share
FEW_SAMPLES_P99 = 100       # p99 needs at least 100 samples to be a p99


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


# 20 buckets per decade from 100 ns to 10^4 s (12% wide): the resolution of a CDF drawn
# from the sidecar, whatever the number of samples.
BUCKETS_PER_DECADE = 20
HISTOGRAM_EDGES_S = tuple(10.0 ** (exponent / BUCKETS_PER_DECADE)
                          for exponent in range(-7 * BUCKETS_PER_DECADE, 4 * BUCKETS_PER_DECADE + 1))
# Per rank and measured iteration (0-based, warmup dropped): its first op's start (the
# jitter delay included), the end of its first read (a whole block has arrived: "first
# byte"), the end of its last read, and when it was done; seconds on the phase's axis
# (stampede.run.clock), NaN where the layout has no such moment (a broadcast member reads none).
TIMELINE_COLUMNS = ("rank", "iteration", "start_s", "first_byte_s", "last_read_s", "done_s")


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


def latency(durations_ns: np.ndarray) -> Latency:
    if durations_ns.size == 0:
        return EMPTY_LATENCY
    seconds = durations_ns.astype(np.float64) / 1e9
    p50, p90, p99, p999 = np.percentile(seconds, PERCENTILES)
    return Latency(int(seconds.size), float(seconds.min()), float(p50), float(p90), float(p99),
                   float(p999), float(seconds.max()))


def spread(values: list[float]) -> Spread:
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return EMPTY_SPREAD
    return Spread(float(np.median(finite)), float(min(finite)), float(max(finite)))


def op_stats(samples: np.ndarray, op: str, iterations: list[int]) -> OpStats:
    rows = samples[samples[:, OP] == OPS.index(op)]
    good = rows[rows[:, OK] == 1]
    elapsed, rates, gbps = [], [], []
    for iteration in iterations:
        chosen = good[good[:, ITER] == iteration]
        if chosen.size == 0:
            continue
        seconds = (chosen[:, STOP].max() - chosen[:, START].min()) / 1e9
        elapsed.append(seconds)
        rates.append(len(chosen) / seconds if seconds > 0 else NAN)
        gbps.append(chosen[:, NBYTES].sum() / seconds / 1e9 if seconds > 0 else NAN)
    return OpStats(op=op, count=len(good), errors=len(rows) - len(good),
                   bytes=int(good[:, NBYTES].sum()), latency=latency(good[:, STOP] - good[:, START]),
                   elapsed_s=spread(elapsed), ops_per_s=spread(rates), agg_gbps=spread(gbps))


def _span_s(rows: np.ndarray) -> float:
    return float(rows[:, STOP].max() - rows[:, START].min()) / 1e9 if rows.size else NAN


def restore_stats(samples: np.ndarray, iterations: list[int], nranks: int,
                  completion_op: str = "restore") -> RestoreStats:
    """The completion op (restore, or startup) per iteration across ranks, and how it
    splits into storage and network."""
    storage = samples[np.isin(samples[:, OP], [OPS.index(op) for op in STORAGE_OPS])]
    network = samples[np.isin(samples[:, OP], [OPS.index(op) for op in NETWORK_OPS])]
    read_code = OPS.index("read")
    storage_s, network_s, storage_ops, storage_bytes = [], [], [], []
    for iteration in iterations:
        in_storage = storage[storage[:, ITER] == iteration]
        storage_s.append(_span_s(in_storage))
        network_s.append(_span_s(network[network[:, ITER] == iteration]))
        storage_ops.append(float(len(in_storage)))
        storage_bytes.append(float(in_storage[in_storage[:, OP] == read_code][:, NBYTES].sum()))
    rows = samples[samples[:, OP] == OPS.index(completion_op)]
    last, first, straggle = [], [], []
    per_rank = np.full((nranks, len(iterations)), np.nan)
    for iteration in iterations:
        chosen = rows[rows[:, ITER] == iteration]
        if chosen.size == 0:
            continue
        seconds = (chosen[:, STOP] - chosen[:, START]) / 1e9
        last.append(float(seconds.max()))
        first.append(float(seconds.min()))
        median = float(np.median(seconds))
        straggle.append(float(seconds.max()) / median if median > 0 else NAN)
        per_rank[chosen[:, RANK], iterations.index(iteration)] = seconds
    # one vectorised median per rank (16,384 np.median calls would cost rank 0 a second)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a rank with no sample: NaN
        per_rank_median = np.nanmedian(per_rank, axis=1) if per_rank.size else np.empty(0)
    medians = tuple(float(value) for value in per_rank_median)
    finite = np.flatnonzero(np.isfinite(per_rank_median))
    order = finite[np.argsort(-per_rank_median[finite], kind="stable")]
    return RestoreStats(time_to_last_rank_s=spread(last), first_done_s=spread(first),
                        straggler_ratio=spread(straggle),
                        slowest_ranks=tuple((int(rank), medians[rank]) for rank in order[:3]),
                        per_rank_s=medians, per_iteration_s=tuple(last),
                        storage_s=spread(storage_s), network_s=spread(network_s),
                        storage_ops=spread(storage_ops), storage_bytes=spread(storage_bytes))


def layout_stats(layout: str, samples: np.ndarray, nranks: int,
                 completion_op: str = "restore") -> LayoutStats:
    """Everything the archive and report need about one layout's measured iterations.
    The completion op is the one whose per-rank durations give time to last rank."""
    iterations = sorted({int(value) for value in samples[:, ITER]}) if samples.size else []
    present = {OPS[int(code)] for code in np.unique(samples[:, OP])} if samples.size else set()
    ops = tuple(op_stats(samples, op, iterations) for op in OPS if op in present)
    good = samples[samples[:, OK] == 1] if samples.size else samples
    histograms = {op: histogram(good[good[:, OP] == OPS.index(op)][:, STOP]
                                - good[good[:, OP] == OPS.index(op)][:, START])
                  for op in OPS if op in present}
    return LayoutStats(layout=layout, iterations=len(iterations), ops=ops,
                       restore=restore_stats(samples, iterations, nranks, completion_op),
                       completion_op=completion_op, histograms=histograms,
                       timeline=timeline(samples, completion_op))


def histogram(durations_ns: np.ndarray) -> Histogram:
    counts, _ = np.histogram(durations_ns.astype(np.float64) / 1e9, bins=HISTOGRAM_EDGES_S)
    return Histogram(counts=tuple(int(count) for count in counts), edges_s=HISTOGRAM_EDGES_S)


def timeline(samples: np.ndarray, completion_op: str = "restore") -> tuple[tuple[float, ...], ...]:
    """Each rank's moments in each iteration (TIMELINE_COLUMNS): the herd, rank by rank."""
    if not samples.size:
        return ()
    # One pass, vectorised: a key per (rank, iteration), then min/max reductions by key.
    pairs, key = np.unique(samples[:, [RANK, ITER]], axis=0, return_inverse=True)
    key = key.ravel()
    done_code = OPS.index(completion_op)
    reads = (samples[:, OP] == OPS.index("read")) & (samples[:, OK] == 1)
    done, timed = samples[:, OP] == done_code, samples[:, OP] != done_code

    def reduce(mask: np.ndarray, column: int, ufunc: np.ufunc, empty: float) -> np.ndarray:
        out = np.full(len(pairs), empty)
        ufunc.at(out, key[mask], samples[mask, column].astype(np.float64) / 1e9)
        return np.where(np.isinf(out), NAN, out)

    columns = (reduce(timed, START, np.minimum, np.inf), reduce(reads, STOP, np.minimum, np.inf),
               reduce(reads, STOP, np.maximum, -np.inf), reduce(done, STOP, np.maximum, -np.inf))
    return tuple((float(rank), float(iteration), *(float(c[i]) for c in columns))
                 for i, (rank, iteration) in enumerate(pairs))


# Targets with no page cache on the client (fsspec protocols): the cache mode means nothing.
NO_CLIENT_CACHE = ("s3", "gcs", "gs", "memory", "http", "https")


def warnings_for(stats: LayoutStats, cache: str, ranks_per_node: int, cpus_per_node: int,
                 fs_type: str, verify_in_restore: str = "") -> tuple[str, ...]:
    """Why a number should not be trusted as it stands; archived with the run."""
    notes = []
    ttlr = stats.restore.time_to_last_rank_s
    if stats.iterations < 3:
        notes.append(f"only {stats.iterations} measured iteration(s): no trustworthy spread")
    elif ttlr.relative > WIDE_SPREAD:
        notes.append(f"time to last rank varies {ttlr.relative:.0%} across iterations "
                     f"({ttlr.min:.4g}-{ttlr.max:.4g} s): run more iterations or on a quieter machine")
    if ttlr.median < SHORT_PHASE_S and stats.completion_op == "restore":
        notes.append(f"restore phase is {ttlr.median * 1e3:.3g} ms: barrier skew and timer calls "
                     "are a visible part of it; use a larger checkpoint")
    few = [f"{op.op} {op.count}" for op in stats.ops if 0 < op.count < FEW_SAMPLES_P99
           and op.op not in ("jitter", stats.completion_op)]
    if few:
        notes.append(f"p99 and p99.9 from fewer than {FEW_SAMPLES_P99} samples ({', '.join(few)}): "
                     "raise iterations or pattern.stat_count/open_count")
    for op in stats.ops:
        if op.errors:
            notes.append(f"{op.op}: {op.errors} failed op(s)")
    if verify_in_restore:
        notes.append(f"verify={verify_in_restore}: hashing runs between reads, so restore times "
                     "include it")
    if cache == "warm" and fs_type not in NO_CLIENT_CACHE:
        notes.append("cache=warm: reads may come from the page cache, not the storage")
    if cache == "cold" and fs_type in ("tmpfs", "ramfs"):
        notes.append(f"cache=cold on {fs_type}: pages cannot be evicted, the run is warm")
    if ranks_per_node > cpus_per_node:
        notes.append(f"{ranks_per_node} ranks per node on {cpus_per_node} CPUs: oversubscribed, "
                     "ranks compete for cores")
    return tuple(notes)


# --- histogram mode (stampede.results.histogram): the same summaries from reduced arrays ---

def latency_from_histogram(counts: np.ndarray, min_ns: int, max_ns: int) -> Latency:
    """Percentiles of the pooled samples from log-bucket counts, by numpy's linear
    definition: the two order statistics around the percentile are each placed inside
    their bucket (geometrically, by their rank in it) and clamped to the exact min and
    max, then interpolated linearly. Each lies in the same bucket as the true sample, so
    the result is within one bucket's width (12.2%) of the exact percentile."""
    total = int(counts.sum())
    if total == 0:
        return EMPTY_LATENCY
    cumulative = np.cumsum(counts)
    low_s, high_s = min_ns / 1e9, max_ns / 1e9

    def order_statistic(index: int) -> float:
        bucket = int(np.searchsorted(cumulative, index, side="right"))
        before = int(cumulative[bucket - 1]) if bucket else 0
        fraction = (index - before + 0.5) / int(counts[bucket])
        lo, hi = HISTOGRAM_EDGES_S[bucket], HISTOGRAM_EDGES_S[bucket + 1]
        return min(max(lo * (hi / lo) ** fraction, low_s), high_s)

    def at(percent: float) -> float:
        position = percent / 100 * (total - 1)            # 0-based, in sorted order
        below = int(position)
        above = min(below + 1, total - 1)
        low, high = order_statistic(below), order_statistic(above)
        return low + (high - low) * (position - below)

    p50, p90, p99, p999 = (at(percent) for percent in PERCENTILES)
    return Latency(total, low_s, p50, p90, p99, p999, high_s, approximate=True)


def layout_stats_reduced(layout: str, reduced: Any, restore_rows: np.ndarray,
                         timeline_rows: tuple[tuple[float, ...], ...], nranks: int,
                         completion_op: str = "restore") -> LayoutStats:
    """LayoutStats from histogram mode's reduced arrays (stampede.results.histogram.Reduced) and the
    exact restore samples; elapsed, counts, bytes, ops/s and GB/s are exact."""
    iterations = list(reduced.iterations)
    ops, histograms = [], {}
    for code, op in enumerate(OPS):
        ok, failed = reduced.ok[code], reduced.failed[code]
        if not (ok.sum() + failed.sum()):
            continue
        elapsed, rates, gbps = [], [], []
        for column in range(len(iterations)):
            if ok[column] == 0:
                continue
            seconds = (reduced.last_stop_ns[code, column] - reduced.first_start_ns[code, column]) / 1e9
            elapsed.append(seconds)
            rates.append(ok[column] / seconds if seconds > 0 else NAN)
            gbps.append(reduced.nbytes[code, column] / seconds / 1e9 if seconds > 0 else NAN)
        ops.append(OpStats(op=op, count=int(ok.sum()), errors=int(failed.sum()),
                           bytes=int(reduced.nbytes[code].sum()),
                           latency=latency_from_histogram(reduced.histograms[code],
                                                          int(reduced.latency_min_ns[code]),
                                                          int(reduced.latency_max_ns[code])),
                           elapsed_s=spread(elapsed), ops_per_s=spread(rates), agg_gbps=spread(gbps)))
        histograms[op] = Histogram(tuple(int(c) for c in reduced.histograms[code]), HISTOGRAM_EDGES_S)
    restore = restore_stats(restore_rows, iterations, nranks, completion_op)
    parts = _parts_reduced(reduced, len(iterations))
    restore = replace(restore, storage_s=parts["storage_s"], network_s=parts["network_s"],
                      storage_ops=parts["storage_ops"], storage_bytes=parts["storage_bytes"])
    return LayoutStats(layout=layout, iterations=len(iterations), ops=tuple(ops), restore=restore,
                       completion_op=completion_op, histograms=histograms,
                       timeline=timeline_rows, samples="histogram")


def _parts_reduced(reduced: Any, nits: int) -> dict[str, Spread]:
    """Storage and network parts per iteration from the reduced first starts / last stops."""
    storage = [OPS.index(op) for op in STORAGE_OPS]
    network = [OPS.index(op) for op in NETWORK_OPS]
    read = OPS.index("read")

    def span(codes: list[int], column: int) -> float:
        used = [code for code in codes if reduced.ok[code, column]]
        if not used:
            return NAN
        return float(max(reduced.last_stop_ns[c, column] for c in used)
                     - min(reduced.first_start_ns[c, column] for c in used)) / 1e9

    return {
        "storage_s": spread([span(storage, column) for column in range(nits)]),
        "network_s": spread([span(network, column) for column in range(nits)]),
        "storage_ops": spread([float(sum(reduced.ok[c, column] + reduced.failed[c, column]
                                         for c in storage)) for column in range(nits)]),
        "storage_bytes": spread([float(reduced.nbytes[read, column]) for column in range(nits)]),
    }
