"""`stampede mttr`: the recovery-time model, fed by measurements where the archive has them.

    T_MTTR = T_detect + T_cordon_swap + T_pod_init + S_weights / BW_rank_io + T_barrier_sync
    example: 15 s + 10 s + 5 s + 30 GB / 2 GB/s + 10 s = 55 s   (the defaults)

From archives it takes:
  BW_rank_io      a restore run's slowest-rank GB/s (bytes per rank / time to last rank):
                  the slowest rank sets the restart, not the mean; its time to first byte
                  (metadata stall) is shown as the part of the load term before data flows
  S_weights       that run's own bytes per rank (as measured: its checkpoint at its scale;
                  --weights-gb or [mttr] weights_gb replace it); at --target-ranks the
                  workload's (--target-model, --target-bytes-per-rank, --target-size)
  T_pod_init      `stampede startup`: time until the last rank is up (launch -> MPI ready)
  T_barrier_sync  the restore's straggler wait (time to last rank - first done: what the
                  ranks that finished wait at the sync), plus the median MPI barrier of
                  `stampede startup` when given; the barrier alone without a restore run;
                  plus, for a layout restored with run.exchange = "torch", its measured
                  op pg_init (init_process_group + the exchange group, nccl's communicator
                  made eagerly: the NCCL initialisation the worked example's 10 s stands
                  for), as its elapsed time (first start -> last rank's group ready,
                  median over iterations); the group's first collective (bcast_first)
                  is reported beside the restore, not added. At --target-ranks: the
                  barrier projected as a + b log2 N from startup barriers at 3+ rank
                  counts (else the worked example's 10 s, assumed), no straggler wait
                  (the projected time to last rank holds it)
  C               a save run's blocking time per checkpoint: time until the last rank could
                  train again (the pseudo-op blocked: the collective save when sync, the
                  snapshot when async); a buffered save (durability none) only with a
                  warning in its source. With --target-ranks, C at the target: a sync
                  save's time to last rank projected there (stampede project --phase
                  save, its band said), an async snapshot scaled by the bytes per rank
                  (a copy in each rank's memory); the measured C, saying why, where the
                  save is not projected
A restore measured with a warm page cache is not a storage measurement: cold or direct
runs are preferred, and a warm one is used only with a warning in its source.
Every other term is an assumption from the flags (or an [mttr] section of a job file),
and the report marks each term measured or assumed.

Checkpointing costs (with C, measured or --checkpoint-cost-s, and --mtbf-h): the
Young/Daly interval tau = sqrt(2 C MTBF) between checkpoints, and per day at tau and at
--checkpoint-interval-s the GPU-hours spent saving (86,400 / tau saves of C seconds on
every GPU) plus those lost to failures (24 / MTBF_h failures, each costing T_MTTR plus
half an interval of work redone on every GPU).

Beside it: GPU-hours lost per failure (and per day at a failure interval), and hot spares:
with a cluster of N nodes that each fail at a rate r per hour and a pool of S warm spares
that take R hours to replenish, the nodes in repair are Poisson with mean N r R, so a
failure finds no warm spare with P = P(Poisson(N r R) >= S), and adds P x T_cold_swap to
T_cordon_swap on average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stampede.errors import UsageError
from stampede.units import BYTES_PER_GB, format_bytes, format_plain, format_seconds

if TYPE_CHECKING:
    from stampede.model.projection import Projection
    from stampede.model.workload import Workload
    from stampede.results.archived import Archive, TermRuns
    from stampede.results.cells import Row

WORKED = "assumed (worked example)"   # the source of a term nobody measured or gave
EXAMPLE = {"detect_s": 15.0, "swap_s": 10.0, "init_s": 5.0, "weights_gb": 30.0,
           "bw_rank_gbps": 2.0, "sync_s": 10.0}
EXTRA_DEFAULTS = {"gpus": 16384.0, "mtbf_h": 0.0, "checkpoint_interval_s": 0.0, "nodes": 2048.0,
                  "node_failures_per_day": 0.001, "replenish_h": 24.0, "cold_swap_s": 1800.0,
                  "checkpoint_cost_s": 0.0}
SECTION_KEYS = (*EXAMPLE, "gpus", "mtbf_h", "checkpoint_interval_s", "nodes",
                "node_failures_per_day", "spares", "replenish_h", "cold_swap_s",
                "checkpoint_cost_s")


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float
    source: str          # "assumed (...)" or "measured: archive run column"

    @property
    def measured(self) -> bool:
        return self.source.startswith("measured")


@dataclass(frozen=True)
class Breakdown:
    terms: tuple[Term, ...]
    weights_gb: float
    bw_rank_gbps: float
    metadata_stall_s: float = math.nan   # inside the load term, when measured

    @property
    def total_s(self) -> float:
        return sum(term.seconds for term in self.terms)

    @property
    def dominant(self) -> tuple[Term, ...]:
        """The largest term, or the terms tied for largest."""
        largest = max(term.seconds for term in self.terms)
        return tuple(term for term in self.terms if term.seconds == largest)


def breakdown(detect_s: float, swap_s: float, init_s: float, weights_gb: float,
              bw_rank_gbps: float, sync_s: float, sources: dict[str, str] | None = None,
              metadata_stall_s: float = math.nan) -> Breakdown:
    """The model's five terms; `sources` says which were measured and where."""
    if bw_rank_gbps <= 0 or weights_gb < 0 or min(detect_s, swap_s, init_s, sync_s) < 0:
        raise UsageError("mttr: times and sizes must be >= 0 and BW_rank_io > 0")
    sources = sources or {}

    def source(key: str) -> str:
        return sources.get(key, "assumed")

    load_source = sources.get("bw_rank_gbps", "assumed")
    weights = sources.get("weights_gb", "")
    if weights:   # whose bytes the load term moves
        load_source += "; S_weights " + (weights if weights.startswith("the run's own") else
                                         f"{format_plain(weights_gb)} GB {weights}")
    return Breakdown(terms=(
        Term("T_detect", detect_s, source("detect_s")),
        Term("T_cordon_swap", swap_s, source("swap_s")),
        Term("T_pod_init", init_s, source("init_s")),
        Term("S_weights / BW_rank_io", weights_gb / bw_rank_gbps, load_source),
        Term("T_barrier_sync", sync_s, source("sync_s")),
    ), weights_gb=weights_gb, bw_rank_gbps=bw_rank_gbps, metadata_stall_s=metadata_stall_s)


