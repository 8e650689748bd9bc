"""What the models say, rendered: `stampede compare` (ratios and verdicts), `stampede mttr`
(the recovery-time breakdown, its cost, the spare pools) and `stampede project` (the
fitted contention model and its projection). Values come computed; this only formats."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from stampede.present.tables import ItemColumn, Verbatim, item_table
from stampede.units import (
    BYTES_PER_GB,
    format_bytes,
    format_duration,
    format_in,
    format_number,
    format_plain,
    format_probability,
    format_rate,
    format_seconds,
    seconds_unit,
)

if TYPE_CHECKING:
    from rich.console import Console

    from stampede.model.fit import Point
    from stampede.model.mttr import Breakdown, Checkpointing, Costs, Interval, SparePool, Term
    from stampede.model.projection import Projection
    from stampede.model.rejoin import RejoinVerdict
    from stampede.model.rejoin import Side as RejoinSide
    from stampede.model.series import Series
    from stampede.model.traffic import LayoutBytes
    from stampede.model.workload import Workload
    from stampede.results.compare import Comparison, Side


def render_comparison(title: str, comparisons: Sequence[Comparison], console: Console) -> None:
    """`stampede compare`: one line per (configuration, metric): each side's median over
    its runs, under it n with the range of the runs' values and of their iterations; B / A
    of the medians; the verdict."""
    # the phase (restore, save) only where both are compared: a cycle's archive
    phased = len({dict(comparison.key).get("phase", "") for comparison in comparisons}) > 1
    console.print(item_table(f"{title}: B / A of the medians over each side's runs",
                             ((PHASE,) if phased else ()) + COMPARISON, comparisons))
    console.print("[dim]A, B: the median over the side's runs (each run's value: its median over "
                  "iterations); n: runs, with the min-max of their values; it.: the lowest to the "
                  "highest iteration of any run. within spread = the two sides' ranges of runs "
                  "overlap (n >= 2 on both sides). (n=1): a side has one run, so how much runs "
                  "differ is unknown: the verdict rests on the iteration ranges, or where there "
                  "are none (p99) on direction only ('?'; 'similar?' under 5%).[/]")


def _keyed(column: str, missing: str) -> Callable[[Comparison], str]:
    """A value of the configuration compared; `missing` where the comparison spans them."""
    return lambda comparison: dict(comparison.key).get(column, missing)


def _sides(pick: Callable[[Comparison], Side]) -> Callable[[Comparison], str]:
    """A side's cell (A or B): a duration metric's in its unit, another's as a number."""
    def cell(comparison: Comparison) -> str:
        metric = comparison.metric
        return _side_cell(pick(comparison), metric.endswith("_s") and not metric.endswith("_per_s"))
    return cell


def _verdict(comparison: Comparison) -> str:
    word = comparison.verdict.split("?")[0].split(" (")[0]
    colour = {"better": "green", "worse": "red"}.get(word, "dim")
    return f"[{colour}]{comparison.verdict.replace(' (n=1)', chr(10) + '(n=1)')}[/]"


PHASE: ItemColumn[Comparison] = ItemColumn("phase", _keyed("phase", "*"), left=True)
COMPARISON: tuple[ItemColumn[Comparison], ...] = (
    ItemColumn("layout", _keyed("layout", "*"), left=True),
    ItemColumn("op", _keyed("op", ""), left=True), ItemColumn("ranks", _keyed("nranks", "")),
    ItemColumn("cache", _keyed("cache", "*"), left=True),
    ItemColumn("metric", lambda comparison: comparison.metric, left=True),
    ItemColumn("A", _sides(lambda comparison: comparison.base)),
    ItemColumn("B", _sides(lambda comparison: comparison.other)),
    ItemColumn("B / A", lambda comparison: f"{comparison.ratio:.3f}"),
    ItemColumn("verdict", _verdict, left=True))


