"""project's request-rate table in a narrow terminal (100 columns): a layout's name is never
folded (the rates' names and the keys give way), so each line names its layout whole."""

from __future__ import annotations

import io

from rich.console import Console

from stampede.backends.s3retry import RetryPolicy
from stampede.model.prefix_projection import preset_rates, project_prefixes
from stampede.model.prefix_rate import RunLoad
from stampede.present.report_prefix_rate import render_prefix_rates
from stampede.targets import RATE_PRESETS

LAYOUTS = ("shared", "sharded", "list-first", "list-bcast")


def test_in_a_narrow_terminal_every_line_names_its_layout_whole() -> None:
    runs = [RunLoad(layout, 4, 4, 6, 4 if layout == "list-first" else 1, 1, False, 0, 0.0,
                    0.5, 0.02, gets_per_rank=4, block_bytes=256 * 1024) for layout in LAYOUTS]
    rates = [preset_rates(preset) for preset in RATE_PRESETS.values()]
    items = project_prefixes(runs, rates, 16384, 60.0, lambda: RetryPolicy("standard", 3))
    stream = io.StringIO()
    render_prefix_rates(items, rates, 16384, 60.0, "standard", None,
                        Console(file=stream, width=100, color_system=None))
    lines = stream.getvalue().splitlines()
    named = [line for line in lines if any(f" {layout} " in f" {line} " for layout in LAYOUTS)]
    assert len(named) >= len(items), stream.getvalue()
    for layout in LAYOUTS:
        assert sum(f" {layout} " in f" {line} " for line in lines) >= 3, stream.getvalue()
