"""Points for the contention model from archives: per layout, the runs of one phase (the
restore, or the save) and one configuration, a point per rank and node count (the metadata
stall from each op's p50 and count, the time to last rank from the phase's completion row,
the geometry from the nodes, ranks per node and replicas, a restore's F from its sidecar's
timeline), which runs were fitted and why
the others were left out, and how the runs grew (bytes per rank, replicas)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from stampede.errors import UsageError
from stampede.layouts import TABLE
from stampede.model.contention import METADATA_OPS, lock_count
from stampede.model.fit import Known, Point
from stampede.model.projection import Projection, Scaling
from stampede.results.cells import Row
from stampede.results.columns import CONFIG_COLUMNS
from stampede.results.model import TIMELINE_COLUMNS, TIMELINE_MOMENTS
from stampede.units import format_bytes, format_plain, format_seconds

# What the model takes per point rather than requiring it equal: the replica count
# (stampede.model.traffic places the shards and groups from it), e.g. a sweep over nodes
# with one replica per node. Everything else in CONFIG_COLUMNS changes what an op costs.
PER_POINT = ("replicas",)
MODEL_CONFIG = tuple(column for column in CONFIG_COLUMNS if column not in PER_POINT)


@dataclass(frozen=True)
class Series:
    """One layout's runs of one phase and one configuration, a point per rank and node
    count."""

    layout: str
    points: tuple[Point, ...]
    context: str
    per_rank_size: bool
    notes: tuple[str, ...]
    phase: str = "restore"
    locks: float = math.inf      # what its metadata ops spread over (contention.lock_count)
    scaling: Scaling = Scaling(True, False, 0, 1)

    @property
    def serialised_by(self) -> str:
        """What makes c_eff smaller than c, in words ("" where nothing does)."""
        if self.locks > 1 and math.isfinite(self.locks):
            return f"{self.locks:g} directories' locks"
        if self.locks <= 1:
            return "one directory's lock" if self.phase == "save" else "one shared inode"
        return ""


def row_phase(row: Row) -> str:
    """A row's phase; rows from before the phase column (schema 1 and 2) are restores."""
    return row["phase"] or "restore"


def _whole(row: Row, column: str, default: int) -> int:
    value: int = row[column]
    return value if value >= 1 else default


def _per_rank_s(op_row: Row | None, iterations: float, nranks: int,
                latency: str = "lat_p50_s") -> tuple[float, float]:
    """(count per iteration, count per rank per iteration x `latency`) of an op's row;
    (0, 0) where there is none or it measured nothing."""
    if op_row is None:
        return 0.0, 0.0
    count, seconds = op_row["count"], op_row[latency]
    if not math.isfinite(seconds) or count <= 0:
        return 0.0, 0.0
    return count / iterations, count / iterations / nranks * seconds


# a run id's sidecar document (None: none could be read), e.g. Archive.sidecar's value
Sidecars = Callable[[str], object]


def outside_s(sidecar: object, layout: str) -> float:
    """F of a run's layout from its sidecar's timeline: per measured iteration, the last
    rank's done time less the seconds it spent in its timed ops (the timeline's phase
    columns), the median over iterations; 0 where the sidecar has no such timeline (none
    given, or written before the phase columns)."""
    try:
        timeline = sidecar["layouts"][layout]["stats"]["timeline"]   # type: ignore[index]
    except (KeyError, TypeError):
        return 0.0
    done, phases = TIMELINE_COLUMNS.index("done_s"), len(TIMELINE_MOMENTS)
    last: dict[float, tuple[float, float]] = {}     # iteration: (done, outside) of its last rank
    for moments in timeline or ():
        if len(moments) < len(TIMELINE_COLUMNS) or not math.isfinite(moments[done]):
            continue
        outside = moments[done] - sum(moments[phases:len(TIMELINE_COLUMNS)])
        if moments[done] > last.get(moments[1], (-math.inf, 0.0))[0]:
            last[moments[1]] = (moments[done], max(outside, 0.0))   # overlapping ops: 0
    return statistics.median(outside for _, outside in last.values()) if last else 0.0


