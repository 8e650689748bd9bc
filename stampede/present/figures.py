"""The figures' data, computed once and drawn by either backend (present.plot: matplotlib
PNGs; present.html_figures: inline SVG): each layout's colour, the latency CDFs' steps
and their shared range, the scaling series (median and spread per rank count), each rank's
timeline and the phases it holds, and the ticks of every axis (values and their labels).
The stdlib only: the CLI imports present.plot, which imports this, on every start."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stampede.ops import BY_NAME, OPS, SAVE_ORDER, TIMELINE_PHASES
from stampede.results.cells import Row
from stampede.results.model import TIMELINE_COLUMNS, TIMELINE_MOMENTS
from stampede.units import format_seconds

Tick = tuple[float, str]   # (value on the axis, its label)
# matplotlib's default cycle (tab10), so a layout has one colour in the PNGs and the SVGs
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
MIN_TICKS = 3
MAX_TICKS = 7


def colour_map(names: Sequence[str]) -> dict[str, str]:
    """A colour per name, in first-seen order (the archive's layout order)."""
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(dict.fromkeys(names))}


# ---- ticks ---------------------------------------------------------------------------

def log_seconds_ticks(low_s: float, high_s: float, most: int = MAX_TICKS) -> list[Tick]:
    """Ticks of a log time axis, each labelled with its unit (20 µs, 1.5 ms): decades when
    the range spans enough of them, else 1-2-5 or finer steps, so that at least MIN_TICKS
    fall inside; never more than `most` (every k-th one over a wide range)."""
    if not 0 < low_s < high_s:
        return [(low_s, format_seconds(low_s))] if low_s > 0 else []
    for mantissas in ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
                      tuple(1.0 + k / 10 for k in range(90))):
        values = [m * 10.0 ** e for e in range(math.floor(math.log10(low_s)),
                                               math.ceil(math.log10(high_s)) + 1)
                  for m in mantissas if low_s <= m * 10.0 ** e <= high_s]
        if len(values) >= MIN_TICKS:
            step = -(-len(values) // most)
            return [(value, format_seconds(value)) for value in values[::step]]
    middle = math.sqrt(low_s * high_s)   # a range under 10%: its ends and its middle
    return [(value, format_seconds(value)) for value in (low_s, middle, high_s)]


def linear_ticks(high: float, label: Callable[[float], str] = format_seconds, count: int = 5) -> list[Tick]:
    """`count` evenly spaced ticks from 0 to `high`, labelled by `label`."""
    return [(high * k / (count - 1), label(high * k / (count - 1))) for k in range(count)]


FRACTION_TICKS: list[Tick] = [(value, f"{value:g}") for value in (0.0, 0.5, 1.0)]   # a CDF's y


# ---- latency CDFs --------------------------------------------------------------------

def cdf_steps(counts: Sequence[int], edges_s: Sequence[float]) -> tuple[list[float], list[float]]:
    """Step points (edge, fraction of samples below it), trimmed to one empty bucket either
    side of the samples. Exact at each edge; flat between (drawn with where='post')."""
    total = sum(counts)
    used = [index for index, count in enumerate(counts) if count]
    if not total or not used:
        return [], []
    low, high = max(used[0] - 1, 0), min(used[-1] + 2, len(counts))
    if edges_s[low] <= 0:   # a log axis has no 0: a clock's zeros are the first step's height
        low += 1
    below = sum(counts[:low])
    xs, ys = [edges_s[low]], [below / total]
    for index in range(low, high):
        below += counts[index]
        xs.append(edges_s[index + 1])
        ys.append(below / total)
    return xs, ys


def busy_s(counts: Sequence[int], edges_s: Sequence[float]) -> float:
    """The seconds a histogram's samples took together, each at its bucket's geometric
    middle (buckets 2% wide: within 1% of the exact sum; 1 ns wide below 100 ns: within
    half a nanosecond each)."""
    return sum(count * math.sqrt(max(edges_s[index], 0.0) * edges_s[index + 1])
               for index, count in enumerate(counts) if count)


@dataclass(frozen=True)
class CdfPanel:
    """One op's latency CDF: per layout its steps (seconds, fraction below), its samples
    and the seconds they took together (all ranks and measured iterations)."""
    op: str
    steps: dict[str, tuple[list[float], list[float]]]
    samples: dict[str, int]
    busy_s: dict[str, float]

    def span_s(self) -> tuple[float, float]:
        xs = [x for xy in self.steps.values() for x in xy[0] if x > 0]
        return min(xs), max(xs)


def cdf_panels(histograms: dict[str, dict[str, Any]], phase: str = "restore") -> list[CdfPanel]:
    """A panel per op with samples (a save's in the order its steps run, others in
    stampede.ops' order), from {layout: {op: the sidecar's histogram}}; a layout without
    samples of an op has no line in its panel."""
    panels = []
    for op in dict.fromkeys((*SAVE_ORDER, *OPS) if phase == "save" else OPS):
        steps = {layout: cdf_steps(h[op]["counts"], h[op]["edges_s"])
                 for layout, h in histograms.items() if op in h}
        steps = {layout: xy for layout, xy in steps.items() if any(x > 0 for x in xy[0])}
        if steps:
            found = {layout: histograms[layout][op] for layout in steps}
            panels.append(CdfPanel(op, steps, {layout: sum(h["counts"]) for layout, h in found.items()},
                                   {layout: busy_s(h["counts"], h["edges_s"])
                                    for layout, h in found.items()}))
    return panels


def dominant_op(panels: Sequence[CdfPanel], layout: str) -> tuple[str, float] | None:
    """(the op the layout's ranks spent most time in, its share of their time in ops with
    a timeline phase): pseudo-ops and parts of another op's sample are not time spent."""
    spent = {panel.op: panel.busy_s[layout] for panel in panels
             if layout in panel.busy_s and BY_NAME[panel.op].timeline}
    total = sum(spent.values())
    if not total > 0:
        return None
    op = max(spent, key=lambda name: spent[name])
    return op, spent[op] / total


def shared_span_s(panels: Sequence[CdfPanel]) -> tuple[float, float]:
    """The time range every panel of a small multiple is drawn on (one x axis for all)."""
    spans = [panel.span_s() for panel in panels]
    return min(low for low, _ in spans), max(high for _, high in spans)


# ---- scaling -------------------------------------------------------------------------

Series = dict[str, dict[int, tuple[float, float, float]]]   # label -> nranks -> (median, low, high)
LAST_RANK_SPREAD = ("time_to_last_rank_s", "time_to_last_rank_min_s", "time_to_last_rank_max_s")
GBPS_SPREAD = ("agg_gbps", "agg_gbps_min", "agg_gbps_max")


def summarise(rows: list[Row], column: str, low: str, high: str) -> tuple[float, float, float]:
    """(median of `column`, lowest `low`, highest `high`) over the runs at one rank count;
    an empty spread cell falls back to the value itself."""
    values = [row[column] for row in rows]
    lows = [row[low] for row in rows]
    highs = [row[high] for row in rows]
    return (statistics.median(values),
            min(lo if lo == lo else value for lo, value in zip(lows, values)),
            max(hi if hi == hi else value for hi, value in zip(highs, values)))


def series_label(row: Row, mixed: Sequence[str]) -> str:
    """The layout, with the cache state and job added when the archive mixes them."""
    return row["layout"] + "".join(f", {key} {row[key]}" for key in mixed)


def scaling_series(rows: Sequence[Row], ops: Sequence[str], column: str, low: str, high: str,
                   mixed: Sequence[str]) -> Series:
    """{series label: {nranks: (median, low, high)}} of one metric over rows of `ops` that
    have it, in the archive's order."""
    groups: dict[str, dict[int, list[Row]]] = {}
    for row in rows:
        if row["op"] in ops and row[column] == row[column]:
            groups.setdefault(series_label(row, mixed), {}).setdefault(row["nranks"], []).append(row)
    return {label: {nranks: summarise(group, column, low, high)
                    for nranks, group in sorted(by_ranks.items())}
            for label, by_ranks in groups.items()}


def rank_ticks(ranks: Sequence[int]) -> list[Tick]:
    """The rank counts measured (and the target), each a tick."""
    return [(float(n), str(n)) for n in sorted(set(ranks))]


# ---- timelines -----------------------------------------------------------------------

RANK, ITERATION, START_S, FIRST_BYTE_S, LAST_READ_S, DONE_S = (TIMELINE_COLUMNS.index(name) for name in (
    "rank", "iteration", "start_s", "first_byte_s", "last_read_s", "done_s"))
WHOLE_BAR = "first op to done"   # a sidecar from before the phase columns: one bar per rank


def timeline_rows(stats: dict[str, Any]) -> list[tuple[float, ...]]:
    """The sidecar's timeline rows as floats: the sidecar writes NaN (no such moment, e.g. no
    read on a rank that receives by broadcast) as null."""
    return [tuple(float("nan") if value is None else float(value) for value in row)
            for row in stats.get("timeline") or ()]


def last_done_by_iteration(timeline: Sequence[Sequence[float]]) -> dict[int, float]:
    last: dict[int, float] = {}
    for row in timeline:
        if row[DONE_S] == row[DONE_S]:
            last[int(row[ITERATION])] = max(last.get(int(row[ITERATION]), 0.0), row[DONE_S])
    return last


def median_iteration(timeline: Sequence[Sequence[float]]) -> int:
    """The iteration whose time to last rank (max done_s) is nearest the median (lower on
    ties): a typical iteration, neither the luckiest nor the worst."""
    last_done = last_done_by_iteration(timeline)
    middle = statistics.median_low(last_done.values())
    return min(last_done, key=lambda it: (abs(last_done[it] - middle), it))


def slowest_iteration(timeline: Sequence[Sequence[float]]) -> int:
    """The measured iteration whose last rank was done latest."""
    last = last_done_by_iteration(timeline)
    return max(last, key=lambda it: (last[it], -it)) if last else 0


def rank_segments(row: Sequence[float]) -> list[tuple[str, float, float]]:
    """(phase, start, seconds) end to end from the rank's first op, each phase with time in
    it (stampede.ops.TIMELINE_PHASES' order); a row from before the phase columns is one
    segment from first op to done."""
    x = row[START_S] if row[START_S] == row[START_S] else 0.0
    if len(row) < len(TIMELINE_COLUMNS):
        return [(WHOLE_BAR, x, row[DONE_S] - x)] if row[DONE_S] > x else []
    segments = []
    for index, name in enumerate(TIMELINE_PHASES):
        seconds = row[len(TIMELINE_MOMENTS) + index]
        if seconds > 0:
            segments.append((name, x, seconds))
            x += seconds
    return segments


def phases_present(rows: Sequence[Sequence[float]]) -> list[str]:
    """The phases the rows spend time in, in the drawing order: a timeline's legend shows
    these and no others (a restore without a write has no write in its legend)."""
    found = {name for row in rows for name, _, _ in rank_segments(row)}
    return [name for name in (*TIMELINE_PHASES, WHOLE_BAR) if name in found]


def timeline_span_s(rows: Sequence[Sequence[float]]) -> float:
    """Where a timeline's time axis ends: the last rank done, or the end of a phase after
    it (a save's rank may go on past its durable moment), so that no bar runs out."""
    return max([row[DONE_S] for row in rows if row[DONE_S] == row[DONE_S]]
               + [start + seconds for row in rows for _, start, seconds in rank_segments(row)]
               + [1e-9])