def gpu_hours_lost(total_s: float, gpus: float, checkpoint_interval_s: float = 0.0) -> float:
    """Per failure: every GPU idles for T_MTTR, plus on average half a checkpoint interval
    of work redone."""
    return gpus * (total_s + checkpoint_interval_s / 2) / 3600


@dataclass(frozen=True)
class Costs:
    """What failures cost in GPU time at the model's T_MTTR."""

    gpus: float
    checkpoint_interval_s: float
    mtbf_h: float                     # 0: no failure interval given
    lost_per_failure_h: float         # GPU-hours
    lost_per_day_h: float             # GPU-hours per day at one failure every mtbf_h; NaN


def costs(model: Breakdown, gpus: float, checkpoint_interval_s: float, mtbf_h: float) -> Costs:
    lost = gpu_hours_lost(model.total_s, gpus, checkpoint_interval_s)
    return Costs(gpus, checkpoint_interval_s, mtbf_h, lost,
                 lost * 24 / mtbf_h if mtbf_h else math.nan)


@dataclass(frozen=True)
class Interval:
    """GPU-hours per day at one checkpoint interval: saving, and failures' cost."""

    label: str                        # "Young/Daly" or "given"
    interval_s: float
    saving_h_per_day: float           # GPU-hours per day blocked in saves
    failures_h_per_day: float         # GPU-hours per day of T_MTTR and work redone

    @property
    def total_h_per_day(self) -> float:
        return self.saving_h_per_day + self.failures_h_per_day


