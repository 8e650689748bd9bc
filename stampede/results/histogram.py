"""Samples at scale: each rank reduces its own samples, MPI reduces the ranks.

In exact mode every sample reaches rank 0 (Gatherv of int64 nanoseconds). At 16,384 ranks
x 10 iterations x hundreds of reads each that is gigabytes on one rank, so in histogram
mode (run.samples = "histogram", or "auto" past stampede.run.gather.AUTO_SAMPLES) each
rank turns its samples into fixed-size arrays that MPI then reduces, with a cost on rank
0 that does not grow with the number of ops:
  - per op, a latency histogram over HISTOGRAM_EDGES_S (SUM), and the exact
    minimum and maximum latency (MIN, MAX);
  - per op and iteration, the count of successful and failed ops and their bytes (SUM),
    the first start and the last stop (MIN, MAX): elapsed, ops/s and GB/s stay exact.
The restore samples (one per rank and iteration) and each rank's timeline still reach
rank 0 whole. Percentiles other than min and max are then read from the buckets (1 ns
wide below 100 ns, DDSketch's logarithmic mapping above: each order statistic at the
relative midpoint of the nanoseconds its bucket holds), within BUCKET_ERROR (1%) of the
exact ones whatever the durations, and every row they appear in says
`samples = histogram`.

This module is the arithmetic alone (per rank: summarize; on rank 0: the statistics from
the reduced arrays); the collectives that move the arrays are stampede.run.gather's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stampede.ops import OPS
from stampede.results.definitions import GAMMA, PERCENTILES
from stampede.results.samples import ITER, NBYTES, OK, OP, START, STOP
from stampede.results.summaries import EMPTY_LATENCY, Histogram, Latency
from stampede.units import NS_PER_S

# Bucket edges in nanoseconds, the int64 unit every duration is measured in, spanning all
# of them (np.histogram drops a sample outside its edges without a word, and every order
# statistic above it shifts): below 100 ns one bucket per nanosecond, [k, k + 1), each
# holding a single possible duration, read exactly (a coarse clock's zeros among them);
# from there GAMMA^k, each bucket 2% wide, up to 2^63 ns (292 years), past the longest
# int64 duration. About 2,050 buckets: the resolution of a CDF drawn from the sidecar,
# whatever the number of samples.
_LOG_EDGES_NS = [GAMMA ** exponent * NS_PER_S for exponent in range(
    math.floor(math.log(1e-7) / math.log(GAMMA)),
    math.ceil(math.log(2.0 ** 63 / NS_PER_S) / math.log(GAMMA)) + 1)]
EDGES_NS = np.array([*range(math.ceil(_LOG_EDGES_NS[0])), *_LOG_EDGES_NS], dtype=np.float64)
HISTOGRAM_EDGES_S = tuple(float(edge) for edge in EDGES_NS / NS_PER_S)
BIG = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Reduced:
    """The ranks' samples of one layout, reduced (complete on rank 0)."""

    histograms: np.ndarray        # [op, bucket] counts of successful samples
    latency_min_ns: np.ndarray    # [op]
    latency_max_ns: np.ndarray    # [op]
    ok: np.ndarray                # [op, iteration] successful samples
    failed: np.ndarray            # [op, iteration]
    nbytes: np.ndarray            # [op, iteration] bytes of successful samples
    first_start_ns: np.ndarray    # [op, iteration] on the phase's axis
    last_stop_ns: np.ndarray      # [op, iteration]
    iterations: tuple[int, ...]   # the iteration number of each column


def summarize(rows: np.ndarray, iterations: tuple[int, ...]) -> dict[str, np.ndarray]:
    """One rank's fixed-size arrays (whatever its sample count)."""
    nops, nits = len(OPS), len(iterations)
    column = {iteration: index for index, iteration in enumerate(iterations)}
    out = {
        "histograms": np.zeros((nops, len(EDGES_NS) - 1), dtype=np.int64),
        "latency_min_ns": np.full(nops, BIG, dtype=np.int64),
        "latency_max_ns": np.zeros(nops, dtype=np.int64),
        "ok": np.zeros((nops, nits), dtype=np.int64),
        "failed": np.zeros((nops, nits), dtype=np.int64),
        "nbytes": np.zeros((nops, nits), dtype=np.int64),
        "first_start_ns": np.full((nops, nits), BIG, dtype=np.int64),
        "last_stop_ns": np.full((nops, nits), -BIG, dtype=np.int64),
    }
    if not rows.size:
        return out
    ops, cols = rows[:, OP], np.array([column[int(i)] for i in rows[:, ITER]]) if nits else None
    good = rows[:, OK] == 1
    durations = rows[:, STOP] - rows[:, START]
    for code in np.unique(ops):
        mine = good & (ops == code)
        if mine.any():
            out["histograms"][code] = np.histogram(durations[mine], bins=EDGES_NS)[0]
            out["latency_min_ns"][code] = durations[mine].min()
            out["latency_max_ns"][code] = durations[mine].max()
    assert cols is not None
    np.add.at(out["ok"], (ops[good], cols[good]), 1)
    np.add.at(out["failed"], (ops[~good], cols[~good]), 1)
    np.add.at(out["nbytes"], (ops[good], cols[good]), rows[good, NBYTES])
    np.minimum.at(out["first_start_ns"], (ops[good], cols[good]), rows[good, START])
    np.maximum.at(out["last_stop_ns"], (ops[good], cols[good]), rows[good, STOP])
    return out


REDUCTIONS = {"histograms": "sum", "latency_min_ns": "min", "latency_max_ns": "max", "ok": "sum",
              "failed": "sum", "nbytes": "sum", "first_start_ns": "min", "last_stop_ns": "max"}




def histogram(durations_ns: np.ndarray) -> Histogram:
    counts, _ = np.histogram(durations_ns, bins=EDGES_NS)
    return Histogram(counts=tuple(int(count) for count in counts), edges_s=HISTOGRAM_EDGES_S)


def latency_from_histogram(counts: np.ndarray, min_ns: int, max_ns: int) -> Latency:
    """Percentiles of the pooled samples from the buckets' counts, by numpy's linear
    definition: the two order statistics around the percentile are each read at the
    relative midpoint 2 a b / (a + b) of the whole nanoseconds a..b their bucket holds
    (within BUCKET_ERROR of each of them, the true one among them; exact in a bucket of
    one nanosecond, 0 in [0, 1)) and clamped to the exact min and max, then interpolated
    linearly, which keeps the bound."""
    total = int(counts.sum())
    if total == 0:
        return EMPTY_LATENCY
    cumulative = np.cumsum(counts)
    low_s, high_s = min_ns / NS_PER_S, max_ns / NS_PER_S

    def order_statistic(index: int) -> float:
        bucket = int(np.searchsorted(cumulative, index, side="right"))
        first_ns, last_ns = math.ceil(EDGES_NS[bucket]), math.ceil(EDGES_NS[bucket + 1]) - 1
        middle_ns = 2 * first_ns * last_ns / (first_ns + last_ns) if last_ns else 0.0
        return min(max(middle_ns / NS_PER_S, low_s), high_s)

    def at(percent: float) -> float:
        position = percent / 100 * (total - 1)            # 0-based, in sorted order
        below = int(position)
        above = min(below + 1, total - 1)
        low, high = order_statistic(below), order_statistic(above)
        return low + (high - low) * (position - below)

    p50, p90, p99, p999 = (at(percent) for percent in PERCENTILES)
    return Latency(total, low_s, p50, p90, p99, p999, high_s, approximate=True)
