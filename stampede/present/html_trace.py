"""The HTML report's figures of a run's trace (--trace, stampede.results.trace), when the
run shown has one: per phase, the slowest iteration of each layout over time, in
segments: the bytes moved (GB/s) and how many ranks were inside a storage op (the storm's
shape); and per layout a heat map, rank by time, of the share of each segment each rank
spent inside a storage op (where the stragglers were, and when). Inline SVG
(present.html_figures' frame), the stdlib and numpy only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stampede.present.figures import linear_ticks
from stampede.present.html_figures import WIDE, Axes, Box, frame, legend, polyline, svg
from stampede.results import trace as traces
from stampede.units import NS_PER_S, format_number

if TYPE_CHECKING:
    import numpy as np

    from stampede.results.trace import Segment, Trace

SEGMENTS = 40


def trace_figures(trace: Trace, palette: dict[str, str]) -> list[str]:
    """Per phase: (title, svg) of GB/s over time, then of ranks inside a storage op."""
    found = []
    by_phase: dict[str, dict[str, list[Segment]]] = {}
    for key, rows in trace.layouts.items():
        phase, _, layout = key.partition("/")
        slowest = rows[rows[:, traces.ITERATION] == traces.slowest_iteration(trace, rows)]
        by_phase.setdefault(phase, {})[layout] = traces.segments(trace, slowest, SEGMENTS)
    for key, rows in trace.layouts.items():
        slowest = rows[rows[:, traces.ITERATION] == traces.slowest_iteration(trace, rows)]
        figure = heat_map(trace, key, slowest)
        if figure:
            found.append(figure)
    for phase, layouts in by_phase.items():
        span_s = max((s.stop_ns for segments in layouts.values() for s in segments),
                     default=0) / NS_PER_S
        if span_s <= 0:
            continue
        for what, value, unit in (("throughput", lambda s: s.gbps, "GB/s"),
                                  ("ranks inside a storage op", lambda s: s.inside_mean,
                                   "ranks (mean per segment)")):
            top = max((value(s) for segments in layouts.values() for s in segments), default=0)
            if top <= 0:
                continue
            axes = Axes((0.0, span_s), (0.0, top * 1.05))
            body = frame(axes, f"time since the {phase}'s start (slowest iteration)", unit,
                         linear_ticks(span_s), linear_ticks(top, format_number))
            for layout, segments in layouts.items():
                points = [(axes.px((s.start_ns + s.stop_ns) / 2e9), axes.py(value(s)))
                          for s in segments]
                body.append(polyline(points, palette.get(layout, "#333")))
            body += legend([(layout, palette.get(layout, "#333")) for layout, segments in layouts.items()
                            if any(value(s) > 0 for s in segments)])
            title = f"{phase} over time: {what}"
            found.append((title, svg(body, title)))
    return [f"<h3>{title}</h3>{figure}" for title, figure in found]


def heat_map(trace: Trace, key: str, rows: np.ndarray) -> tuple[str, str] | None:
    """(title, svg): a row per rank (or band of ranks), a column per segment, each cell
    as dark as the share of the segment the rank spent inside a storage op."""
    labels, busy = traces.rank_busy(trace, rows, SEGMENTS)
    if not labels or not len(rows):
        return None
    span_s = float(rows[:, traces.STOP].max()) / NS_PER_S
    cell_h = max(3.0, min(18.0, 240.0 / len(labels)))
    box = Box(height=int(WIDE.top + cell_h * len(labels) + WIDE.bottom))
    axes = Axes((0.0, span_s), (0.0, float(len(labels))), box=box)
    step = max(1, len(labels) // 8)
    ticks_y = [(len(labels) - index - 0.5, labels[index].removeprefix("rank "))
               for index in range(0, len(labels), step)]
    body = frame(axes, "time since the phase's start (slowest iteration); darker: more of "
                 "the segment inside a storage op", "rank", linear_ticks(span_s), ticks_y)
    width = (box.width - box.left - box.right) / busy.shape[1]
    for index, row in enumerate(busy):
        y = box.top + index * cell_h
        for column, value in enumerate(row):
            if value > 0:
                body.append(f'<rect x="{box.left + column * width:.1f}" y="{y:.1f}" '
                            f'width="{width:.1f}" height="{cell_h:.1f}" fill="#1f77b4" '
                            f'fill-opacity="{min(float(value), 1.0):.2f}"/>')
    title = f"{key}: ranks inside a storage op over time"
    return title, svg(body, title, box)