@dataclass(frozen=True)
class Checkpointing:
    """The checkpoint's blocking cost C and what it costs per day at each interval."""

    cost_s: float                     # C: blocking time per checkpoint
    source: str                       # measured (archive, run, layout) or assumed
    young_daly_s: float               # sqrt(2 C MTBF); NaN without an MTBF
    intervals: tuple[Interval, ...]


def checkpointing(model: Breakdown, gpus: float, cost_s: float, source: str, mtbf_h: float,
                  interval_s: float) -> Checkpointing | None:
    """C, the Young/Daly interval and the GPU-hours per day at it and at `interval_s`
    (None without C: nothing to say)."""
    if cost_s <= 0:
        return None
    mtbf_s = mtbf_h * 3600
    young_daly = math.sqrt(2 * cost_s * mtbf_s) if mtbf_s else math.nan
    chosen = [("Young/Daly", young_daly)] if mtbf_s else []
    if interval_s:
        chosen.append(("given", interval_s))
    intervals = []
    for label, tau in chosen:
        saving = gpus * (86400 / tau) * cost_s / 3600
        failures = gpus * (24 / mtbf_h) * (model.total_s + tau / 2) / 3600 if mtbf_h else math.nan
        intervals.append(Interval(label, tau, saving, failures))
    return Checkpointing(cost_s, source, young_daly, tuple(intervals))


@dataclass(frozen=True)
class SparePool:
    """A warm-spare pool: how often a failure finds it empty, and what that adds."""

    label: str                        # "2%" of the nodes, or "given" ([mttr] spares)
    spares: int
    no_spare_probability: float
    added_swap_s: float               # no_spare_probability x T_cold_swap, on average


POOL_FRACTIONS = (0.02, 0.03, 0.05)


def spare_pools(nodes: float, node_failures_per_day: float, replenish_h: float,
                cold_swap_s: float, spares: int | None = None) -> list[SparePool]:
    """Pools of 2, 3 and 5% of the nodes, and the pool size given ([mttr] spares)."""
    sizes = [(f"{fraction:.0%}", max(1, round(nodes * fraction))) for fraction in POOL_FRACTIONS]
    if spares is not None:
        sizes.append(("given", spares))
    pools = []
    for label, count in sizes:
        probability = no_spare_probability(int(nodes), node_failures_per_day, count, replenish_h)
        pools.append(SparePool(label, count, probability, probability * cold_swap_s))
    return pools


def no_spare_probability(nodes: int, node_failures_per_day: float, spares: int,
                         replenish_h: float) -> float:
    """P(a failure finds the warm-spare pool empty) = P(Poisson(N r R) >= S)."""
    mean = nodes * node_failures_per_day / 24 * replenish_h
    if mean == 0:
        return 0.0 if spares > 0 else 1.0
    # Sum the tail itself (1 - the head loses everything below 1e-16 to rounding), with
    # each term from the last by ratio, in logs so that large means do not overflow.
    log_term = -mean + spares * math.log(mean) - math.lgamma(spares + 1)
    tail, k = 0.0, spares
    while True:
        term = math.exp(log_term)
        tail += term
        k += 1
        log_term += math.log(mean) - math.log(k)
        if k > mean and term < 1e-18 * max(tail, 1e-300):
            return min(tail, 1.0)


