"""The tables of runs, each written once: its title, the rows it draws (a phase's layouts,
ranked by results.compare; or the rows it keeps, as archived), and its columns (header, the
cell from a row, alignment, whether a narrow terminal keeps it), and the notes under it.
The restore and save tables are the terminal's and the HTML report's alike; a layout's ops
and the archive's history are the terminal's. present.report renders a spec with rich,
present.html with html_tags. The tables of objects (the models' in present.report_models,
the plan's in present.report_plan) are ItemColumn specs drawn by item_table. And the one
way a terminal table is made (new_table), which every rich renderer (present.report,
report_loaders, report_models, report_plan, commands.analyze) uses: rich is imported when
it is called, never by this module.

A cell is plain text; where the terminal colours one (an invalid layout in red) the
column says so (`alarm`), so that no renderer has to strip another's markup.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from stampede.results.ceiling import efficiency_text
from stampede.results.cells import Row, cell
from stampede.results.columns import OWN_TOOL
from stampede.results.compare import INVALID, ranked
from stampede.results.definitions import BUCKET_ERROR
from stampede.units import (
    format_amplification,
    format_bytes,
    format_in,
    format_number,
    format_seconds,
    seconds_unit,
)

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class Line:
    """One layout of a table: its completion row, its standing against the best, and the
    run's rows (where a save finds its published, blocked and validate rows)."""

    row: Row
    standing: str
    rows: Sequence[Row]

    def beside(self, op: str) -> Row:
        """The row of `op` beside this completion row, or {}."""
        return companion(self.rows, self.row, op)


@dataclass(frozen=True)
class Column:
    header: str                             # "\n" where the terminal breaks it
    cell: Callable[[Line], str]
    left: bool = False                      # names and words: left, folded; numbers: right
    wide: bool = False                      # left out of a narrow terminal
    whole: bool = False                     # a name never folded (a layout's: tests read it)
    alarm: Callable[[Line], bool] | None = None   # the terminal shows the cell in red

    @property
    def one_line(self) -> str:
        """The header where nothing breaks it (HTML): "strag-\\ngler" is "straggler"."""
        return self.header.replace("-\n", "").replace("\n", " ")


@dataclass(frozen=True)
class TableSpec:
    title: str
    anchor: str                             # the HTML report's id for it
    phase: str                              # whose completion rows it ranks; "": unranked
    columns: tuple[Column, ...]
    notes: Callable[[Sequence[Line]], list[str]] = lambda lines: []
    keeps: Callable[[Row], bool] = lambda row: True   # unranked: the rows it draws, in order
    heading: Callable[[Sequence[Row]], str] | None = None   # a title that names its rows

    def lines(self, rows: Sequence[Row]) -> list[Line]:
        """Its layouts, best first (none: a run without this phase, or imported rows); an
        unranked table's: a line per row it keeps, in the rows' order."""
        if not self.phase:
            return [Line(row, "", rows) for row in rows if self.keeps(row)]
        return [Line(row, standing, rows) for row, standing in ranked(rows, self.phase)]

    def title_of(self, rows: Sequence[Row]) -> str:
        return self.heading(rows) if self.heading is not None else self.title

    def shown(self, wide: bool) -> tuple[Column, ...]:
        return self.columns if wide else tuple(c for c in self.columns if not c.wide)