def _side_cell(side: Side, seconds: bool) -> str:
    """A side's median; under it n and its runs' range; then its iterations' range."""
    shown = format_seconds(side.median) if seconds else format_number(side.median)
    runs = f" {_range(side.low, side.high, seconds)}" if side.n > 1 else ""
    iterations = (f"\nit. {_range(side.iteration_low, side.iteration_high, seconds)}"
                  if side.has_iteration_range else "")
    return f"{shown}\nn={side.n}{runs}{iterations}"


def _range(low: float, high: float, seconds: bool) -> str:
    """low–high, durations in the unit of the higher one."""
    if not seconds:
        return f"{format_number(low)}–{format_number(high)}"
    unit, factor = seconds_unit(high)
    return f"{format_in(low, factor)}–{format_in(high, factor)} {unit}"


def render_mttr(model: Breakdown, costs: Costs, pools: Sequence[SparePool], pool_context: str,
                console: Console, saving: Checkpointing | None = None) -> None:
    """`stampede mttr`: the breakdown, which term dominates, what it costs, what
    checkpointing costs (`saving`, when C is known), spares."""
    dominant = model.dominant
    terms: tuple[ItemColumn[Term], ...] = (
        ItemColumn("term", lambda term: f"[bold]{term.name}[/]" if term in dominant else term.name,
                   left=True),
        ItemColumn("time", lambda term: format_duration(term.seconds)),
        ItemColumn("share", lambda term: f"{term.seconds / model.total_s:.0%}"),
        ItemColumn("source", lambda term: ("[green]" if term.measured else "[dim]") + term.source
                   + "[/]", left=True))
    lines: list[Term | Verbatim] = [*model.terms, Verbatim(
        ("[bold]T_MTTR[/]", f"[bold]{format_duration(model.total_s)}[/]", "100%"))]
    console.print(item_table("T_MTTR = T_detect + T_cordon_swap + T_pod_init + "
                             "S_weights/BW_rank_io + T_barrier_sync", terms, lines))
    console.print(f"load term: {format_bytes(model.weights_gb * BYTES_PER_GB)} / "
                  f"{format_rate(model.bw_rank_gbps * BYTES_PER_GB, 'B/s')} per rank; "
                  f"dominant term{'s (tied)' if len(dominant) > 1 else ''}: "
                  f"[bold]{', '.join(term.name for term in dominant)}[/]")
    if math.isfinite(model.metadata_stall_s):
        console.print(f"of the measured restore, the slowest rank waited "
                      f"{format_seconds(model.metadata_stall_s)} for its first byte (metadata)")
    render_costs({"": costs}, pools, pool_context, console, saving)


def render_costs(costs: Mapping[str, Costs], pools: Sequence[SparePool], pool_context: str,
                 console: Console, saving: Checkpointing | None = None,
                 priced_way: str = "") -> None:
    """GPU-hours lost per failure (by way back, where there are several), checkpointing
    (its failures priced with `priced_way`'s T_MTTR where there are several), the hot
    spares."""
    first = next(iter(costs.values()))
    each = "; ".join(f"{name + ' ' if name else ''}{format_plain(cost.lost_per_failure_h)}"
                     + (f" ({format_plain(cost.lost_per_day_h)} per day at one failure every "
                        f"{format_plain(cost.mtbf_h)} h)" if cost.mtbf_h else "")
                     for name, cost in costs.items())
    console.print(f"GPU-hours lost per failure at {format_plain(first.gpus)} GPUs: {each}"
                  + (f" (incl. half a {format_plain(first.checkpoint_interval_s)} s checkpoint "
                     "interval redone)" if first.checkpoint_interval_s else ""))
    if saving is not None:
        _render_checkpointing(saving, first.gpus, console, priced_way)
    console.print(item_table(f"Hot spares: {pool_context}", SPARES, pools))


SPARES: tuple[ItemColumn[SparePool], ...] = (
    ItemColumn("pool", lambda pool: pool.label),
    ItemColumn("spares", lambda pool: str(pool.spares)),
    ItemColumn("P(no warm spare)", lambda pool: format_probability(pool.no_spare_probability)),
    ItemColumn("adds to T_cordon_swap", lambda pool: format_seconds(pool.added_swap_s)
               if pool.added_swap_s >= 1e-6 else "< 1 µs"))