def mttr_at_target(model: Breakdown, projection: Projection, workload: Workload,
                   runs: TermRuns | None) -> Breakdown | None:
    """`model`'s T_MTTR with its load term `projection`'s time to last rank at the
    workload (S_weights its bytes per rank) and T_barrier_sync there (sync_at_target, from
    `runs`); None where it projects no time."""
    size_bytes = projection.params.bytes_per_rank
    total_s = projection.prediction.total_s
    if not (total_s > 0 and math.isfinite(total_s)) or size_bytes <= 0:
        return None
    terms = {term.name: term for term in model.terms}
    sync_s, sync_source = sync_at_target(runs, workload.ranks)
    sources = {"detect_s": terms["T_detect"].source, "swap_s": terms["T_cordon_swap"].source,
               "init_s": terms["T_pod_init"].source, "sync_s": sync_source,
               "bw_rank_gbps": f"projected: {projection.fit.layout} at {workload.ranks} ranks, "
                               f"{format_bytes(size_bytes)} per rank (stampede project)"}
    return breakdown(terms["T_detect"].seconds, terms["T_cordon_swap"].seconds,
                     terms["T_pod_init"].seconds, size_bytes / BYTES_PER_GB,
                     size_bytes / total_s / BYTES_PER_GB,
                     sync_s, sources, projection.prediction.meta_s)


def synced_at_target(model: Breakdown, runs: TermRuns | None, ranks: int) -> Breakdown:
    """`model` with its T_barrier_sync at `ranks` (sync_at_target): a way back whose load
    term is already at the target (the rejoin's and the restart's)."""
    seconds, source = sync_at_target(runs, ranks)
    return replace(model, terms=tuple(Term(term.name, seconds, source)
                                      if term.name == "T_barrier_sync" else term
                                      for term in model.terms))


BARRIER_COUNTS = 3   # distinct rank counts of startup barriers that project one, as project's


def sync_at_target(runs: TermRuns | None, ranks: int) -> tuple[float, str]:
    """T_barrier_sync at `ranks`, and its source. The straggler wait is left out: at the
    target the load term is the projected time to LAST rank, which holds it already. The
    MPI barrier is projected from `stampede startup`'s barriers at 3 or more rank counts
    as a + b log2 N (a tree's depth; b >= 0, least squares on each count's median p50);
    else it is the worked example's 10 s, assumed, saying what would measure it. A torch
    restore's process-group set-up is added as measured, at its own rank count."""
    import statistics

    by_count: dict[int, list[float]] = {}
    for row in runs.barriers if runs else ():
        by_count.setdefault(row["nranks"], []).append(row["lat_p50_s"])
    pg_init = runs.pg_init if runs else None
    if len(by_count) < BARRIER_COUNTS:
        seen = f" (startup barriers at {', '.join(map(str, sorted(by_count)))} ranks)" \
            if by_count else ""
        value, source = EXAMPLE["sync_s"], (
            f"assumed (worked example): no barrier measured at {BARRIER_COUNTS}+ rank counts to "
            f"project to {ranks}{seen}; stampede startup --np N at several N measures it")
    else:
        points = [(math.log2(count), statistics.median(values))
                  for count, values in sorted(by_count.items())]
        slope, intercept = _line(points)
        if slope < 0:   # a barrier is not faster on more ranks: the noise's flat line
            slope, intercept = 0.0, statistics.mean(y for _, y in points)
        value = max(0.0, intercept + slope * math.log2(ranks))
        source = (f"projected: MPI barrier p50 {format_seconds(intercept)} + "
                  f"{format_seconds(slope)} x log2 N from stampede startup at "
                  f"{', '.join(map(str, sorted(by_count)))} ranks")
    if pg_init is not None:
        value += pg_init["elapsed_s"]
        source += (f" + pg_init {format_seconds(pg_init['elapsed_s'])} as measured at "
                   f"{pg_init['nranks']} ranks (not projected)")
    return value, source


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through (x, y) points."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return slope, mean_y - slope * mean_x


# --- measurements from archives ---

def measured_checkpoint_cost(archive: Archive, layout: str) -> tuple[float, str]:
    """C from the latest valid save run of the archives: the blocked pseudo-op's time to
    its last rank (the layout given, else the run's least blocking layout); (0, "") when
    there is none."""
    found = _latest_blocked(archive, layout)
    if found is None:
        return 0.0, ""
    best, name = found
    buffered = " (BUFFERED: durability none)" if best["durability"] == "none" else ""
    return (best["elapsed_s"], f"measured: {name} run {best['run_id']} {best['layout']}, last of "
            f"{best['nranks']} ranks blocked, save {best['save_mode'] or '?'}{buffered}")


