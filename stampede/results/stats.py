"""Statistics over gathered samples: pure functions, no I/O, no MPI.

Definitions (also in docs/concepts/measured.md and `stampede run --help`):
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
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from stampede.ops import NETWORK_OPS, OPS, SAVE_ORDER, SAVE_STORAGE_OPS, STORAGE_OPS, TIMELINE_PHASES
from stampede.results.definitions import PERCENTILES
from stampede.results.histogram import HISTOGRAM_EDGES_S, histogram, latency_from_histogram
from stampede.results.samples import ITER, NBYTES, OK, OP, RANK, START, STOP
from stampede.results.summaries import (
    EMPTY_LATENCY,
    EMPTY_SPREAD,
    NAN,
    Histogram,
    Latency,
    LayoutStats,
    OpStats,
    RestoreStats,
    Spread,
)
from stampede.units import BYTES_PER_GB, NS_PER_S

if TYPE_CHECKING:
    from stampede.results.histogram import Reduced

# completion op -> (its storage ops, the op whose bytes count as moved); startup has none
PARTS = {"save": (SAVE_STORAGE_OPS, "write")}
READ_PARTS = (STORAGE_OPS, "read")


def latency(durations_ns: np.ndarray) -> Latency:
    if durations_ns.size == 0:
        return EMPTY_LATENCY
    seconds = durations_ns.astype(np.float64) / NS_PER_S
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
        seconds = (chosen[:, STOP].max() - chosen[:, START].min()) / NS_PER_S
        elapsed.append(seconds)
        rates.append(len(chosen) / seconds if seconds > 0 else NAN)
        gbps.append(chosen[:, NBYTES].sum() / seconds / BYTES_PER_GB if seconds > 0 else NAN)
    return OpStats(op=op, count=len(good), errors=len(rows) - len(good),
                   bytes=int(good[:, NBYTES].sum()), latency=latency(good[:, STOP] - good[:, START]),
                   elapsed_s=spread(elapsed), ops_per_s=spread(rates), agg_gbps=spread(gbps))


def _span_s(rows: np.ndarray) -> float:
    return float(rows[:, STOP].max() - rows[:, START].min()) / NS_PER_S if rows.size else NAN


def restore_stats(samples: np.ndarray, iterations: list[int], nranks: int,
                  completion_op: str = "restore") -> RestoreStats:
    """The completion op (restore, save or startup) per iteration across ranks, and how it
    splits into storage and network."""
    storage_ops_of, bytes_op = PARTS.get(completion_op, READ_PARTS)
    storage = samples[np.isin(samples[:, OP], [OPS.index(op) for op in storage_ops_of])]
    network = samples[np.isin(samples[:, OP], [OPS.index(op) for op in NETWORK_OPS])]
    read_code = OPS.index(bytes_op)
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
        seconds = (chosen[:, STOP] - chosen[:, START]) / NS_PER_S
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


def measured_count(iterations: list[int]) -> int:
    """The measured iterations among those with samples: a failed warmup's (negative) are
    kept as the evidence of an invalid run, never counted as measured."""
    return sum(1 for iteration in iterations if iteration >= 0)


def layout_stats(layout: str, samples: np.ndarray, nranks: int,
                 completion_op: str = "restore") -> LayoutStats:
    """Everything the archive and report need about one layout's measured iterations.
    The completion op is the one whose per-rank durations give time to last rank."""
    iterations = sorted({int(value) for value in samples[:, ITER]}) if samples.size else []
    present = {OPS[int(code)] for code in np.unique(samples[:, OP])} if samples.size else set()
    order = SAVE_ORDER if completion_op == "save" else OPS
    ops = tuple(op_stats(samples, op, iterations) for op in order if op in present)
    good = samples[samples[:, OK] == 1] if samples.size else samples
    histograms = {op: histogram(good[good[:, OP] == OPS.index(op)][:, STOP]
                                - good[good[:, OP] == OPS.index(op)][:, START])
                  for op in OPS if op in present}
    return LayoutStats(layout=layout, iterations=measured_count(iterations), ops=ops,
                       restore=restore_stats(samples, iterations, nranks, completion_op),
                       completion_op=completion_op, histograms=histograms,
                       timeline=timeline(samples, completion_op),
                       unprotected_s=unprotected_s(samples, iterations))


def unprotected_s(samples: np.ndarray, iterations: list[int]) -> float:
    """The save's window without a valid published checkpoint, the longest over the
    iterations: from the first unlink or rmdir of an old version (retention) until the new
    version's publish ended, where the first came before the second; 0 where retention
    waited for the publish, as it must. NaN when nothing was published."""
    publish = samples[(samples[:, OP] == OPS.index("publish")) & (samples[:, OK] == 1)]
    if not publish.size:
        return NAN
    releases = samples[np.isin(samples[:, OP], [OPS.index("unlink"), OPS.index("rmdir")])]
    windows = []
    for iteration in iterations:
        published = publish[publish[:, ITER] == iteration]
        released = releases[releases[:, ITER] == iteration]
        if published.size and released.size:
            windows.append(max(0.0, float(published[:, STOP].max()
                                          - released[:, START].min()) / NS_PER_S))
        elif published.size:
            windows.append(0.0)
    return max(windows, default=NAN)


def timeline(samples: np.ndarray, completion_op: str = "restore") -> tuple[tuple[float, ...], ...]:
    """Each rank's moments in each iteration (TIMELINE_COLUMNS): the herd, rank by rank."""
    if not samples.size:
        return ()
    # One pass, vectorised: a key per (rank, iteration), then min/max reductions by key.
    pairs, key = np.unique(samples[:, [RANK, ITER]], axis=0, return_inverse=True)
    key = key.ravel()
    done_code = OPS.index(completion_op)
    _, bytes_op = PARTS.get(completion_op, READ_PARTS)
    reads = (samples[:, OP] == OPS.index(bytes_op)) & (samples[:, OK] == 1)
    done, timed = samples[:, OP] == done_code, samples[:, OP] != done_code

    def reduce(mask: np.ndarray, column: int, ufunc: np.ufunc, empty: float) -> np.ndarray:
        out = np.full(len(pairs), empty)
        ufunc.at(out, key[mask], samples[mask, column].astype(np.float64) / NS_PER_S)
        return np.where(np.isinf(out), NAN, out)

    columns = [reduce(timed, START, np.minimum, np.inf), reduce(reads, STOP, np.minimum, np.inf),
               reduce(reads, STOP, np.maximum, -np.inf), reduce(done, STOP, np.maximum, -np.inf)]
    seconds = (samples[:, STOP] - samples[:, START]).astype(np.float64) / NS_PER_S
    for ops in TIMELINE_PHASES.values():   # each phase's total per (rank, iteration)
        mask = np.isin(samples[:, OP], [OPS.index(op) for op in ops])
        columns.append(np.bincount(key[mask], weights=seconds[mask], minlength=len(pairs)))
    return tuple((float(rank), float(iteration), *(float(c[i]) for c in columns))
                 for i, (rank, iteration) in enumerate(pairs))