def render_rejoin(verdict: RejoinVerdict, console: Console) -> None:
    """`stampede mttr` and `project` on a `stampede rejoin` archive (stampede.model.rejoin):
    one T_MTTR per way back (rejoin, restart), term by term at the workload, and as the
    run measured it; where each term came from; the rates with the op that measured each."""
    ranks = verdict.workload.ranks
    rejoin, restart = verdict.at_target
    rows: list[tuple[str, str, str]] = [
        (name, rejoin.term(name), restart.term(name))
        for name in ("T_detect", "T_cordon_swap", "T_pod_init")]
    rows.append(("load", rejoin.load, restart.load))
    rows.append(("T_barrier_sync", rejoin.term("T_barrier_sync"), restart.term("T_barrier_sync")))
    def total(side: RejoinSide, bold: bool) -> str:
        if side.model is None:
            return f"not possible: {side.why_not}" if bold else "-"
        return f"[bold]{format_duration(side.model.total_s)}[/]" if bold else \
            format_duration(side.model.total_s)
    rows.append((f"[bold]T_MTTR at {ranks} ranks[/]", total(rejoin, True), total(restart, True)))
    rows.append((f"T_MTTR as measured ({verdict.run.nranks} ranks)",
                 total(verdict.measured[0], False), total(verdict.measured[1], False)))
    rows.append(("dominant there", rejoin.dominant or "-", restart.dominant or "-"))
    columns: tuple[ItemColumn[tuple[str, str, str]], ...] = (
        ItemColumn("term", lambda row: row[0], left=True),
        ItemColumn("rejoin", lambda row: row[1], left=True),
        ItemColumn("restart", lambda row: row[2], left=True))
    console.print(item_table("A node lost: rejoin from the tiers (stampede rejoin) beside a full "
                             "restart from storage, one T_MTTR each", columns, rows))
    console.print(verdict.describe(), markup=False)
    said: dict[str, list[str]] = {}
    for side in verdict.at_target:
        for term in side.model.terms if side.model else ():
            said.setdefault(f"{term.name}: {term.source}", []).append(side.layout)
    for line, ways in said.items():
        console.print(f"  {' and '.join(ways)} {line}", markup=False, highlight=False)
    for note in verdict.run.fallback:
        console.print(f"fell back to storage: {note}", markup=False)


def _render_checkpointing(saving: Checkpointing, gpus: float, console: Console,
                          priced_way: str = "") -> None:
    """C, the Young/Daly interval, and GPU-hours per day saving and lost at each interval
    (T_MTTR `priced_way`'s, where an archive has several ways back)."""
    console.print(f"checkpoint: C = {format_seconds(saving.cost_s)} blocking per save "
                  f"([{'green' if saving.source.startswith('measured') else 'dim'}]"
                  f"{saving.source}[/])")
    if not saving.intervals:
        console.print("  give --mtbf-h (the Young/Daly interval) or --checkpoint-interval-s "
                      "to price it")
        return
    console.print(item_table(f"Checkpointing at {format_plain(gpus)} GPUs: GPU-hours per day",
                             INTERVALS, saving.intervals))
    if math.isfinite(saving.young_daly_s):
        console.print("[dim]Young/Daly: tau = sqrt(2 C MTBF); saving = GPUs x 86,400/tau x C; "
                      "failures = GPUs x 24/MTBF_h x (T_MTTR + tau/2)"
                      + (f", T_MTTR the {priced_way}'s" if priced_way else "") + "[/]")


def _priced(interval: Interval) -> bool:
    """Whether the failures are priced (an MTBF given)."""
    return math.isfinite(interval.failures_h_per_day)