@dataclass(frozen=True)
class SavesAtTarget:
    """The save phase's projections at the workload, as its verdict made them
    (stampede.model.assessment.PhaseVerdict): by layout, the best there, why none."""

    projections: Mapping[str, Projection]
    best: str = ""
    why_not: str = ""


def _latest_blocked(archive: Archive, layout: str) -> tuple[Row, str] | None:
    """The latest valid save run's least blocking `blocked` row (of `layout` where given)
    and the name of the file it is in."""
    found = None
    for part in archive.parts():
        blocked = [row for row in part.rows if row["op"] == "blocked" and row["valid"]
                   and math.isfinite(row["elapsed_s"]) and (not layout or row["layout"] == layout)]
        if blocked:
            run_id = blocked[-1]["run_id"]
            found = (min((row for row in blocked if row["run_id"] == run_id),
                         key=lambda row: row["elapsed_s"]), part.name_of(blocked[-1]))
    return found


def checkpoint_cost_at_target(archive: Archive, layout: str, saves: SavesAtTarget,
                              workload: Workload) -> tuple[float, str]:
    """C at the workload, for Young/Daly at the target (the measured C is a few ranks'
    save). A sync save blocks until the save is durable: C is the save layout's projected
    time to last rank there (as `stampede project --phase save`). An async save blocks for
    its snapshot, a copy into each rank's own memory that the rank count does not enter:
    the measured snapshot scaled by the bytes per rank. Where the save is not projected,
    the measured C, saying why; (0, "") without a save run."""
    found = _latest_blocked(archive, layout)
    if found is None:
        return 0.0, ""
    best, name = found
    chosen = layout or saves.best or best["layout"]
    projection = saves.projections.get(chosen)
    if projection is None:
        why = saves.why_not or "no save projection"
        measured_s, source = measured_checkpoint_cost(archive, layout)
        return measured_s, f"{source}; as measured, not at {workload.ranks} ranks ({why})"
    if best["save_mode"] == "async":
        if chosen != best["layout"]:
            found = _latest_blocked(archive, chosen)
            assert found is not None   # the projection is of a layout the archives saved
            best, name = found
        scale = projection.params.bytes_per_rank / best["bytes_per_rank"]
        return (best["elapsed_s"] * scale,
                f"scaled: {name} run {best['run_id']} {chosen} async snapshot "
                f"{format_seconds(best['elapsed_s'])} x {format_bytes(projection.params.bytes_per_rank)}"
                f" / {format_bytes(best['bytes_per_rank'])} per rank (a copy in each rank's "
                f"memory: the rank count does not enter it)")
    from stampede.model.projection import WIDE_BAND

    low, high = projection.band
    wide = f": more than {WIDE_BAND:g}x wide, C lies anywhere between" if projection.too_wide else ""
    return (projection.prediction.total_s,
            f"projected: {chosen} save (sync: blocks until durable) at {workload.ranks} ranks, "
            f"{format_bytes(projection.params.bytes_per_rank)} per rank, band "
            f"{format_seconds(low)} - {format_seconds(high)}{wide} (stampede project --phase save)")


def measured_model(runs: TermRuns | None, inputs: Mapping[str, float] = EXAMPLE,
                   sources: Mapping[str, str] | None = None) -> tuple[Breakdown, bool]:
    """The breakdown of `inputs` (the worked example unless given; `sources` says where
    each came from) with the terms measured by the runs an Archive chose (its term_runs)
    laid over them, and whether they measured any: `stampede mttr` and the HTML verdict
    alike."""
    values, measured, stall = measured_terms(runs) if runs else ({}, {}, math.nan)
    named = dict(sources or {key: WORKED for key in inputs})
    if "weights_gb" in values and not named.get("weights_gb", WORKED).startswith(WORKED):
        del values["weights_gb"], measured["weights_gb"]   # S_weights given: the user's
    named |= measured
    return breakdown(**{**inputs, **values}, sources=named, metadata_stall_s=stall), bool(values)


