"""The HTML report's figures as inline SVG, drawn here from the archive and its sidecar
(no plotting library, nothing fetched): the latency CDFs (plot.cdf_steps of the sidecar's
histograms), the scaling curves (plot.scaling_series) with the contention model's fit
and its projection, and the per-rank timeline of the slowest iteration, each rank's time
in each phase (ops.TIMELINE_PHASES) in its own colour. The stdlib only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from stampede.ops import TIMELINE_COLOURS, TIMELINE_PHASES
from stampede.present.plot import cdf_steps, scaling_series, timeline_rows
from stampede.results.model import TIMELINE_COLUMNS, TIMELINE_MOMENTS
from stampede.units import format_seconds

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 300, 70, 20, 26, 44


def colours(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[index % len(PALETTE)] for index, name in enumerate(dict.fromkeys(names))}


class Axes:
    """A plot area: data -> pixels, log or linear on each axis."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float], log_x: bool = False,
                 log_y: bool = False, height: int = HEIGHT) -> None:
        self.x, self.y, self.log_x, self.log_y, self.height = x, y, log_x, log_y, height

    def _frac(self, value: float, span: tuple[float, float], log: bool) -> float:
        low, high = (math.log10(v) for v in span) if log else span
        value = math.log10(max(value, 1e-300)) if log else value
        return (value - low) / (high - low) if high > low else 0.5

    def px(self, value: float) -> float:
        return LEFT + self._frac(value, self.x, self.log_x) * (WIDTH - LEFT - RIGHT)

    def py(self, value: float) -> float:
        return self.height - BOTTOM - self._frac(value, self.y, self.log_y) * (self.height - TOP - BOTTOM)


def svg(body: Sequence[str], title: str, height: int = HEIGHT) -> str:
    """One figure: a role=img SVG that scales to the page's width."""
    return (f'<svg class="figure" role="img" viewBox="0 0 {WIDTH} {height}" '
            f'aria-label="{escape(title)}">'
            f'<title>{escape(title)}</title>{"".join(body)}</svg>')


def text(x: float, y: float, words: str, anchor: str = "middle", size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}">'
            f'{escape(words)}</text>')


def frame(axes: Axes, x_label: str, y_label: str, x_ticks: Sequence[tuple[float, str]],
          y_ticks: Sequence[tuple[float, str]]) -> list[str]:
    """The box, the ticks and the axis labels."""
    bottom = axes.height - BOTTOM
    body = [f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{bottom - TOP}" '
            'fill="none" stroke="#888"/>']
    for value, label in x_ticks:
        x = axes.px(value)
        body += [f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>',
                 text(x, bottom + 14, label)]
    for value, label in y_ticks:
        y = axes.py(value)
        body += [f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eee"/>',
                 text(LEFT - 4, y + 4, label, "end")]
    body += [text((LEFT + WIDTH - RIGHT) / 2, axes.height - 8, x_label),
             f'<text transform="translate(14 {(TOP + bottom) / 2:.0f}) rotate(-90)" '
             f'text-anchor="middle" font-size="11">{escape(y_label)}</text>']
    return body


def legend(items: Sequence[tuple[str, str]], y: float = 14) -> list[str]:
    """A row of coloured swatches along the top."""
    body, x = [], LEFT
    for name, colour in items:
        body += [f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>',
                 text(x + 14, y, name, "start", 10)]
        x += 20 + 6 * len(name)
    return body


def decade_ticks(low: float, high: float) -> list[tuple[float, str]]:
    return [(10.0 ** e, format_seconds(10.0 ** e))
            for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
            if low <= 10.0 ** e <= high]


def polyline(points: Sequence[tuple[float, float]], colour: str, dashed: bool = False) -> str:
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"{dash}/>'


def cdf_figure(op: str, by_layout: dict[str, dict[str, Any]], palette: dict[str, str]) -> str | None:
    """One op's latency CDF, a step line per layout, from the sidecar's histograms."""
    steps = {layout: cdf_steps(h["counts"], h["edges_s"]) for layout, h in by_layout.items()}
    steps = {layout: xy for layout, xy in steps.items() if xy[0]}
    if not steps:
        return None
    xs = [x for xy in steps.values() for x in xy[0] if x > 0]
    axes = Axes((min(xs), max(xs)), (0.0, 1.0), log_x=True)
    body = frame(axes, f"{op} latency (log scale)", "fraction of samples below",
                 decade_ticks(min(xs), max(xs)), [(v, f"{v:.2g}") for v in (0, 0.5, 0.9, 1.0)])
    for layout, (x_values, y_values) in steps.items():
        points = []
        for index, (x, y) in enumerate(zip(x_values, y_values)):
            if index:
                points.append((axes.px(x), axes.py(y_values[index - 1])))
            points.append((axes.px(x), axes.py(y)))
        body.append(polyline(points, palette[layout]))
    body += legend([(layout, palette[layout]) for layout in steps])
    return svg(body, f"latency CDF of {op}")


