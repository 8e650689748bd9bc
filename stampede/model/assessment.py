"""What an archive says, in one verdict (`stampede report --html`, `stampede assess`), for one
workload at the target (stampede.model.workload): per phase the layouts of the latest run
ranked by time to last rank (the report's ranking), the contention model fitted and
projected to the workload where the archive holds three or more rank counts (`stampede
project`'s fit, with no parameter known), the recovery time T_MTTR as measured (`stampede
mttr ARCHIVE --layout L`) and, per restore layout, T_MTTR at the workload: its load term
that layout's projected time to last rank (S_weights = the workload's bytes per rank),
and what the storage would have to deliver for it to fit a target time
(stampede.model.sizing). One projection per layout behind every number at the target,
the one `stampede project` prints. Pure: it takes an opened Archive
(stampede.results.archived); nothing is read, written or launched here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stampede.errors import UsageError
from stampede.model.contention import METADATA_OPS, SAVE_METADATA_OPS
from stampede.model.mttr import Breakdown, SavesAtTarget, measured_model, mttr_at_target
from stampede.model.rejoin import RejoinVerdict, rejoin_verdict
from stampede.model.sizing import DEFAULT_TARGET_MTTR_S, Need, Sizing, size
from stampede.model.workload import Workload
from stampede.results import compare
from stampede.results.ceiling import efficiency_text
from stampede.results.cells import Row
from stampede.units import (
    ALREADY_MET,
    format_amplification,
    format_duration,
    format_rate,
    format_times,
)

if TYPE_CHECKING:
    from stampede.model.projection import Projection
    from stampede.model.series import Series, Sidecars
    from stampede.results.archived import Archive, TermRuns

PHASE_OPS = {"restore": METADATA_OPS, "save": SAVE_METADATA_OPS}


@dataclass(frozen=True)
class PhaseVerdict:
    """One phase (restore or save) of an archive."""

    phase: str
    run_id: str                                  # the latest run holding the phase
    ranked: tuple[tuple[Row, str], ...]   # (completion row, standing), best first
    projections: tuple[tuple[Series, Projection, tuple[str, ...]], ...] = ()   # (Series, Projection, notes)
    why_no_projection: str = ""

    @property
    def best_measured(self) -> str:
        return self.ranked[0][0]["layout"] if self.ranked else ""

    @property
    def compares(self) -> bool:
        """Whether the latest run ranked two layouts or more (not one layout's two rows)."""
        return len({row["layout"] for row, _ in self.ranked}) > 1

    def measured_line(self) -> str:
        """The latest run's layouts, best first, each with its time to last rank and, for a
        restore, its read amplification beside it ("whole-file 1.2 s, 4.0x the needed
        bytes"): the bytes a layout fetched, seen beside the time they cost; and where
        run.ceiling measured one, its efficiency against the nodes' raw-read ceiling
        (", 0.93x the raw-read ceiling"): how near raw reads it came."""
        said = []
        for row, _ in self.ranked:
            seconds = row.get("time_to_last_rank_s")
            text = f"{row['layout']} " + (format_duration(float(seconds))
                                          if isinstance(seconds, (int, float)) else "-")
            ratio = row.get("read_amplification")
            if isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0:
                text += f", {format_amplification(float(ratio))} the needed bytes"
            efficiency = row.get("ceiling_efficiency")
            share = efficiency_text(float(efficiency)) \
                if isinstance(efficiency, (int, float)) else ""
            if share:
                text += f", {share} the raw-read ceiling"
            said.append(text)
        return "; ".join(said)

    @property
    def at_target(self) -> tuple[tuple[Series, Projection, tuple[str, ...]], ...]:
        """The projections ranked by projected time to last rank, as `stampede project`."""
        return tuple(sorted(self.projections, key=lambda item: item[1].prediction.total_s))

    @property
    def dominant(self) -> str:
        """What dominates the best layout's projected time to last rank ("" unprojected)."""
        return dominant_part(self.at_target[0][1]) if self.projections else ""

    @property
    def best(self) -> str:
        """The layout to use: the fastest at the target where projected, else as measured."""
        return self.at_target[0][0].layout if self.projections else self.best_measured

    @property
    def saves_at_target(self) -> SavesAtTarget:
        """The projections by layout, the best and why none: what prices C at the target."""
        return SavesAtTarget({series.layout: projection for series, projection, _ in
                              self.projections}, self.best, self.why_no_projection)

    @property
    def band_spread(self) -> float:
        """How many times the best layout's band's high end is its low end (1: unprojected)."""
        return self.at_target[0][1].band_spread if self.projections else 1.0

    @property
    def too_wide(self) -> bool:
        """The best layout's band spans more than WIDE_BAND (stampede.model.projection)."""
        return bool(self.projections) and self.at_target[0][1].too_wide

    @property
    def page_cache(self) -> bool:
        """The latest run's restores read with cache warm: the page cache answered."""
        return self.phase == "restore" and any(row["cache"] == "warm" for row, _ in self.ranked)


@dataclass(frozen=True)
class AtTarget:
    """One restore layout at the workload: its projection, T_MTTR with that projection as
    the load term, and what the storage must deliver for the target time."""

    layout: str
    projection: Projection
    mttr: Breakdown
    sizing: Sizing


@dataclass(frozen=True)
class Assessment:
    workload: Workload
    phases: dict[str, PhaseVerdict] = field(default_factory=dict)
    mttr: Breakdown | None = None                # as `stampede mttr ARCHIVE --layout best`
    mttr_layout: str = ""
    restore_at_target: tuple[AtTarget, ...] = ()  # ranked by T_MTTR at the workload
    target_mttr_s: float = DEFAULT_TARGET_MTTR_S
    rejoin: RejoinVerdict | None = None          # a `stampede rejoin` run: both ways back

    @property
    def target_ranks(self) -> int:
        return self.workload.ranks

    @property
    def chosen(self) -> AtTarget | None:
        """The verdict's restore layout at the workload."""
        return next((item for item in self.restore_at_target
                     if item.layout == self.mttr_layout), None)

    @property
    def mttr_at_target(self) -> Breakdown | None:
        return self.chosen.mttr if self.chosen else None

    @property
    def load_projection(self) -> Projection | None:
        return self.chosen.projection if self.chosen else None

    def describe_workload(self) -> str:
        """The workload's line, its ranks per node and bytes per rank as projected."""
        return self.workload.describe_projected(
            [item[1] for verdict in self.phases.values() for item in verdict.projections])

    def cautions(self) -> list[str]:
        """What the reader must know before any number: a measurement of the page cache,
        a band too wide for one answer, the T_MTTR terms assumed rather than measured."""
        said = []
        for phase, verdict in self.phases.items():
            if verdict.page_cache:
                said.append(f"{phase} measured with cache warm: the page cache answered, not "
                            "the storage (run.cache = cold measures it)")
            if verdict.too_wide:
                low, high = verdict.at_target[0][1].band
                said.append(f"{phase} at {self.target_ranks} ranks: the band spans "
                            f"{format_times(verdict.band_spread, 'x')} ({format_duration(low)} "
                            f"to {format_duration(high)}): no single time is the answer")
        model = self.mttr_at_target or self.mttr
        assumed = ([term.name for term in model.terms if term.source.startswith("assumed")]
                   if model is not None else [])
        if assumed:
            said.append("T_MTTR terms assumed, not measured: " + ", ".join(assumed))
        return said

    def summary(self) -> list[str]:
        """The verdict in a few terminal lines: the workload, what to read it with, the
        layout per phase, T_MTTR at the workload and the chosen layout's sizing."""
        lines = [f"workload: {self.describe_workload()}"]
        lines += [f"read with care: {caution}" for caution in self.cautions()]
        for phase, verdict in self.phases.items():
            line = f"{phase}: use {verdict.best} (measured best: {verdict.best_measured or '-'})"
            if verdict.projections:
                projection = verdict.at_target[0][1]
                low, high = projection.band
                said = (f"between {format_duration(low)} and {format_duration(high)}"
                        if verdict.too_wide else
                        format_duration(projection.prediction.total_s))
                line += (f"; at {self.target_ranks} ranks: time to last rank {said}, "
                         f"dominant: {verdict.dominant}")
            why = self.why_not_measured_best(phase)
            lines.append(line + (f"\n    why not {verdict.best_measured}: {why}" if why else ""))
            if verdict.compares:
                lines.append(f"    measured, best first: {verdict.measured_line()}")
        chosen = self.chosen
        if chosen is not None:
            lines.append(f"T_MTTR at {self.target_ranks} ranks ({chosen.layout}): "
                         f"{format_duration(chosen.mttr.total_s)}")
            needs = [f"{need.resource} {format_rate(need.needed, need.unit)}"
                     + _against_fit(need) for need in chosen.sizing.needs
                     if need.reachable and need.needed > 0]
            if chosen.sizing.allowed_s <= 0:
                needs = ["nothing can: the other terms alone exceed it"]
            lines.append(f"for T_MTTR <= {format_duration(self.target_mttr_s)}, each alone: "
                         + ("; ".join(needs) or "no single resource suffices"))
        return lines + (self.rejoin.summary() if self.rejoin else [])

    def why_not_measured_best(self, phase: str) -> str:
        """One sentence when the layout to use is not the one measured fastest."""
        verdict = self.phases.get(phase)
        if verdict is None or not verdict.projections or verdict.best == verdict.best_measured:
            return ""
        by_layout = {item[0].layout: item[1] for item in verdict.projections}
        measured, best = by_layout.get(verdict.best_measured), by_layout[verdict.best]
        if measured is None:
            return (f"{verdict.best_measured} was fastest as measured but has no projection; "
                    f"{verdict.best} is the fastest projected")
        ranks = max(point.nranks for point in measured.fit.points)
        return (f"{verdict.best_measured} is faster at {ranks} ranks, but at "
                f"{measured.prediction.nranks} it is bound by {measured.prediction.bound_by} "
                f"({format_duration(measured.prediction.total_s)} against {verdict.best}'s "
                f"{format_duration(best.prediction.total_s)})")


def _against_fit(need: Need) -> str:
    """ (12.9x the fitted 3.09 GB/s), (already met: the fitted 8.36 GB/s), or nothing."""
    times, fitted = format_times(need.ratio, "x"), format_rate(need.fitted, need.unit)
    if not times:
        return ""
    said = f"{times}:" if times == ALREADY_MET else times
    return f" ({said} the fitted {fitted})"


def dominant_part(projection: Projection) -> str:
    """Which term of the projected time to last rank dominates, in words."""
    prediction = projection.prediction
    # the reads' own requests at the metadata server are its time, not the data's (as
    # Prediction.bound_by counts them)
    metadata_s = prediction.meta_s + prediction.read_meta_s
    if prediction.fixed_s > max(metadata_s, prediction.data_s - prediction.read_meta_s):
        return "the time outside the timed ops (F: barrier exit, Python between ops)"
    if metadata_s >= prediction.data_s - prediction.read_meta_s:
        return "metadata stall" + (" (the burst saturates the server)"
                                   if prediction.saturated else "")
    return f"data (limited by {prediction.limit})"


def ranked(rows: Sequence[Row], op: str) -> tuple[tuple[Row, str], ...]:
    """The valid completion rows of one run, best first, with their standing against the
    best (the report's ranking)."""
    return tuple((row, standing) for row, standing in compare.ranked(rows, op)
                 if row["valid"])


def phase_verdict(rows: Sequence[Row], phase: str, workload: Workload,
                  sidecars: Sidecars | None = None) -> PhaseVerdict | None:
    """The latest run's ranking and the projections of one phase at the workload (as
    `stampede project --target-ranks N --target-ranks-per-node K --target-bytes-per-rank B`);
    None without such runs. `sidecars` (run id: its sidecar) as series_from_rows'."""
    from stampede.model.fit import Known
    from stampede.model.projection import project, scale_for
    from stampede.model.series import projection_notes, row_phase, series_from_rows

    mine = [row for row in rows if row.get("op") == phase and row_phase(row) == phase]
    if not mine:
        return None
    run_id = mine[-1]["run_id"]
    ranking = ranked([row for row in rows if row["run_id"] == run_id], phase)
    projections, why = [], ""
    for item in series_from_rows(list(rows), (), PHASE_OPS[phase], phase, sidecars):
        try:
            scale = scale_for(item, workload.ranks, workload.ranks_per_node,
                              bytes_per_rank=workload.bytes_per_rank)
            projection = project(item.points, item.layout, scale, Known(), item.per_rank_size,
                                 locks=item.locks, phase=phase)
        except UsageError as error:
            why = error.message
            continue
        notes = projection_notes(item, projection, workload.ranks, Known())
        projections.append((item, projection, tuple(notes)))
    return PhaseVerdict(phase, run_id, ranking, tuple(projections), "" if projections else why)


def at_target(measured: Mapping[str, tuple[Breakdown, bool]], runs: Mapping[str, TermRuns],
              verdict: PhaseVerdict, workload: Workload, target_mttr_s: float
              ) -> tuple[AtTarget, ...]:
    """Each projected restore layout at the workload (its terms as `measured`, from `runs`:
    by layout), ranked by T_MTTR there."""
    found = []
    for series, projection, _ in verdict.projections:
        mttr = mttr_at_target(measured[series.layout][0], projection, workload,
                              runs[series.layout])
        if mttr is None:
            continue
        others_s = mttr.total_s - projection.prediction.total_s
        found.append(AtTarget(series.layout, projection, mttr,
                              size(projection.params, workload.ranks, series.layout,
                                   target_mttr_s - others_s)))
    return tuple(sorted(found, key=lambda item: item.mttr.total_s))


def assess(archive: Archive, workload: Workload | int,
           target_mttr_s: float = DEFAULT_TARGET_MTTR_S) -> Assessment:
    """The verdict of the archives for the workload (a bare rank count: the job's
    checkpoint at that count)."""
    if not isinstance(workload, Workload):
        workload = Workload(workload)
    if not (target_mttr_s > 0 and math.isfinite(target_mttr_s)):
        raise UsageError(f"--target-mttr {target_mttr_s:g}: must be a duration above 0")
    # a rejoin run's save layouts are the tiers of one save, its restores two ways back
    # from a lost node: its own verdict, not layouts to rank among the others
    alternatives = archive.without(archive.rejoin_runs()).rows
    phases = {phase: verdict for phase in PHASE_OPS
              if (verdict := phase_verdict(alternatives, phase, workload,
                                           lambda run_id: archive.sidecar(run_id).value))
              is not None}
    restore = phases.get("restore")
    layout = restore.best if restore else ""
    # `stampede mttr ARCHIVES --layout L` of each restore layout the verdict names: the
    # worked example's terms with those its runs measured (the runs chosen once per layout)
    runs = {name: archive.term_runs(name) for name in dict.fromkeys(
        [layout, *(series.layout for series, _, _ in restore.projections)] if restore else [])}
    measured = {name: measured_model(chosen) for name, chosen in runs.items()}
    model = measured[layout][0] if layout and measured[layout][1] else None
    targets = at_target(measured, runs, restore, workload, target_mttr_s) if restore else ()
    return Assessment(workload, phases, model, layout, targets, target_mttr_s,
                      rejoin_verdict(archive, workload))