def measured_terms(runs: TermRuns) -> tuple[dict[str, float], dict[str, str], float]:
    """Values and sources of the terms the chosen runs measured, and the metadata stall."""
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    stall = math.nan
    if runs.startup is not None:
        startup, name = runs.startup.row, runs.startup.name
        values["init_s"] = startup["time_to_last_rank_s"]
        sources["init_s"] = f"measured: {name} run {startup['run_id']}, last rank up"
    if runs.barrier is not None:
        barrier = runs.barrier.row
        values["barrier_s"] = barrier["lat_p50_s"]
        sources["barrier_s"] = (f"{runs.barrier.name} run {barrier['run_id']}, MPI barrier p50 "
                                f"over {barrier['nranks']} ranks")
    if runs.restore is not None:
        best, name = runs.restore.row, runs.restore.name
        run_id = best["run_id"]
        warm = " (WARM: page cache, not storage)" if best["cache"] == "warm" else ""
        values["bw_rank_gbps"] = best["slowest_rank_gbps"]
        sources["bw_rank_gbps"] = (f"measured: {name} run {run_id} {best['layout']}, slowest "
                                   f"of {best['nranks']} ranks, cache {best['cache']}{warm}")
        # "as measured" is the run's own checkpoint at the run's own scale, never the worked
        # example's 30 GB over the run's rate (a T_MTTR no run and no workload had)
        values["weights_gb"] = best["bytes_per_rank"] / BYTES_PER_GB
        sources["weights_gb"] = (f"the run's own {format_bytes(best['bytes_per_rank'])} per "
                                 f"rank at {best['nranks']} ranks")
        values["straggler_s"] = best["time_to_last_rank_s"] - best["first_done_s"]
        sources["straggler_s"] = f"{name} run {run_id} {best['layout']} straggler wait"
        stall = _time_to_first_byte(runs.sidecar, best["layout"])
        found = runs.pg_init
        if found is not None:   # the restore's own (run.exchange = torch)
            values["pg_init_s"] = found["elapsed_s"]
            sources["pg_init_s"] = (f"{name} run {found['run_id']} {found['layout']} pg_init "
                                    f"(torch.distributed process group, {found['nranks']} ranks)")
    return _sync(values, sources), sources, stall


def _sync(values: dict[str, float], sources: dict[str, str]) -> dict[str, float]:
    """T_barrier_sync from what was measured: straggler wait, barrier and process-group
    initialisation, those there are."""
    parts = [key for key in ("straggler_s", "barrier_s", "pg_init_s") if key in values]
    if parts:
        values["sync_s"] = sum(values[key] for key in parts)
        sources["sync_s"] = "measured: " + " + ".join(sources[key] for key in parts)
    return {key: value for key, value in values.items() if key in EXAMPLE}


def _time_to_first_byte(sidecar: Mapping[str, object] | None, layout: str) -> float:
    """The slowest rank's barrier -> first byte (median over iterations), from a sidecar
    (None: no sidecar, or a damaged one)."""
    import statistics

    layouts = (sidecar or {}).get("layouts") or {}
    stats = layouts.get(layout, {}).get("stats") if isinstance(layouts, dict) else None
    if not isinstance(stats, dict):
        return math.nan   # no sidecar, or a damaged one: the stall is not measured
    by_iteration: dict[float, float] = {}
    for _, iteration, _, first_byte, *_ in stats.get("timeline") or ():
        if first_byte is not None:
            by_iteration[iteration] = max(by_iteration.get(iteration, 0.0), first_byte)
    return statistics.median(by_iteration.values()) if by_iteration else math.nan