def new_table(title: str, headers: Sequence[str], left: Sequence[str] = (),
              whole: Sequence[str] = ()) -> Table:
    """A terminal table as every report draws one: title left, a rule under the headers,
    numbers right-aligned and never wrapped, the `left` headers' columns left and folded
    (those also in `whole` never: the other columns give way)."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for header in headers:
        if header in whole:
            table.add_column(header, justify="left", no_wrap=True)
        elif header in left:  # names and paths fold rather than lose their tail
            table.add_column(header, justify="left", overflow="fold")
        else:
            table.add_column(header, justify="right", no_wrap=True)
    return table


def companion(rows: Sequence[Row], row: Row, op: str) -> Row:
    """The row of `op` beside a completion row (same run, phase and layout), or an empty Row."""
    return next((other for other in rows if other["op"] == op and other["layout"] == row["layout"]
                 and other.get("phase") == row.get("phase")
                 and other["run_id"] == row["run_id"]), Row())


def last_rank(row: Row) -> str:
    """'140 (138-146) ms': the median over iterations and its min-max, in one unit."""
    unit, factor = seconds_unit(row["time_to_last_rank_s"])
    return (f"{format_in(row['time_to_last_rank_s'], factor)} "
            f"({format_in(row['time_to_last_rank_min_s'], factor)}-"
            f"{format_in(row['time_to_last_rank_max_s'], factor)}) {unit}")


def _seconds(column: str) -> Callable[[Line], str]:
    return lambda line: format_seconds(line.row[column])


def _number(column: str) -> Callable[[Line], str]:
    return lambda line: format_number(line.row[column])


def _beside_seconds(op: str) -> Callable[[Line], str]:
    """A save's companion op's elapsed time (published, blocked), '-' where it has none."""
    return lambda line: format_seconds(line.beside(op)["elapsed_s"]) \
        if line.beside(op) else "-"


def _buffered(line: Line) -> bool:
    return line.row.get("durability") == "none"


def read_amplification(row: Row) -> str:
    """'4.0x': the bytes a restore read from storage over the unique bytes it needed (an
    older row, or a save's: '-')."""
    return format_amplification(row.get("read_amplification", math.nan))


def ceiling_efficiency(row: Row) -> str:
    """'0.93x': a restore's storage GB/s per node over the node's raw-read ceiling
    (run.ceiling); '' where none was measured."""
    return efficiency_text(row.get("ceiling_efficiency", math.nan))


def ceiling_notes(lines: Sequence[Line]) -> list[str]:
    """Under the restore table, only for a run that measured it (run.ceiling): each
    layout's efficiency against the nodes' raw-read ceiling, best first as the table."""
    measured = [line for line in lines if ceiling_efficiency(line.row)]
    if not measured:
        return []
    first = measured[0].row
    nodes = (f"{format_number(first['ceiling_gbps'])} GB/s" if first["nnodes"] == 1 else
             f"{format_number(first['ceiling_gbps'])}-{format_number(first['ceiling_gbps_max'])}"
             " GB/s per node")
    return [f"vs the raw-read ceiling ({nodes}, cold large reads at 1-32 streams, the best "
            "median of 3, measured before the layouts; storage GB/s per node over it): "
            + ", ".join(f"{line.row['layout']} {ceiling_efficiency(line.row)}"
                        for line in measured)]


LAYOUT = Column("layout", lambda line: line.row["layout"], left=True, whole=True)
STANDING = Column("vs best", lambda line: line.standing, left=True,
                  alarm=lambda line: line.standing == INVALID)
STRAGGLER = Column("strag-\ngler", lambda line: f"{line.row['straggler_ratio']:.2f}")
SLOWEST = Column("slowest\nGB/s", _number("slowest_rank_gbps"))

RESTORE = TableSpec(
    "Restore: time until every rank holds its bytes", "restore", "restore",
    # at 80 columns the straggler ratio gives way to read amplification, so that a
    # layout's name never folds (the slowest rank's GB/s says the straggler's cost)
    (LAYOUT, Column("last rank\n(min-max)", lambda line: last_rank(line.row)), STANDING,
     Column(STRAGGLER.header, STRAGGLER.cell, wide=True), Column("agg\nGB/s", _number("agg_gbps")),
     SLOWEST, Column("read\nampl", lambda line: read_amplification(line.row)),
     Column("first\ndone", _seconds("first_done_s"), wide=True),
     Column("storage\nops/it", _number("storage_ops_per_iteration"), wide=True),
     Column("storage\npart", _seconds("storage_s"), wide=True),
     Column("network\npart", _seconds("network_s"), wide=True)),
    notes=ceiling_notes)

BUFFERED_NOTE = ("buf = save.durability = none: handed to the page cache, not durable; never "
                 "storage GB/s")
SAVE_NOTE = ("published = until the pointer named the version (rank 0); blocked = until "
             "training could go on (async: the snapshot); unprotected = time without a valid "
             "published version (0 when retention waits for the publish; a tier's: how long a "
             "published version was not yet on that tier, when tiers.publish is below it).")

SAVE = TableSpec(
    "Save: time until every rank's bytes are durable", "save", "save",
    (LAYOUT, Column("durable, last\nrank (min-max)", lambda line: last_rank(line.row)),
     STANDING, Column("pub-\nlished", _beside_seconds("published")),
     Column("blocked", _beside_seconds("blocked")),
     # a save only handed to the page cache: its GB/s marked, never storage's
     Column("agg\nGB/s", lambda line: format_number(line.row["agg_gbps"])
            + (" buf" if _buffered(line) else "")),
     SLOWEST, Column("strag-\ngler", STRAGGLER.cell, wide=True),
     Column("unpro-\ntected", _seconds("unprotected_s"), wide=True),
     Column("validate\nerrors", lambda line: cell(line.beside("validate")["errors"])
            if line.beside("validate") else "-", wide=True)),
    lambda lines: ([BUFFERED_NOTE] if any(_buffered(line) for line in lines) else [])
    + [SAVE_NOTE])


def _text(column: str) -> Callable[[Line], str]:
    """The cell as archived (a whole number as written, a number's NaN as empty)."""
    return lambda line: cell(line.row[column])


def _latency(statistic: str) -> Callable[[Line], str]:
    """A latency statistic in the unit of the row's p50 (its unit column's)."""
    def cell(line: Line) -> str:
        _, factor = seconds_unit(line.row["lat_p50_s"])
        return format_in(line.row[f"lat_{statistic}_s"], factor)
    return cell


def _ops_title(rows: Sequence[Row]) -> str:
    first = rows[0]
    saved = " save" if first.get("phase") == "save" else ""
    approximate = (f" (p50-p99.9 from histograms, within {BUCKET_ERROR:.0%})"
                   if first.get("samples") == "histogram" else "")
    return f"{first['layout']}{saved}: latency per op, all ranks and iterations{approximate}"


def _count(row: Row, column: str) -> int:
    """A whole-number cell, 0 where the row has none (older schemas, POSIX)."""
    value = row.get(column)
    return value if isinstance(value, int) else 0


def throttling_notes(lines: Sequence[Line]) -> list[str]:
    """Under a layout's ops, where its storage client met throttling or retried: each such
    op's throttling answers (429, 503), retries and seconds backing off, over all ranks and
    iterations (the rows' throttles, retries, backoff_s); nothing where none did."""
    said = []
    for line in lines:
        throttles, retries = _count(line.row, "throttles"), _count(line.row, "retries")
        if throttles or retries:
            waited = line.row.get("backoff_s")
            said.append(f"{line.row['op']} {throttles} / {retries} / "
                        + (format_seconds(float(waited)) if isinstance(waited, int | float)
                           else "-"))
    return [("throttling answers (429, 503) / retries / time backing off, all ranks and "
             "iterations: " + ", ".join(said))] if said else []


# One layout's rows (one phase): every op's latency over all ranks and iterations; under
# it, each op's throttling, retries and backoff where there were any
OPS = TableSpec(
    "latency per op, all ranks and iterations", "ops", "",
    (Column("op", _text("op"), left=True),
     Column("unit", lambda line: seconds_unit(line.row["lat_p50_s"])[0], left=True),
     Column("count", _text("count")),
     Column("err", _text("errors"), alarm=lambda line: line.row["errors"] != 0),
     *(Column(header, _latency(statistic)) for header, statistic in (
         ("min", "min"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99.9", "p999"),
         ("max", "max"))),
     Column("ops/s", _number("ops_per_s")), Column("agg\nGB/s", _number("agg_gbps"))),
    throttling_notes, heading=_ops_title)


def _tool_layout(line: Line) -> str:
    """The layout, and the tool where another's rows sit beside stampede's (a loader)."""
    tool = line.row.get("tool", OWN_TOOL)
    return line.row["layout"] + (f" ({tool})" if tool != OWN_TOOL else "")


# Every run of an archive: its completion rows (restore, save, startup), as archived
HISTORY = TableSpec(
    "Every run in the archive: time to last rank (restore, save or startup)", "history", "",
    (Column("run", _text("run_id"), left=True), Column("job", _text("job"), left=True),
     Column("layout", _tool_layout, left=True), Column("op", _text("op"), left=True),
     Column("ranks", _text("nranks")), Column("cache", _text("cache")),
     Column("bytes", lambda line: format_bytes(line.row["bytes_total"])),
     Column("last\nrank", _seconds("time_to_last_rank_s")),
     Column("agg\nGB/s", _number("agg_gbps")),
     Column("valid", lambda line: "yes" if line.row["valid"] else "NO",
            alarm=lambda line: not line.row["valid"])),
    keeps=lambda row: math.isfinite(row["time_to_last_rank_s"]))


# --- tables of objects: the models' (report_models) and the plan's (report_plan) -----------

T = TypeVar("T")


@dataclass(frozen=True)
class ItemColumn(Generic[T]):
    """A column of a table of objects (a comparison, a term, a rank's read): its header and
    its cell from one object, written together so that neither moves without the other."""

    header: str
    cell: Callable[[T], str]                # rich markup kept as it is
    left: bool = False                      # names and words: left, folded; numbers: right
    whole: bool = False                     # a left name never folded (the others give way)


@dataclass(frozen=True)
class Verbatim:
    """A line of a table of objects that is no object: a total, or '...' for the ranks not
    shown; its first cells as given, the rest blank."""

    cells: tuple[str, ...]


def item_table(title: str, columns: Sequence[ItemColumn[T]],
               items: Iterable[T | Verbatim]) -> Table:
    """A terminal table (new_table) with a line per item, each cell its column's."""
    table = new_table(title, [column.header for column in columns],
                      left=[column.header for column in columns if column.left],
                      whole=[column.header for column in columns if column.whole])
    for item in items:
        if isinstance(item, Verbatim):
            table.add_row(*item.cells, *[""] * (len(columns) - len(item.cells)))
        else:
            table.add_row(*(column.cell(item) for column in columns))
    return table