def _point(row: Row, op_rows: dict[tuple[str, str, str, str], Row],
           ops: Sequence[str], sidecars: Sidecars | None = None) -> Point:
    nranks = row["nranks"]
    iterations = float(max(row["iterations"], 1))
    # the reads' time, to find their own metadata requests (fit.read_queue_ops): restores only
    read_row = op_rows.get((row["run_id"], row_phase(row), row["layout"], "read")) \
        if row_phase(row) == "restore" else None
    reads, read_s = _per_rank_s(read_row, iterations, nranks)
    _, read_max_s = _per_rank_s(read_row, iterations, nranks, "lat_max_s")
    counts, stall, slowest = [], 0.0, 0.0
    for op in ops:
        op_row = op_rows.get((row["run_id"], row_phase(row), row["layout"], op))
        per_iteration, spent = _per_rank_s(op_row, iterations, nranks)
        if per_iteration > 0:
            counts.append((op, per_iteration))
            stall += spent
            slowest += _per_rank_s(op_row, iterations, nranks, "lat_max_s")[1]
    nnodes = _whole(row, "nnodes", 1)
    return Point(nranks=nranks, ops_per_rank=sum(c for _, c in counts) / nranks, meta_s=stall,
                 meta_max_s=slowest if slowest > 0 else math.nan,
                 last_s=row["time_to_last_rank_s"],
                 bytes_per_rank=float(row["bytes_per_rank"]),
                 last_min_s=row["time_to_last_rank_min_s"],
                 last_max_s=row["time_to_last_rank_max_s"], op_counts=tuple(counts),
                 ranks_per_node=_whole(row, "ranks_per_node", nranks) if nnodes > 1 else 0,
                 replicas=_whole(row, "replicas", 1),
                 broadcast_group=row["broadcast_group"] or "replica", run_id=row["run_id"],
                 read_s=read_s, read_max_s=read_max_s,
                 reads_per_rank=reads / nranks if reads > 0 else math.inf,
                 # the restore's only: a save's timeline also sums ops after it is durable
                 outside_s=outside_s(sidecars(row["run_id"]), row["layout"])
                 if sidecars and row_phase(row) == "restore" else 0.0)


def _differs(row: Row, config: Mapping[str, object]) -> str:
    """The first configuration column in which a row differs from the fitted one."""
    column = next(c for c in MODEL_CONFIG if row[c] != config[c])
    return f"{column} {row.get(column) or '(none)'} instead of {config[column] or '(none)'}"


def _selection_notes(layout_rows: list[Row], same: list[Row],
                     chosen: list[Row], invalid: int, config: Mapping[str, object],
                     phase: str) -> list[str]:
    """Which rows were fitted, and why each other one was left out."""
    used = ", ".join(f"{row['nranks']}@{row.get('nnodes') or 1} ({row['run_id']})" for row in chosen)
    notes = [f"fitted: {len(chosen)} {phase} run(s) at ranks@nodes {used}"]
    kept = {id(row) for row in same}   # by identity: `row not in same` compared dicts, n x m
    others = [row for row in layout_rows if id(row) not in kept]
    if others:
        reasons = Counter(_differs(row, config) for row in others)
        notes.append(f"left out: {len(others)} {phase} run(s) of another configuration ("
                     + "; ".join(f"{n} with {why}" for why, n in reasons.items())
                     + "): the latest configuration is fitted")
    superseded = len(same) - len(chosen)
    if superseded:
        notes.append(f"left out: {superseded} earlier run(s) at a rank and node count run again "
                     "later (the latest is fitted)")
    if invalid:
        notes.append(f"left out: {invalid} invalid {phase} run(s) (see their invalid_reason)")
    return notes


def scaling_of(rows: Sequence[Row], points: Sequence[Point]) -> tuple[Scaling, list[str]]:
    """How bytes per rank and replicas grew over the runs, decided from the runs themselves
    (a job may write a weak-scaling sweep as checkpoint.size = 2 MiB x N: per rank it is)."""
    notes = []
    largest = max(points, key=lambda p: p.key)
    sizes = {p.bytes_per_rank for p in points}
    totals = {p.bytes_per_rank * p.nranks / max(p.replicas, 1) for p in points}
    if all(row.get("size_per_rank_requested") for row in rows):
        per_rank = True
    elif len(sizes) == 1 and len(points) > 1:
        per_rank = True
        if not any(row.get("size_per_rank_requested") for row in rows):
            notes.append(f"every run restored {format_bytes(largest.bytes_per_rank)} per rank "
                         "(checkpoint.size grew with the ranks): projected at that per rank")
    elif len(totals) == 1 or all(row.get("size_total_requested") for row in rows):
        per_rank = False
    else:
        per_rank = True
        notes.append("the runs' sizes follow neither a per-rank nor a total rule: projected at "
                     f"the largest run's {format_bytes(largest.bytes_per_rank)} per rank")
    several = [p for p in points if p.nnodes > 1]    # one node may hold 2 (broadcast needs 2)
    per_node = bool(several) and all(p.replicas == p.nnodes for p in several)
    if per_node:
        notes.append("every run on several nodes held one replica per node: projected so "
                     "(replicas = nodes)")
    elif len({p.replicas for p in points}) > 1:
        counts = ", ".join(sorted({str(p.replicas) for p in points}))
        notes.append(f"the runs' replica counts differ ({counts}): projected at the largest "
                     f"run's {largest.replicas}")
    return Scaling(per_rank, per_node, largest.ranks_per_node, largest.replicas), notes