# --- histogram mode (stampede.results.histogram): the same summaries from reduced arrays ---

def layout_stats_reduced(layout: str, reduced: Reduced, restore_rows: np.ndarray,
                         timeline_rows: tuple[tuple[float, ...], ...], nranks: int,
                         completion_op: str = "restore") -> LayoutStats:
    """LayoutStats from histogram mode's reduced arrays (stampede.results.histogram.Reduced) and the
    exact restore samples; elapsed, counts, bytes, ops/s and GB/s are exact."""
    iterations = list(reduced.iterations)
    ops, histograms = [], {}
    for op in SAVE_ORDER if completion_op == "save" else OPS:
        code = OPS.index(op)
        ok, failed = reduced.ok[code], reduced.failed[code]
        if not (ok.sum() + failed.sum()):
            continue
        elapsed, rates, gbps = [], [], []
        for column in range(len(iterations)):
            if ok[column] == 0:
                continue
            seconds = (reduced.last_stop_ns[code, column] - reduced.first_start_ns[code, column]) / NS_PER_S
            elapsed.append(seconds)
            rates.append(ok[column] / seconds if seconds > 0 else NAN)
            gbps.append(reduced.nbytes[code, column] / seconds / BYTES_PER_GB if seconds > 0 else NAN)
        ops.append(OpStats(op=op, count=int(ok.sum()), errors=int(failed.sum()),
                           bytes=int(reduced.nbytes[code].sum()),
                           latency=latency_from_histogram(reduced.histograms[code],
                                                          int(reduced.latency_min_ns[code]),
                                                          int(reduced.latency_max_ns[code])),
                           elapsed_s=spread(elapsed), ops_per_s=spread(rates), agg_gbps=spread(gbps)))
        histograms[op] = Histogram(tuple(int(c) for c in reduced.histograms[code]), HISTOGRAM_EDGES_S)
    restore = restore_stats(restore_rows, iterations, nranks, completion_op)
    parts = _parts_reduced(reduced, len(iterations), completion_op)
    restore = replace(restore, storage_s=parts["storage_s"], network_s=parts["network_s"],
                      storage_ops=parts["storage_ops"], storage_bytes=parts["storage_bytes"])
    return LayoutStats(layout=layout, iterations=measured_count(iterations), ops=tuple(ops), restore=restore,
                       completion_op=completion_op, histograms=histograms,
                       timeline=timeline_rows, samples="histogram",
                       unprotected_s=_unprotected_reduced(reduced, len(iterations)))


def _unprotected_reduced(reduced: Reduced, nits: int) -> float:
    """unprotected_s from the reduced first starts and last stops (exact)."""
    publish, unlink, rmdir = OPS.index("publish"), OPS.index("unlink"), OPS.index("rmdir")
    windows = []
    for column in range(nits):
        if not reduced.ok[publish, column]:
            continue
        starts = [reduced.first_start_ns[code, column] for code in (unlink, rmdir)
                  if reduced.ok[code, column]]
        end = reduced.last_stop_ns[publish, column]
        windows.append(max(0.0, float(end - min(starts)) / NS_PER_S) if starts else 0.0)
    return max(windows, default=NAN)


def _parts_reduced(reduced: Reduced, nits: int, completion_op: str) -> dict[str, Spread]:
    """Storage and network parts per iteration from the reduced first starts / last stops."""
    storage_ops_of, bytes_op = PARTS.get(completion_op, READ_PARTS)
    storage = [OPS.index(op) for op in storage_ops_of]
    network = [OPS.index(op) for op in NETWORK_OPS]
    read = OPS.index(bytes_op)

    def span(codes: list[int], column: int) -> float:
        used = [code for code in codes if reduced.ok[code, column]]
        if not used:
            return NAN
        return float(max(reduced.last_stop_ns[c, column] for c in used)
                     - min(reduced.first_start_ns[c, column] for c in used)) / NS_PER_S

    return {
        "storage_s": spread([span(storage, column) for column in range(nits)]),
        "network_s": spread([span(network, column) for column in range(nits)]),
        "storage_ops": spread([float(sum(reduced.ok[c, column] + reduced.failed[c, column]
                                         for c in storage)) for column in range(nits)]),
        "storage_bytes": spread([float(reduced.nbytes[read, column]) for column in range(nits)]),
    }
