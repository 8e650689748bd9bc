"""The HTML report's figures as inline SVG (no plotting library, nothing fetched), drawn
from present.figures' data, the same the PNGs of present.plot are drawn from: a phase's
latency CDFs as small multiples (a compact panel per op, one shared time axis), the
scaling curves with the contention model's fit and its projection, and the per-rank
timeline of the slowest iteration, each phase a rank spent time in in its own colour
(ops.TIMELINE_COLOURS; the legend names only those). The stdlib only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from stampede.ops import TIMELINE_COLOURS
from stampede.present.figures import (
    DONE_S,
    FRACTION_TICKS,
    ITERATION,
    LAST_RANK_SPREAD,
    RANK,
    CdfPanel,
    Tick,
    linear_ticks,
    log_seconds_ticks,
    phases_present,
    rank_segments,
    rank_ticks,
    scaling_series,
    shared_span_s,
    slowest_iteration,
    timeline_rows,
    timeline_span_s,
)
from stampede.results.cells import Row
from stampede.units import format_seconds

if TYPE_CHECKING:
    from stampede.model.projection import Projection
    from stampede.model.series import Series


@dataclass(frozen=True)
class Box:
    """A figure's size and the margins around its plot area, in SVG pixels."""
    width: int = 640
    height: int = 300
    left: int = 70
    right: int = 20
    top: int = 26
    bottom: int = 44
    font: int = 11


WIDE = Box()
SMALL = Box(width=300, height=180, left=34, right=10, top=22, bottom=30, font=10)


class Axes:
    """A plot area: data -> pixels, log or linear on each axis."""

    def __init__(self, x: tuple[float, float], y: tuple[float, float], log_x: bool = False,
                 log_y: bool = False, box: Box = WIDE) -> None:
        self.x, self.y, self.log_x, self.log_y, self.box = x, y, log_x, log_y, box

    def _frac(self, value: float, span: tuple[float, float], log: bool) -> float:
        low, high = (math.log10(v) for v in span) if log else span
        value = math.log10(max(value, 1e-300)) if log else value
        return (value - low) / (high - low) if high > low else 0.5

    def px(self, value: float) -> float:
        box = self.box
        return box.left + self._frac(value, self.x, self.log_x) * (box.width - box.left - box.right)

    def py(self, value: float) -> float:
        box = self.box
        return (box.height - box.bottom
                - self._frac(value, self.y, self.log_y) * (box.height - box.top - box.bottom))


def svg(body: Sequence[str], title: str, box: Box = WIDE) -> str:
    """One figure: a role=img SVG that scales to the width of what holds it."""
    return (f'<svg class="figure" role="img" viewBox="0 0 {box.width} {box.height}" '
            f'aria-label="{escape(title)}">'
            f'<title>{escape(title)}</title>{"".join(body)}</svg>')


def text(x: float, y: float, words: str, anchor: str = "middle", size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}">'
            f'{escape(words)}</text>')


def frame(axes: Axes, x_label: str, y_label: str, x_ticks: Sequence[Tick],
          y_ticks: Sequence[Tick]) -> list[str]:
    """The box, the ticks and the axis labels."""
    box = axes.box
    bottom, right = box.height - box.bottom, box.width - box.right
    body = [f'<rect x="{box.left}" y="{box.top}" width="{right - box.left}" '
            f'height="{bottom - box.top}" fill="none" stroke="#888"/>']
    for value, label in x_ticks:
        x = axes.px(value)
        body += [f'<line x1="{x:.1f}" y1="{box.top}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>',
                 text(x, bottom + box.font + 3, label, size=box.font)]
    for value, label in y_ticks:
        y = axes.py(value)
        body += [f'<line x1="{box.left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#eee"/>',
                 text(box.left - 4, y + 4, label, "end", box.font)]
    if x_label:
        body.append(text((box.left + right) / 2, box.height - 6, x_label, size=box.font))
    if y_label:
        body.append(f'<text transform="translate(14 {(box.top + bottom) / 2:.0f}) rotate(-90)" '
                    f'text-anchor="middle" font-size="{box.font}">{escape(y_label)}</text>')
    return body


def legend(items: Sequence[tuple[str, str]], y: float = 14, box: Box = WIDE) -> list[str]:
    """A row of coloured swatches along the top."""
    body, x = [], box.left
    for name, colour in items:
        body += [f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{colour}"/>',
                 text(x + 14, y, name, "start", 10)]
        x += 20 + 6 * len(name)
    return body