INTERVALS: tuple[ItemColumn[Interval], ...] = (
    ItemColumn("interval", lambda interval: interval.label, left=True),
    ItemColumn("every", lambda interval: format_duration(interval.interval_s)),
    ItemColumn("saving", lambda interval: format_plain(interval.saving_h_per_day)),
    ItemColumn("failures", lambda interval: format_plain(interval.failures_h_per_day)
               if _priced(interval) else "- (no --mtbf-h)"),
    ItemColumn("total", lambda interval: format_plain(interval.total_h_per_day)
               if _priced(interval) else "-"))


def _gbps(rate: float) -> str:
    if math.isinf(rate):
        return "unlimited"
    # below 1 MB/s in bytes per second, never in e-notation (2.5e-09 GB/s once)
    return f"{format_in(rate, BYTES_PER_GB)} GB/s" if rate >= 1e6 else format_rate(rate, "B/s")


def render_projection(projections: Sequence[tuple[Series, Projection, list[str]]], workload: Workload,
                      archives: Sequence[str], given: Sequence[str], console: Console,
                      what: str = "the restore: time to last rank",
                      served: tuple[str, Sequence[LayoutBytes]] | None = None) -> None:
    """`stampede project`: per layout (series, projection, notes), the fit and where it
    leads at the workload (stampede.model.workload); `given` names the parameters held
    fixed, `what` the phase projected; `served`: (where, every layout's bytes from
    storage there), a restore's."""
    nranks = workload.ranks
    console.print(f"stampede project: {what}; {len(projections)} layout(s) from "
                  f"{', '.join(archives)}, projected to {nranks} ranks")
    console.print("workload: " + workload.describe_projected(
        [projection for _, projection, _ in projections]), markup=False)
    console.print("model: T_meta = max(k (RTT + s), RTT + s N k / c_eff)  (stampede project "
                  "--help)\n       T_data = b max(storage / B_agg, node / B_node, rank / "
                  "min(B_client, B_net)) + b exchange / B_node\n       time to last rank = "
                  "F + T_meta + T_data  (F: the last rank's time outside its timed ops, "
                  "measured)\n")
    for series, projection, notes in projections:
        _render_layout(series, projection, notes, nranks, given, console)
    if len(projections) > 1:
        ranked = sorted(projections, key=lambda item: item[1].prediction.total_s)
        console.print(f"ranked at {nranks} ranks: " + ", ".join(
            f"{series.layout} {format_duration(projection.prediction.total_s)}"
            for series, projection, _ in ranked))
        for series, projection, _ in ranked:
            console.print(f"  {series.layout}: bound by {projection.prediction.bound_by}")
    if served is not None:
        from stampede.present.report_plan import render_served

        best = min(projections, key=lambda item: item[1].prediction.total_s)
        params, fit = best[1].params, best[1].fit
        console.print()
        render_served(served[1], served[0], console,
                      (best[0].layout, params.agg_bps,
                       params.node_bps if fit.node_measured else math.inf))