def series_from_rows(rows: Sequence[Row], layouts: Sequence[str] = (),
                     ops: Sequence[str] = METADATA_OPS, phase: str = "restore",
                     sidecars: Sidecars | None = None) -> list[Series]:
    """Per layout: the latest configuration's latest valid run of `phase` at each rank and
    node count (its completion row: op restore, or op save; a run's replica count is its
    own: the model places the shards from it); `sidecars` (run id: its sidecar) gives each
    point its F (outside_s; 0 without)."""
    rows = sorted(rows, key=lambda row: row.get("timestamp", ""))   # stable: archive order
    completions = [row for row in rows if row.get("op") == phase and row_phase(row) == phase
                   and row["valid"] and row["time_to_last_rank_s"] > 0
                   and row["nranks"] >= 1]
    present = list(dict.fromkeys(row["layout"] for row in completions))
    missing = [layout for layout in layouts if layout not in present]
    if missing:
        raise UsageError(f"--layout {','.join(missing)}: no valid {phase} run of it in the archives "
                         f"(they hold: {', '.join(present) or 'none'})")
    op_rows = {(row["run_id"], row_phase(row), row["layout"], row["op"]): row for row in rows
               if (row.get("op") in ops or row.get("op") == "read") and row["valid"]}
    result = []
    for layout in layouts or present:
        mine = [row for row in completions if row["layout"] == layout]
        invalid = sum(1 for row in rows if row.get("op") == phase and row_phase(row) == phase
                      and row["layout"] == layout and not row["valid"])
        config = {column: mine[-1][column] for column in MODEL_CONFIG}
        same = [row for row in mine if all(row[c] == v for c, v in config.items())]
        latest = {(row["nranks"], _whole(row, "nnodes", 1)): row for row in same}
        chosen = [latest[key] for key in sorted(latest)]
        points = tuple(_point(row, op_rows, ops, sidecars) for row in chosen)
        scaling, scaled = scaling_of(chosen, points)
        notes = _selection_notes(mine, same, chosen, invalid, config, phase) + \
            _notes(chosen, phase) + scaled
        ref = chosen[-1]
        result.append(Series(layout=layout, points=points, context=_context(ref, phase),
                             notes=tuple(notes), per_rank_size=scaling.per_rank_bytes, phase=phase,
                             locks=lock_count(layout, phase, ref["fanout"]),
                             scaling=scaling))
    return result


def _notes(chosen: list[Row], phase: str) -> list[str]:
    """What makes the runs measure something else than storage."""
    notes = []
    ref = chosen[-1]
    if phase == "restore" and ref.get("cache") == "warm":
        notes.append("cache warm: the runs may have read the page cache, so B_agg and "
                     "B_client are memory bandwidth, not storage")
    if phase == "save" and ref.get("durability") == "none":
        notes.append("save.durability = none: the saves were buffered (no fsync), so B_agg and "
                     "B_client are the page cache's, not storage's")
    crowded = [row["nranks"] for row in chosen if "oversubscribed" in row.get("warnings", "")]
    if crowded:
        notes.append(f"oversubscribed at {', '.join(map(str, crowded))} rank(s): CPU contention is fitted "
                     "as if it were the storage's")
    return notes


def _context(ref: Row, phase: str) -> str:
    """The configuration a projection stands for, as the report prints it."""
    where = (f"job {ref.get('job') or '?'}, {ref.get('backend') or '?'} on "
             f"{ref.get('fs_type') or '?'}")
    described = TABLE.get(ref.get("layout", ""))   # None: no layout (an assign policy)
    fans_out = described is not None and described.fanout_dirs
    if phase == "save":
        return (f"{where}, save.mode {ref.get('save_mode') or '?'}, durability "
                f"{ref.get('durability') or '?'}, mkdir by {ref.get('mkdir_by') or '?'}"
                + (f", fanout {ref.get('fanout')}" if fans_out else ""))
    return (f"{where}, cache {ref.get('cache') or '?'}, {ref.get('pattern') or '?'}, stat_count "
            f"{ref['stat_count']}, open_count {ref['open_count']}")


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
        notes.append("no measured rank count was limited by one client: B_client is a lower "
                     "bound (where it would start to limit the run closest to it)")
    if fit.node_bound:
        notes.append("no measured rank count was limited by a node's NIC: B_node is a lower "
                     "bound (where it would start to limit the run closest to it)")
    read_ops = projection.params.read_ops_per_rank
    if read_ops > 0:
        notes.append(f"the reads' own metadata requests (their latency grew with the server's "
                     f"queue): {format_plain(read_ops)} op(s) per rank, "
                     f"{format_seconds(projection.prediction.read_meta_s)} of the data term at "
                     f"{nranks} ranks, drained with the metadata ops")
    several = projection.prediction.nnodes > 1
    if several and not fit.node_measured:
        notes.append("every run was on one node, so their NICs are not in them (B_node "
                     "unlimited): give --node-gbps, or run on several nodes (stampede "
                     "emulate-cluster on one machine)")
    if nranks <= max(p.nranks for p in fit.points):
        notes.append(f"{nranks} ranks is within the measured range: an interpolation")
    return notes