def html_legend(items: Sequence[tuple[str, str]]) -> str:
    """Swatches as HTML, above a grid of panels that share them."""
    return '<p class="legend">' + "".join(
        f'<span><i style="background:{colour}"></i>{escape(name)}</span>'
        for name, colour in items) + "</p>"


def polyline(points: Sequence[tuple[float, float]], colour: str, dashed: bool = False) -> str:
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    return f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8"{dash}/>'


def cdf_grid(phase: str, panels: Sequence[CdfPanel], palette: dict[str, str]) -> str:
    """A phase's ops as small multiples: one compact CDF per op, every panel on the same
    time axis (so the op that takes longest sits furthest right), the layouts' legend once."""
    if not panels:
        return ""
    span_s = shared_span_s(panels)
    ticks = log_seconds_ticks(*span_s, most=5)
    cells = []
    for panel in panels:
        axes = Axes(span_s, (0.0, 1.0), log_x=True, box=SMALL)
        samples = sorted(set(panel.samples.values()))
        body = frame(axes, "", "", ticks, FRACTION_TICKS)
        body.append(text(SMALL.left, 14, f"{panel.op} (n = {'-'.join(map(str, samples))})",
                         "start", 12))
        for layout, (x_values, y_values) in panel.steps.items():
            points = []
            for index, (x, y) in enumerate(zip(x_values, y_values)):
                if index:
                    points.append((axes.px(x), axes.py(y_values[index - 1])))
                points.append((axes.px(x), axes.py(y)))
            body.append(polyline(points, palette.get(layout, "#333")))
        cells.append(svg(body, f"Latency CDF: {phase} {panel.op}", SMALL))
    drawn = {layout for panel in panels for layout in panel.steps}
    return (html_legend([(layout, colour) for layout, colour in palette.items() if layout in drawn])
            + '<div class="grid">' + "".join(cells) + "</div>")


def scaling_figure(rows: Sequence[Row], op: str, fits: Sequence[tuple[Series, Projection]],
                   target_ranks: int, palette: dict[str, str]) -> str | None:
    """Time to last rank against ranks (log-log), measured medians with their min-max, and
    per fitted layout the model at the measured counts and its projection (with the band)
    to the target."""
    measured = scaling_series(rows, (op,), *LAST_RANK_SPREAD, ())
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
                 rank_ticks(ranks), log_seconds_ticks(min(values) / 1.5, max(values) * 1.5))
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


def timeline_figure(stats: dict[str, Any], hosts: Sequence[str]) -> tuple[str, int] | None:
    """The slowest iteration, a row per rank (and its node): each phase's seconds in its
    colour, end to end from the rank's first op, and a tick where it was done; the legend
    names the phases drawn. A sidecar from before the phase columns gets one bar from
    first op to done."""
    rows = timeline_rows(stats)
    if not rows:
        return None
    iteration = slowest_iteration(rows)
    shown = sorted((row for row in rows if int(row[ITERATION]) == iteration),
                   key=lambda row: row[RANK])
    row_px = 18
    box = Box(height=WIDE.top + WIDE.bottom + row_px * len(shown) + 6)
    longest = timeline_span_s(shown)
    axes = Axes((0.0, longest * 1.05), (0.0, 1.0), box=box)
    body = frame(axes, "seconds since the rank left the start barrier", "",
                 linear_ticks(longest), [])
    for index, row in enumerate(shown):
        y = box.top + 4 + index * row_px
        rank = int(row[RANK])
        node = hosts[rank] if rank < len(hosts) else "?"
        body.append(text(box.left - 4, y + 11, f"{rank} {node}"[:11], "end", 9))
        for name, start, seconds in rank_segments(row):
            colour = TIMELINE_COLOURS.get(name, "#999")
            body.append(f'<rect x="{axes.px(start):.1f}" y="{y}" height="{row_px - 5}" width="'
                        f'{max(axes.px(start + seconds) - axes.px(start), 0.5):.1f}" '
                        f'fill="{colour}"><title>rank {rank} on {escape(node)}: {name} '
                        f'{format_seconds(seconds)}</title></rect>')
        if row[DONE_S] == row[DONE_S]:
            px = axes.px(row[DONE_S])
            body.append(f'<line x1="{px:.1f}" y1="{y - 1}" x2="{px:.1f}" y2="{y + row_px - 4}" '
                        'stroke="#000" stroke-width="1.5"/>')
    body += legend([(name, TIMELINE_COLOURS.get(name, "#999")) for name in phases_present(shown)])
    return svg(body, f"per-rank timeline of measured iteration {iteration}", box), iteration
