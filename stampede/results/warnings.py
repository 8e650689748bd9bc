"""Why a number should not be trusted as it stands (pyperf's format_checks spirit): the
result is printed and archived, with these warnings beside it in every row."""

from __future__ import annotations

import os

from stampede.filesystems import kind_of
from stampede.layouts import exchanges
from stampede.ops import BEFORE_PHASE_OPS
from stampede.results.definitions import BUCKET_ERROR
from stampede.results.mlperf import comparability_note
from stampede.results.model import ClientCounts, RunContext
from stampede.results.summaries import LayoutStats
from stampede.spec import JobSpec
from stampede.targets import capabilities_for
from stampede.units import MS_PER_S, format_plain, format_seconds

# in every label (stampede.run.devices) of a cuFile path that goes through host memory
NOT_GDS = "NOT GDS"

WIDE_SPREAD = 0.10          # (max - min) / median across iterations
SHORT_PHASE_S = 0.010       # barrier skew and timer calls become a visible share
FEW_SAMPLES_P99 = 100       # p99 needs at least 100 samples to be a p99
COLD_RESIDENT_MAX = 0.05    # a cold phase that starts with more cached than this is warned


def warnings_for(stats: LayoutStats, cache: str, ranks_per_node: int, cpus_per_node: int,
                 fs_type: str, page_cache: bool, checks: str = "") -> tuple[str, ...]:
    """Why a number should not be trusted as it stands; archived with the run. page_cache:
    the target's reads may come from a page cache (stampede.targets.Capabilities); without
    one the cache mode means nothing."""
    notes = []
    ttlr = stats.restore.time_to_last_rank_s
    if not stats.iterations:
        notes.append("no measured iteration: the samples are the failed warmup's, archived as "
                     "the evidence of why")
    elif stats.iterations < 3:
        notes.append(f"only {stats.iterations} measured iteration(s): no trustworthy spread")
    elif ttlr.relative > WIDE_SPREAD:
        notes.append(f"time to last rank varies {ttlr.relative:.0%} across iterations "
                     f"({format_seconds(ttlr.min)} to {format_seconds(ttlr.max)}): run more "
                     "iterations or on a quieter machine")
    if ttlr.median < SHORT_PHASE_S and stats.completion_op in ("restore", "save"):
        notes.append(f"{stats.completion_op} phase is {format_plain(ttlr.median * MS_PER_S)} ms: "
                     "barrier skew and timer calls are a visible part of it; use a larger checkpoint")
    few = [f"{op.op} {op.count}" for op in stats.ops if 0 < op.count < FEW_SAMPLES_P99
           and op.op not in ("jitter", stats.completion_op)]
    if few:
        more = "run.iterations" if stats.completion_op == "save" else \
            "iterations or pattern.stat_count/open_count"
        notes.append(f"p99 and p99.9 from fewer than {FEW_SAMPLES_P99} samples ({', '.join(few)}): "
                     f"raise {more}")
    for op in stats.ops:
        if op.errors:
            notes.append(f"{op.op}: {op.errors} failed op(s)")
    if checks:
        notes.append(f"{checks}: restore times include checking the bytes (every layout "
                     "checks each rank's bytes once, before its restore ends)")
    if cache == "warm" and page_cache:
        notes.append("cache=warm: reads may come from the page cache, not the storage")
    if cache == "cold" and not kind_of(fs_type).evictable:
        notes.append(f"cache=cold on {fs_type}: {kind_of(fs_type).unevictable}, the run is warm")
    if ranks_per_node > cpus_per_node:
        notes.append(f"{ranks_per_node} ranks per node on {cpus_per_node} CPUs: oversubscribed, "
                     "ranks compete for cores")
    return tuple(notes)



def residency_warning(cache: str, resident: float | None) -> tuple[str, ...]:
    """A cold (or direct) phase that started with its bytes in the page cache."""
    if cache != "warm" and resident is not None and resident > COLD_RESIDENT_MAX:
        return (f"cache={cache}, yet {100 * resident:.0f}% of the bytes to read were in the "
                "page cache when the phase started: not as cold as asked",)
    return ()