def _render_layout(series: Series, projection: Projection, notes: Sequence[str], nranks: int,
                   given: Sequence[str], console: Console) -> None:
    fit, prediction, params = projection.fit, projection.prediction, projection.fit.params
    threads = format_plain(params.threads)
    if projection.serialised:
        threads = f"1 (c_eff: {series.serialised_by})"
    elif series.serialised_by:
        threads += f" (c_eff = min(c, {series.serialised_by}))"
    console.print(f"layout {series.layout}  [{series.context}]", markup=False)
    node = f", B_node {_gbps(params.node_bps)}" if fit.node_measured else ""
    console.print(f"  fitted: RTT {format_seconds(params.rtt_s)}, s "
                  f"{format_seconds(params.service_s)}, c {threads}, B_agg {_gbps(params.agg_bps)}"
                  f", B_client {_gbps(params.client_bps)}{node}"
                  + (f"  (given: {', '.join(given)})" if given else ""))
    console.print(item_table("", FITTED, map(Fitted, fit.points, fit.meta_measured_s,
                                             fit.meta_model_s, fit.last_model_s, fit.residuals,
                                             fit.limits)))
    console.print(f"  residuals (measured - model) / measured: rms {fit.rms_residual:.1%}, max "
                  f"{fit.max_residual:.1%}; metadata saturated at "
                  f"{', '.join(map(str, fit.saturated)) or 'no measured rank count'}; B_agg "
                  f"limits at {', '.join(map(str, fit.agg_limited)) or 'no measured rank count'}")
    low, high = projection.band
    bound = fit.stall_bound or fit.agg_bound or fit.node_bound
    where = (f" ({prediction.nnodes} nodes of {projection.params.ranks_per_node})"
             if prediction.nnodes > 1 else "")
    console.print(f"  at {nranks} ranks{where}: time to last rank "
                  f"{format_duration(prediction.total_s)}{' (upper bound)' if bound else ''}, band "
                  f"{format_duration(low)} - {format_duration(high)} ({projection.band_from})")
    meta_low, meta_high = projection.meta_band
    meta_band = (f", band {format_seconds(meta_low)} - {format_seconds(meta_high)}"
                 if meta_high > meta_low else "")
    k = projection.params.ops_per_rank
    drain = (f"more than the server keeps up with: drained at {projection.drain_ops_per_s:,.0f} "
             "ops/s (c_eff / s)" if prediction.saturated else "within the server's capacity")
    console.print(f"    metadata stall {format_seconds(prediction.meta_s)}"
                  f"{' (upper bound)' if fit.stall_bound else ''}{meta_band}: k = {format_plain(k)} op(s) "
                  f"per rank, a burst of {prediction.nranks * k:,.0f} ops, {drain}")
    size = projection.params.bytes_per_rank
    exchange = (f", then {format_seconds(prediction.exchange_s)} exchanging between nodes "
                "through B_node" if prediction.exchange_s > 0 else "")
    console.print(f"    data {format_duration(prediction.data_s)}: {format_bytes(size)} per rank "
                  f"{'written' if series.phase == 'save' else 'read'} at "
                  f"{_gbps(prediction.rate_bps)}, limited by {prediction.limit}{exchange}"
                  if size > 0 else "    data: no bytes")
    from stampede.model.projection import nearest_run

    measured = [p for p in fit.points if p.outside_s > 0]
    console.print(f"    outside the timed ops (F) {format_seconds(prediction.fixed_s)}: the last "
                  "rank's barrier exit and time between its ops, as measured at "
                  f"{nearest_run(fit.points, nranks).nranks} ranks" if measured else
                  "    outside the timed ops (F): not measured (no sidecar timeline), taken as 0")
    console.print(f"    bound by {prediction.bound_by}")
    for note in notes:
        console.print(f"  note: {note}", markup=False)
    console.print()


class Fitted(NamedTuple):
    """A measured point of a fit beside what the fitted model says of it."""

    point: Point
    stall_s: float                    # measured, of one rank that issues the ops
    stall_model_s: float
    last_model_s: float
    residual: float                   # (measured - model) / measured
    limit: str                        # what limits its data


FITTED: tuple[ItemColumn[Fitted], ...] = (
    ItemColumn("ranks", lambda fitted: str(fitted.point.nranks)),
    ItemColumn("nodes", lambda fitted: str(fitted.point.nnodes)),
    ItemColumn("k", lambda fitted: format_plain(fitted.point.ops_per_rank)),
    ItemColumn("stall meas", lambda fitted: format_seconds(fitted.stall_s)),
    ItemColumn("stall model", lambda fitted: format_seconds(fitted.stall_model_s)),
    ItemColumn("F meas", lambda fitted: format_seconds(fitted.point.outside_s)),
    ItemColumn("last rank meas", lambda fitted: format_seconds(fitted.point.last_s)),
    ItemColumn("model", lambda fitted: format_seconds(fitted.last_model_s)),
    ItemColumn("residual", lambda fitted: f"{fitted.residual:+.1%}"),
    ItemColumn("data limited by", lambda fitted: fitted.limit
               if fitted.point.bytes_per_rank > 0 else "-"))