def scaling_figure(rows: list[dict[str, str]], op: str, fits: Sequence[tuple[Any, Any]],
                   target_ranks: int, palette: dict[str, str]) -> str | None:
    """Time to last rank against ranks (log-log), measured medians with their min-max, and
    per fitted layout the model at the measured counts and its projection (with the band)
    to the target."""
    spread = ("time_to_last_rank_s", "time_to_last_rank_min_s", "time_to_last_rank_max_s")
    measured = scaling_series(rows, (op,), *spread, ())
    if not measured or len({n for points in measured.values() for n in points}) < 2:
        return None
    ranks = sorted({n for points in measured.values() for n in points} | (
        {target_ranks} if fits else set()))
    values = [v for points in measured.values() for p in points.values() for v in p if v > 0]
    values += [v for _, projection in fits for v in (*projection.band, projection.prediction.total_s)
               if v > 0]
    axes = Axes((ranks[0] / 1.3, ranks[-1] * 1.3), (min(values) / 1.5, max(values) * 1.5),
                log_x=True, log_y=True)
    body = frame(axes, "MPI ranks (log scale)", f"time to last rank of the {op}",
                 [(n, str(n)) for n in ranks], decade_ticks(min(values) / 1.5, max(values) * 1.5))
    for layout, points in measured.items():
        colour = palette.get(layout, "#333")
        for n, (median, low, high) in points.items():
            x = axes.px(n)
            body += [f'<line x1="{x:.1f}" y1="{axes.py(low):.1f}" x2="{x:.1f}" '
                     f'y2="{axes.py(high):.1f}" stroke="{colour}"/>',
                     f'<circle cx="{x:.1f}" cy="{axes.py(median):.1f}" r="3.5" fill="{colour}"/>']
    for series, projection in fits:
        colour = palette.get(series.layout, "#333")
        fit = projection.fit
        model = [(axes.px(p.nranks), axes.py(m)) for p, m in zip(fit.points, fit.last_model_s)]
        target = (axes.px(target_ranks), axes.py(projection.prediction.total_s))
        low, high = projection.band
        body += [polyline(model, colour), polyline([model[-1], target], colour, dashed=True),
                 f'<line x1="{target[0]:.1f}" y1="{axes.py(low):.1f}" x2="{target[0]:.1f}" '
                 f'y2="{axes.py(high):.1f}" stroke="{colour}" stroke-width="3" opacity="0.5"/>',
                 f'<rect x="{target[0] - 3:.1f}" y="{target[1] - 3:.1f}" width="6" height="6" '
                 f'fill="{colour}"/>']
    body += legend([(layout, palette.get(layout, "#333")) for layout in measured])
    return svg(body, f"scaling of the {op}: time to last rank against ranks")


def slowest_iteration(timeline: Sequence[Sequence[float]]) -> int:
    """The measured iteration whose last rank was done latest."""
    done = TIMELINE_COLUMNS.index("done_s")
    last: dict[int, float] = {}
    for row in timeline:
        if row[done] == row[done]:
            last[int(row[1])] = max(last.get(int(row[1]), 0.0), row[done])
    return max(last, key=lambda it: (last[it], -it)) if last else 0


def timeline_figure(stats: dict[str, Any], hosts: Sequence[str]) -> tuple[str, int] | None:
    """The slowest iteration, a row per rank (and its node): each phase's seconds in its
    colour, end to end from the rank's first op, and a tick where it was done. A sidecar
    from before the phase columns gets one bar from first op to done."""
    rows = timeline_rows(stats)
    if not rows:
        return None
    iteration = slowest_iteration(rows)
    shown = sorted((row for row in rows if int(row[1]) == iteration), key=lambda row: row[0])
    start, done = TIMELINE_MOMENTS.index("start_s"), TIMELINE_MOMENTS.index("done_s")
    phased = all(len(row) >= len(TIMELINE_COLUMNS) for row in shown)
    row_px = 18
    height = TOP + BOTTOM + row_px * len(shown) + 6
    longest = max((row[done] for row in shown if row[done] == row[done]), default=1e-9)
    axes = Axes((0.0, longest * 1.05), (0.0, 1.0), height=height)
    ticks = [(longest * f, format_seconds(longest * f)) for f in (0, 0.25, 0.5, 0.75, 1.0)]
    body = frame(axes, "seconds since the rank left the start barrier", "", ticks, [])
    for index, row in enumerate(shown):
        y = TOP + 4 + index * row_px
        rank = int(row[0])
        node = hosts[rank] if rank < len(hosts) else "?"
        body.append(text(LEFT - 4, y + 11, f"{rank} {node}"[:11], "end", 9))
        x = row[start] if row[start] == row[start] else 0.0
        segments = ([(name, row[len(TIMELINE_MOMENTS) + i]) for i, name in enumerate(TIMELINE_PHASES)]
                    if phased else [("first op to done", row[done] - x)])
        for name, seconds in segments:
            if not seconds > 0:
                continue
            colour = TIMELINE_COLOURS.get(name, "#999")
            body.append(f'<rect x="{axes.px(x):.1f}" y="{y}" height="{row_px - 5}" width="'
                        f'{max(axes.px(x + seconds) - axes.px(x), 0.5):.1f}" fill="{colour}">'
                        f'<title>rank {rank} on {escape(node)}: {name} '
                        f'{format_seconds(seconds)}</title></rect>')
            x += seconds
        if row[done] == row[done]:
            px = axes.px(row[done])
            body.append(f'<line x1="{px:.1f}" y1="{y - 1}" x2="{px:.1f}" y2="{y + row_px - 4}" '
                        'stroke="#000" stroke-width="1.5"/>')
    names = list(TIMELINE_PHASES) if phased else ["first op to done"]
    body += legend([(name, TIMELINE_COLOURS.get(name, "#999")) for name in names])
    return svg(body, f"per-rank timeline of measured iteration {iteration}", height), iteration