def throttle_warning(client: ClientCounts) -> tuple[str, ...]:
    """An object store that throttled: how often, on which ops, and the time waited (it is
    inside the latencies and the time to last rank: the run measured the throttle too)."""
    answers = sum(client.throttles.values())
    if not answers and not client.backoff_s:
        return ()
    per_op = ", ".join(f"{op} {count}" for op, count in client.throttles.items())
    return (f"throttled: {answers} throttling answer(s) (429/503){f' ({per_op})' if per_op else ''}, "
            f"{sum(client.retries.values())} request(s) retried, "
            f"{format_plain(sum(client.backoff_s.values()))} s backing off over all ranks: the latencies "
            "include these waits",)


def layout_warnings(spec: JobSpec, context: RunContext, stats: LayoutStats) -> tuple[str, ...]:
    return _mlperf_note(spec, context) + (save_warnings(spec, context, stats)
                                          if stats.completion_op == "save" else
                                          _restore_warnings(spec, context, stats))


def _mlperf_note(spec: JobSpec, context: RunContext) -> tuple[str, ...]:
    """Layout mlperf: scaled, a subset or at another rank count, said in every row."""
    if spec.workload == "none":
        return ()
    return tuple(filter(None, (comparability_note(spec.workload, context.nranks, spec.subset,
                                                  spec.scale),)))


def _restore_warnings(spec: JobSpec, context: RunContext, stats: LayoutStats) -> tuple[str, ...]:
    checks = " and ".join(filter(None, (f"run.verify = {spec.verify}" if spec.verify != "none"
                                        else "", "run.check_finite" if spec.check_finite else "")))
    notes = warnings_for(stats, spec.cache, context.ranks_per_node, os.cpu_count() or 1,
                         context.fs_type, capabilities_for(spec.target_path).page_cache, checks)
    if spec.h2d == "host":
        notes += (f"h2d went to {context.device}: a stand-in for tests",)
    before = [op.op for op in stats.ops if op.op in BEFORE_PHASE_OPS]
    if before:
        notes += (f"run.exchange = torch: {' and '.join(before)} ran before the phase's start "
                  "barrier, outside the restore (negative times on its axis)",)
    if spec.h2d == "cuda-gds" and NOT_GDS in context.device:
        notes += (f"run.h2d = cuda-gds went through host memory ({context.device}): not "
                  "GPUDirect Storage numbers",)
    if stats.samples == "histogram":
        notes += (f"p50-p99.9 from log buckets (run.samples = histogram): within "
                  f"{BUCKET_ERROR:.0%} of the exact values; min, max, counts, GB/s and restore "
                  "times are exact",)
    # Layouts that read into a reused block check and copy block by block, between reads;
    # those that exchange do it after the exchange, on the held shard.
    copies = "copies back from the device to check" if spec.h2d == "cuda-gds" else \
        "copies to the device"
    between = [what for what, on in (("checking", bool(checks)),
                                      (copies, spec.h2d not in ("none", "cuda-gds")
                                       or (spec.h2d == "cuda-gds" and bool(checks))))
               if on and not exchanges(stats.layout)]
    if between:
        notes += (f"{' and '.join(between)} run between reads here: the read op's aggregate "
                  "GB/s spans them (its latencies do not)",)
    return notes


def save_warnings(spec: JobSpec, context: RunContext, stats: LayoutStats) -> tuple[str, ...]:
    """A save's: what its time is not (buffered, in memory), beside the common ones."""
    notes = warnings_for(stats, "", context.ranks_per_node, os.cpu_count() or 1,
                         context.fs_type, capabilities_for(spec.target_path).page_cache)
    if spec.durability == "none":
        notes += ("save.durability = none: no fsync; save times and GB/s are buffered (handed "
                  "to the page cache), not the storage's",)
        if spec.validate != "none":
            notes += ("save.validate with durability none: the re-reads find the unflushed "
                      "pages in the page cache, not the storage",)
    if not kind_of(context.fs_type).durable_fsync:
        notes += (f"saved to {context.fs_type}: {kind_of(context.fs_type).volatile}",)
    if stats.samples == "histogram":
        notes += (f"p50-p99.9 from log buckets (run.samples = histogram): within "
                  f"{BUCKET_ERROR:.0%} of the exact values",)
    return notes
