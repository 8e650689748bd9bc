"""What an archive says, in one verdict (`stampede html`, `stampede assess`): per phase the
layouts of the latest run ranked by time to last rank (the report's ranking), the
contention model fitted and projected to the target rank count where the archive holds
three or more rank counts (`stampede project`'s fit, with no parameter known), and the
recovery time T_MTTR of the layout that wins at the target (`stampede mttr ARCHIVE
--layout L`'s measured breakdown) with, beside it, T_MTTR with the load term at the target
scale: the layout's time to last rank projected to the target with S_weights per rank.
Pure: the archives are read, nothing is written or launched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stampede.errors import UsageError
from stampede.model.contention import METADATA_OPS, SAVE_METADATA_OPS
from stampede.model.mttr import Breakdown, breakdown, measured_model

PHASE_OPS = {"restore": METADATA_OPS, "save": SAVE_METADATA_OPS}


@dataclass(frozen=True)
class PhaseVerdict:
    """One phase (restore or save) of an archive."""

    phase: str
    run_id: str                                  # the latest run holding the phase
    ranked: tuple[tuple[Mapping[str, str], str], ...]   # (completion row, standing), best first
    projections: tuple[tuple[Any, Any, tuple[str, ...]], ...] = ()   # (Series, Projection, notes)
    why_no_projection: str = ""

    @property
    def best_measured(self) -> str:
        return self.ranked[0][0]["layout"] if self.ranked else ""

    @property
    def at_target(self) -> tuple[tuple[Any, Any, tuple[str, ...]], ...]:
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


@dataclass(frozen=True)
class Assessment:
    target_ranks: int
    phases: dict[str, PhaseVerdict] = field(default_factory=dict)
    mttr: Breakdown | None = None                # as `stampede mttr ARCHIVE --layout best`
    mttr_layout: str = ""
    mttr_at_target: Breakdown | None = None      # its load term at the target scale
    load_projection: Any = None                  # that load term's projection (S_weights per rank)


def dominant_part(projection: Any) -> str:
    """Which term of the projected time to last rank dominates, in words."""
    prediction = projection.prediction
    if prediction.meta_s >= prediction.data_s:
        return "metadata stall" + (" (the burst saturates the server)"
                                   if prediction.saturated else "")
    return f"data (limited by {prediction.limit})"


def ranked(rows: Sequence[dict[str, str]], op: str) -> tuple[tuple[Mapping[str, str], str], ...]:
    """The valid completion rows of one run, best first, with their standing against the
    best (results.report's ranking)."""
    from stampede.results.report import ranked as report_ranked

    return tuple((row, standing) for row, standing in report_ranked(rows, op)
                 if row.get("valid") == "true")


def phase_verdict(rows: Sequence[dict[str, str]], phase: str, target_ranks: int) -> PhaseVerdict | None:
    """The latest run's ranking and the projections of one phase; None without such runs."""
    from stampede.model.fit import Known
    from stampede.model.projection import project, scale_for
    from stampede.model.series import projection_notes, row_phase, series_from_rows

    mine = [row for row in rows if row.get("op") == phase and row_phase(row) == phase]
    if not mine:
        return None
    run_id = mine[-1]["run_id"]
    ranking = ranked([row for row in rows if row["run_id"] == run_id], phase)
    projections, why = [], ""
    for item in series_from_rows(list(rows), (), PHASE_OPS[phase], phase):
        try:
            projection = project(item.points, item.layout, scale_for(item, target_ranks),
                                 Known(), item.per_rank_size, locks=item.locks, phase=phase)
        except UsageError as error:
            why = error.message
            continue
        notes = projection_notes(item, projection, target_ranks, Known())
        projections.append((item, projection, tuple(notes)))
    return PhaseVerdict(phase, run_id, ranking, tuple(projections), "" if projections else why)


def measured_breakdown(archives: Sequence[str], layout: str) -> Breakdown | None:
    """`stampede mttr ARCHIVES --layout L` with no other input: the worked example's terms
    with those the archives measured; None when they measured none."""
    model, measured = measured_model(archives, layout)
    return model if measured else None


def mttr_at_target(model: Breakdown, series: Any, target_ranks: int
                   ) -> tuple[Breakdown, Any] | None:
    """The breakdown with its load term at the target: `series` projected to `target_ranks`
    with every rank loading S_weights (`stampede project A --ranks N --layout L
    --bytes-per-rank S_weights`), and that projection; None where it projects no time."""
    from stampede.model.fit import Known
    from stampede.model.projection import project, scale_for

    size_bytes = model.weights_gb * 1e9
    projection = project(series.points, series.layout,
                         scale_for(series, target_ranks, bytes_per_rank=size_bytes), Known(),
                         series.per_rank_size, locks=series.locks, phase=series.phase)
    total_s = projection.prediction.total_s
    if not (total_s > 0 and math.isfinite(total_s)) or size_bytes <= 0:
        return None
    terms = {term.name: term for term in model.terms}
    sources = {"detect_s": terms["T_detect"].source, "swap_s": terms["T_cordon_swap"].source,
               "init_s": terms["T_pod_init"].source, "sync_s": terms["T_barrier_sync"].source,
               "bw_rank_gbps": f"projected: {series.layout} at {target_ranks} ranks, "
                               f"{model.weights_gb:g} GB per rank (stampede project)"}
    return breakdown(terms["T_detect"].seconds, terms["T_cordon_swap"].seconds,
                     terms["T_pod_init"].seconds, model.weights_gb, size_bytes / total_s / 1e9,
                     terms["T_barrier_sync"].seconds, sources, projection.prediction.meta_s), projection


def assess(archives: Sequence[str], target_ranks: int) -> Assessment:
    """The verdict of the archives at `target_ranks`."""
    from stampede.results.archive import read_rows

    if target_ranks < 1:
        raise UsageError(f"--target-ranks {target_ranks}: must be at least 1")
    rows = [row for archive in archives for row in read_rows(archive)]
    phases = {phase: verdict for phase in PHASE_OPS
              if (verdict := phase_verdict(rows, phase, target_ranks)) is not None}
    restore = phases.get("restore")
    layout = restore.best if restore else ""
    model = measured_breakdown(archives, layout) if layout else None
    target = None
    if model is not None and restore is not None and restore.projections:
        chosen = next(item for item in restore.projections if item[0].layout == layout)
        target = mttr_at_target(model, chosen[0], target_ranks)
    return Assessment(target_ranks, phases, model, layout, *(target or (None, None)))
