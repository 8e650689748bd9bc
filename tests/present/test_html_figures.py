"""The HTML report's SVG figures from sidecar statistics: the timeline draws each rank's
phases in their colours, and a sidecar from before the phase columns one bar per rank."""

from __future__ import annotations

from stampede.ops import TIMELINE_COLOURS
from stampede.present.html_figures import slowest_iteration, timeline_figure


def test_the_timeline_draws_phases_and_old_sidecars_one_bar() -> None:
    # rank, iteration, start, first byte, last read, done; metadata, read, write, wait,
    # exchange, verify, device copy
    new = {"timeline": [[0, 0, 0.0, 0.1, 0.5, 0.6, 0.1, 0.4, 0, 0, 0, 0.1, 0],
                        [1, 0, 0.0, None, None, 0.7, 0.0, 0.0, 0, 0.2, 0.4, 0.1, 0],
                        [0, 1, 0.0, 0.1, 0.5, 0.9, 0.1, 0.4, 0, 0, 0, 0.4, 0]]}
    drawn = timeline_figure(new, ["node-a", "node-b"])
    assert drawn is not None
    page, iteration = drawn
    assert iteration == 1 == slowest_iteration([tuple(r[:6]) for r in new["timeline"]])
    assert "rank 0 on node-a: verify 400 ms" in page and TIMELINE_COLOURS["verify"] in page
    old = {"timeline": [row[:6] for row in new["timeline"]]}
    drawn = timeline_figure(old, ["node-a", "node-b"])
    assert drawn is not None and "first op to done" in drawn[0]
    assert TIMELINE_COLOURS["verify"] not in drawn[0]
    assert timeline_figure({"timeline": []}, []) is None
