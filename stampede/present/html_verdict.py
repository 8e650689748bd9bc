"""The HTML report's verdict (stampede.model.assessment's, handed in): the workload it
projects first, then which layout per phase and why, T_MTTR as measured and at the
workload, each restore layout at the workload, and what the storage would have to
deliver for the target recovery time. Durations and rates in units a person reads
(minutes, hours, TB/s): the CSV keeps full precision."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from stampede.present.html_tags import table, tag
from stampede.units import ALREADY_MET, format_bytes, format_duration, format_rate, format_times

if TYPE_CHECKING:
    from stampede.model.assessment import Assessment
    from stampede.model.mttr import Breakdown
    from stampede.model.rejoin import RejoinVerdict, Side
    from stampede.model.sizing import Need


def verdict_section(assessment: Assessment) -> str:
    """The answer: the workload, which layout, the projection at the target and its band,
    T_MTTR, and the sizing."""
    items = []
    for phase, verdict in assessment.phases.items():
        line = (f"<b>{phase}: use {escape(verdict.best)}</b>"
                f" (measured best: {escape(verdict.best_measured or '-')}, ranked in run "
                f"{escape(verdict.run_id)})")
        if verdict.compares:   # each layout's bytes beside its time
            line += tag("p", f"measured, best first: {escape(verdict.measured_line())}")
        if verdict.projections:
            series, projection, notes = verdict.at_target[0]
            low, high = projection.band
            bound = " (upper bound)" if projection.fit.stall_bound or projection.fit.agg_bound else ""
            said = (f"between {format_duration(low)} and {format_duration(high)} (no single "
                    "time: the band is too wide)" if verdict.too_wide else
                    f"{format_duration(projection.prediction.total_s)}{bound}")
            line += (f"; projected to {assessment.target_ranks} ranks: time to last rank "
                     f"{said}, band {format_duration(low)}–{format_duration(high)} "
                     f"({escape(projection.band_from)});"
                     f" dominant: {escape(verdict.dominant)}; fit residuals rms "
                     f"{projection.fit.rms_residual:.1%}" + tag("details", tag(
                         "summary", "how far to trust it") + tag("ul", "".join(
                             tag("li", escape(note)) for note in notes) or "<li>no note</li>")))
            why = assessment.why_not_measured_best(phase)
            if why:
                line += tag("p", f"why not the measured best: {escape(why)}", class_="note")
        else:
            line += f"; no projection: {escape(verdict.why_no_projection or 'no fit')}"
        items.append(tag("li", line))
    if assessment.mttr is not None:
        items.append(tag("li", mttr_line("T_MTTR as measured (the run's own checkpoint and "
                                         "ranks)", assessment.mttr,
                                         assessment.mttr_layout)))
    chosen = assessment.load_projection   # None exactly when mttr_at_target is
    if assessment.mttr_at_target is not None and chosen is not None:
        fit = chosen.fit
        bound = ", an upper bound" if fit.stall_bound or fit.agg_bound else ""
        items.append(tag("li", mttr_line(f"T_MTTR at {assessment.target_ranks} ranks (load term "
                                         f"projected{bound})", assessment.mttr_at_target,
                                         assessment.mttr_layout)))
    if not items and assessment.rejoin is None:
        items.append(tag("li", "no restore or save run in the archive: nothing to rank "
                               "(imported rows are shown below)"))
    workload = tag("p", f"<b>Workload at the target:</b> {escape(assessment.describe_workload())}")
    cautions = assessment.cautions()
    trust = tag("p", "<b>Read with care:</b> " + "; ".join(map(escape, cautions)),
                class_="trust") if cautions else ""
    return tag("section", tag("h2", "Verdict") + trust + workload
               + (tag("ul", "".join(items)) if items else "") + rejoin_section(assessment.rejoin)
               + at_target_table(assessment) + sizing_table(assessment), class_="verdict",
               id="verdict")


def rejoin_section(verdict: RejoinVerdict | None) -> str:
    """A `stampede rejoin` run (stampede.model.rejoin): T_MTTR of the rejoin and of the
    full restart side by side, as measured and at the workload, what dominates, the
    bytes from each tier, the falls back to storage, what the run noted."""
    if verdict is None:
        return ""
    run, ranks = verdict.run, verdict.workload.ranks
    body = []
    for measured, target in zip(verdict.measured, verdict.at_target):
        body.append([target.layout, _total(measured), _total(target), target.load,
                     target.term("T_pod_init"), target.term("T_barrier_sync"),
                     target.dominant or target.why_not])
    terms = [tag("li", mttr_line(f"{side.layout} at {ranks} ranks", side.model, side.layout))
             for side in verdict.at_target if side.model]
    tiers = list(dict.fromkeys(tier for used in run.tier_bytes.values() for tier in used))
    by_tier = [[layout, *(format_bytes(used.get(tier, 0)) if used.get(tier) else "-"
                          for tier in tiers)] for layout, used in run.tier_bytes.items()]
    fallback = [tag("li", escape(note)) for note in verdict.run.fallback]
    noted = [tag("li", f"<b>{escape(layout)}</b>: {escape(note)}")
             for layout, notes in run.notes.items() for note in notes]
    return (tag("h3", "A node lost: rejoin from the tiers beside a full restart from storage")
            + tag("p", escape(verdict.describe()), class_="note")
            + table(("restore", f"T_MTTR as measured ({run.nranks} ranks)",
                     f"T_MTTR at {ranks} ranks", "load term there",
                     "T_pod_init (rejoin: the spares')",
                     "T_barrier_sync", "dominant there"), body)
            + tag("ul", "".join(terms))
            + tag("h3", "Bytes restored from each tier (last iteration)")
            + table(("restore", *tiers), by_tier)
            + (tag("p", "<b>Fell back to storage:</b>") + tag("ul", "".join(fallback)) if fallback
               else tag("p", "no fall-back to storage: every spare's shard came from a peer",
                        class_="note"))
            + tag("details", tag("summary", "what the run noted") + tag("ul", "".join(noted))))


def _total(side: Side) -> str:
    return format_duration(side.model.total_s) if side.model else "not possible"


def mttr_line(title: str, model: Breakdown, layout: str) -> str:
    dominant = ", ".join(term.name for term in model.dominant)
    terms = "; ".join(f"{escape(term.name)} {format_duration(term.seconds)} "
                      f"({term.source.split(':')[0].split(' (')[0]})" for term in model.terms)
    return (f"<b>{escape(title)}: {format_duration(model.total_s)}</b> ({escape(layout)}), "
            f"dominant term <b>{escape(dominant)}</b>"
            + tag("details", tag("summary", "terms") + escape(terms)))


def at_target_table(assessment: Assessment) -> str:
    """Each projected restore layout at the workload (`stampede project`'s numbers), with
    T_MTTR when it is the load term."""
    if not assessment.restore_at_target:
        return ""
    body = []
    for item in assessment.restore_at_target:
        prediction, (low, high) = item.projection.prediction, item.projection.band
        body.append([item.layout, format_duration(prediction.total_s),
                     f"{format_duration(low)}–{format_duration(high)}",
                     format_duration(prediction.meta_s), format_duration(prediction.data_s),
                     format_duration(prediction.fixed_s), prediction.bound_by,
                     format_duration(item.mttr.total_s)])
    return (tag("h3", f"Restore at the target, per layout ({assessment.target_ranks} ranks)")
            + table(("layout", "last rank", "band", "metadata stall", "data", "outside the ops",
                     "bound by", "T_MTTR"), body))


def sizing_table(assessment: Assessment) -> str:
    """What each restore layout needs for T_MTTR within the target (stampede.model.sizing),
    against what the runs fitted."""
    rows = assessment.restore_at_target
    if not rows:
        return ""
    resources = list(dict.fromkeys(need.resource for item in rows for need in item.sizing.needs))
    body = []
    for item in rows:
        sizing = item.sizing
        if sizing.allowed_s <= 0:
            body.append([item.layout, "none: the other terms alone exceed it",
                         *["-"] * len(resources)])
            continue
        needs = {need.resource: need for need in sizing.needs}
        body.append([item.layout, format_duration(sizing.allowed_s),
                     *[need_cell(needs[name]) if name in needs else "-" for name in resources]])
    return (tag("h3", f"What the storage must deliver for T_MTTR ≤ "
                      f"{format_duration(assessment.target_mttr_s)}")
            + tag("p", "each resource alone, the others as fitted; 'have' is the fit's value "
                       "(unlimited: no run reached a limit of it)", class_="note")
            + table(("layout", "last rank may take", *resources), body))


def need_cell(need: Need) -> str:
    if not need.reachable:
        return "not enough alone"
    if need.needed == 0:
        return "any"
    have = format_rate(need.fitted, need.unit)
    times = format_times(need.ratio)
    said = "" if not times else f", {times}" if times == ALREADY_MET else f", {times} it"
    return f"{format_rate(need.needed, need.unit)} (have {have}{said})"
