"""Points for the contention model from archives: per layout, the runs of one phase (the
restore, or the save) and one configuration, a point per rank count (the metadata stall
from each op's p50 and count, the time to last rank from the phase's completion row)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stampede.errors import UsageError
from stampede.model.contention import METADATA_OPS, lock_count
from stampede.model.fit import Known, Point, Projection
from stampede.results.archive import CONFIG_COLUMNS
from stampede.results.cells import number


@dataclass(frozen=True)
class Series:
    """One layout's runs of one phase and one configuration, a point per rank count."""

    layout: str
    points: tuple[Point, ...]
    context: str
    per_rank_size: bool
    notes: tuple[str, ...]
    phase: str = "restore"
    locks: float = math.inf      # what its metadata ops spread over (contention.lock_count)

    @property
    def serialised_by(self) -> str:
        """What makes c_eff smaller than c, in words ("" where nothing does)."""
        if self.locks > 1 and math.isfinite(self.locks):
            return f"{self.locks:g} directories' locks"
        if self.locks <= 1:
            return "one directory's lock" if self.phase == "save" else "one shared inode"
        return ""


def row_phase(row: dict[str, str]) -> str:
    """A row's phase; rows from before the phase column (schema 1 and 2) are restores."""
    return row.get("phase") or "restore"


def _point(row: dict[str, str], op_rows: dict[tuple[str, str, str, str], dict[str, str]],
           ops: Sequence[str]) -> Point:
    nranks = int(row["nranks"])
    iterations = number(row, "iterations")
    iterations = iterations if math.isfinite(iterations) and iterations >= 1 else 1.0
    counts, stall = [], 0.0
    for op in ops:
        op_row = op_rows.get((row["run_id"], row_phase(row), row["layout"], op))
        if op_row is None:
            continue
        count, p50 = number(op_row, "count"), number(op_row, "lat_p50_s")
        if not (math.isfinite(count) and math.isfinite(p50)) or count <= 0:
            continue
        per_iteration = count / iterations
        counts.append((op, per_iteration))
        stall += per_iteration / nranks * p50
    bytes_per_rank = number(row, "bytes_per_rank")
    return Point(nranks=nranks, ops_per_rank=sum(c for _, c in counts) / nranks, meta_s=stall,
                 last_s=number(row, "time_to_last_rank_s"),
                 bytes_per_rank=bytes_per_rank if math.isfinite(bytes_per_rank) else 0.0,
                 last_min_s=number(row, "time_to_last_rank_min_s"),
                 last_max_s=number(row, "time_to_last_rank_max_s"), op_counts=tuple(counts))


def series_from_rows(rows: Sequence[dict[str, str]], layouts: Sequence[str] = (),
                     ops: Sequence[str] = METADATA_OPS, phase: str = "restore") -> list[Series]:
    """Per layout: the latest configuration's latest valid run of `phase` at each rank
    count (its completion row: op restore, or op save)."""
    rows = sorted(rows, key=lambda row: row.get("timestamp", ""))   # stable: archive order
    completions = [row for row in rows if row.get("op") == phase and row_phase(row) == phase
                   and row.get("valid") == "true" and number(row, "time_to_last_rank_s") > 0
                   and number(row, "nranks") >= 1]
    present = list(dict.fromkeys(row["layout"] for row in completions))
    missing = [layout for layout in layouts if layout not in present]
    if missing:
        raise UsageError(f"--layout {','.join(missing)}: no valid {phase} run of it in the archives "
                         f"(they hold: {', '.join(present) or 'none'})")
    op_rows = {(row["run_id"], row_phase(row), row["layout"], row["op"]): row for row in rows
               if row.get("op") in ops and row.get("valid") == "true"}
    result = []
    for layout in layouts or present:
        mine = [row for row in completions if row["layout"] == layout]
        config = tuple(mine[-1].get(column, "") for column in CONFIG_COLUMNS)
        same = [row for row in mine if tuple(row.get(c, "") for c in CONFIG_COLUMNS) == config]
        latest = {int(row["nranks"]): row for row in same}
        chosen = [latest[n] for n in sorted(latest)]
        ref = chosen[-1]
        fanout = number(ref, "fanout")
        result.append(Series(layout=layout, points=tuple(_point(row, op_rows, ops) for row in chosen),
                             context=_context(ref, phase), notes=_notes(mine, same, latest, chosen, phase),
                             per_rank_size=bool(ref.get("size_per_rank_requested")), phase=phase,
                             locks=lock_count(layout, phase, int(fanout) if fanout >= 1 else 0)))
    return result


