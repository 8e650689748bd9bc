"""present.figures: the figures' data computed once, drawn by matplotlib (present.plot) and
by the HTML report's SVG (present.html_figures) alike: ticks of every time axis (at least
three labelled), the CDF panels of a phase on one shared axis, the op its ranks spent most
time in, and the timeline's legend naming only the phases drawn. Histograms are made by
the archive's own bucketing (results.histogram) of known durations."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from stampede.ops import TIMELINE_COLOURS, TIMELINE_PHASES
from stampede.present import figures
from stampede.present.html_figures import cdf_grid, timeline_figure
from stampede.results.histogram import histogram
from stampede.units import format_seconds
from tests.helpers import requires


def histogram_of(*durations_s: float) -> dict[str, Any]:
    drawn = histogram(np.array([round(d * 1e9) for d in durations_s], dtype=np.int64))
    return {"counts": list(drawn.counts), "edges_s": list(drawn.edges_s)}


# {layout: {op: histogram}}: stat 10 µs x 10, read 1 ms x 30 (and 2 ms x 10 on sharded)
HISTOGRAMS = {"shared": {"stat": histogram_of(*[10e-6] * 10), "read": histogram_of(*[1e-3] * 30)},
              "sharded": {"stat": histogram_of(*[12e-6] * 10),
                          "read": histogram_of(*[1e-3] * 30, *[2e-3] * 10)}}


@pytest.mark.parametrize(("low_s", "high_s"), [
    (5e-6, 2e-5), (1e-5, 1e-1), (1e-7, 1e3), (1.00e-3, 1.05e-3), (3e-3, 9e-3), (0.5, 40.0)])
def test_a_time_axis_has_at_least_three_labelled_ticks_inside_its_range(low_s: float,
                                                                        high_s: float) -> None:
    for most in (5, figures.MAX_TICKS):
        ticks = figures.log_seconds_ticks(low_s, high_s, most=most)
        values = [value for value, _ in ticks]
        assert figures.MIN_TICKS <= len(ticks) <= most, ticks
        assert values == sorted(values) and low_s <= values[0] and values[-1] <= high_s * (1 + 1e-12)
        assert [label for _, label in ticks] == [format_seconds(value) for value in values]
        assert len({label for _, label in ticks}) == len(ticks), ticks   # no label twice


def test_cdf_panels_share_one_axis_and_name_the_op_that_took_most_time() -> None:
    panels = figures.cdf_panels(HISTOGRAMS)
    assert [panel.op for panel in panels] == ["stat", "read"]            # stampede.ops' order
    read = panels[1]
    assert read.samples == {"shared": 30, "sharded": 40}
    # the bucket's geometric middle: within 1% of the durations' exact sum
    assert read.busy_s["sharded"] == pytest.approx(30e-3 + 20e-3, rel=0.01)
    assert read.busy_s["shared"] == pytest.approx(30e-3, rel=0.01)
    low_s, high_s = figures.shared_span_s(panels)
    assert low_s <= 10e-6 and high_s >= 2e-3 and high_s < 2.2e-3      # both ops inside it
    op, share = figures.dominant_op(panels, "sharded") or ("", 0.0)
    assert op == "read" and share == pytest.approx(50e-3 / (50e-3 + 120e-6), rel=0.01)
    assert figures.dominant_op(panels, "no such layout") is None
    for layout, (xs, ys) in read.steps.items():
        assert ys[0] == 0 and ys[-1] == pytest.approx(1.0) and ys == sorted(ys), layout
        assert xs == sorted(xs) and xs[0] < 1e-3 < xs[-1], layout       # brackets the samples


def test_a_clocks_zeros_start_the_cdf_at_the_first_positive_edge() -> None:
    """Zero durations (a coarse clock) fall in the [0, 1 ns) bucket: on a log axis the
    curve starts at 1 ns at their share, and every sample is in the panel."""
    panel = figures.cdf_panels({"shared": {"stat": histogram_of(*[0.0] * 3, 2e-6)}})[0]
    xs, ys = panel.steps["shared"]
    assert xs[0] == 1e-9 and ys[0] == 0.75 and ys[-1] == 1.0 and min(xs) > 0
    assert panel.samples == {"shared": 4} and panel.busy_s["shared"] == pytest.approx(2e-6, rel=0.01)


def test_matplotlib_and_the_svg_draw_the_same_ticks_from_the_same_panels() -> None:
    requires.module("matplotlib", "PLOT", "pip install -e '.[plot]'")
    from stampede.present.plot import cdf_figure

    run_rows = [{"run_id": "r", "job": "j", "nranks": "2", "cache": "warm", "layout": layout}
                for layout in HISTOGRAMS]
    document = {"run_id": "r", "layouts": {layout: {"stats": {"histograms": h}}
                                           for layout, h in HISTOGRAMS.items()}}
    figure = cdf_figure(run_rows, document, [])
    assert figure is not None
    page = cdf_grid("restore", figures.cdf_panels(HISTOGRAMS), figures.colour_map(list(HISTOGRAMS)))
    expected = [label for _, label in figures.log_seconds_ticks(
        *figures.shared_span_s(figures.cdf_panels(HISTOGRAMS)), most=5)]
    for ax in figure.axes:
        assert [tick.get_text() for tick in ax.get_xticklabels()] == [
            label for _, label in figures.log_seconds_ticks(*ax.get_xlim())]
        assert ax.get_xlim() == pytest.approx(figures.shared_span_s(figures.cdf_panels(HISTOGRAMS)))
    drawn = re.findall(r'font-size="10">([^<]*)</text>', page)
    assert page.count("<svg") == 2 and all(drawn.count(label) == 2 for label in expected)
    assert len(expected) >= figures.MIN_TICKS
    # one colour per layout in both: matplotlib's lines and the SVG's polylines
    colours = figures.colour_map(list(HISTOGRAMS))
    assert {line.get_color() for ax in figure.axes for line in ax.get_lines()} == set(colours.values())
    assert all(f'stroke="{colour}"' in page for colour in colours.values())


def test_the_timeline_legend_names_only_the_phases_drawn() -> None:
    # rank, iteration, start, first byte, last read, done; then a column per phase:
    # metadata and read only (a plain restore: no write, wait, exchange, verify, copy)
    phases = [0.0] * len(TIMELINE_PHASES)
    rows = []
    for rank in range(3):
        seconds = list(phases)
        seconds[0], seconds[1] = 0.001, 0.004 + rank * 0.001
        rows.append([rank, 0, 0.0, 0.002, 0.005, 0.005 + rank * 0.001, *seconds])
    drawn = timeline_figure({"timeline": rows}, ["a", "a", "b"])
    assert drawn is not None
    legend = re.findall(r'<text [^>]*font-size="10">([^<]*)</text>', drawn[0])
    assert legend == ["metadata", "read"]
    assert figures.phases_present([tuple(map(float, row)) for row in rows]) == ["metadata", "read"]
    for name, colour in TIMELINE_COLOURS.items():
        assert (colour in drawn[0]) == (name in ("metadata", "read")), name