def _notes(mine: list[dict[str, str]], same: list[dict[str, str]], latest: dict[int, dict[str, str]],
           chosen: list[dict[str, str]], phase: str) -> tuple[str, ...]:
    """What was left out, and what makes the runs measure something else than storage."""
    notes = []
    if len(same) < len(mine):
        notes.append(f"{len(mine) - len(same)} {phase} run(s) of another configuration left out "
                     "(the latest configuration is fitted)")
    if len(latest) < len(same):
        notes.append(f"{len(same) - len(latest)} earlier run(s) at a repeated rank count "
                     "superseded by the latest")
    ref = chosen[-1]
    if phase == "restore" and ref.get("cache") == "warm":
        notes.append("cache warm: the runs may have read the page cache, so B_agg and "
                     "B_client are memory bandwidth, not storage")
    if phase == "save" and ref.get("durability") == "none":
        notes.append("save.durability = none: the saves were buffered (no fsync), so B_agg and "
                     "B_client are the page cache's, not storage's")
    crowded = [row["nranks"] for row in chosen if "oversubscribed" in row.get("warnings", "")]
    if crowded:
        notes.append(f"oversubscribed at {', '.join(crowded)} rank(s): CPU contention is fitted "
                     "as if it were the storage's")
    return tuple(notes)


def _context(ref: dict[str, str], phase: str) -> str:
    """The configuration a projection stands for, as the report prints it."""
    where = (f"job {ref.get('job') or '?'}, {ref.get('backend') or '?'} on "
             f"{ref.get('fs_type') or '?'}")
    if phase == "save":
        return (f"{where}, save.mode {ref.get('save_mode') or '?'}, durability "
                f"{ref.get('durability') or '?'}, mkdir by {ref.get('mkdir_by') or '?'}"
                + (f", fanout {ref.get('fanout')}" if ref.get("layout") == "fan-out" else ""))
    return (f"{where}, cache {ref.get('cache') or '?'}, {ref.get('pattern') or '?'}, stat_count "
            f"{ref.get('stat_count') or '?'}, open_count {ref.get('open_count') or '?'}")


def projection_notes(series: Series, projection: Projection, nranks: int,
                     known: Known | None = None) -> list[str]:
    """What the reader of a projection must know about how far it can be trusted."""
    fit = projection.fit
    notes = list(series.notes) + list(fit.notes)
    if fit.stall_bound:
        notes.append("no measured rank count saturated the metadata server: s/c is bounded, not "
                     "fitted; the knee is put at the largest run (the most pessimistic fit)")
    elif len(fit.saturated) == 1 and (known is None or known.threads is None) \
            and not fit.serialised:
        notes.append(f"the drain rate s/c rests on one saturated rank count ({fit.saturated[0]})")
    if fit.agg_bound:
        notes.append("no measured rank count reached the aggregate bandwidth: B_agg is a lower "
                     "bound (the largest run exactly at the limit)")
    if fit.client_bound:
        notes.append("every measured rank count was limited by B_agg / N: B_client is a lower "
                     "bound (it only matters below the measured rank counts)")
    if nranks <= max(p.nranks for p in fit.points):
        notes.append(f"{nranks} ranks is within the measured range: an interpolation")
    return notes
