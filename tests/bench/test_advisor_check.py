"""bench/advisor_check.py's verdicts: the advised layout against the measured best (MATCH,
TIE within the best's own iteration spread, MISS), and the predicted time against the
measured one (PASS within the tolerance; an upper bound only checked from one side)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from advisor_check import Config, Row  # noqa: E402

CONFIG = Config(4, "1MiB", "warm", 0.0)
# layout: (median, min, max) of the time to last rank at N, seconds
MEASURED = {"sharded": (0.100, 0.095, 0.110), "shared": (0.105, 0.108, 0.120),
            "whole-file": (0.200, 0.190, 0.210)}


def row(advised: str, predicted_s: float, upper_bound: bool = False) -> Row:
    return Row(CONFIG, advised, predicted_s, upper_bound, MEASURED, {})


def test_the_advised_layout_measured_best_is_a_match() -> None:
    assert row("sharded", 0.1).best == "sharded" and row("sharded", 0.1).choice == "MATCH"


def test_another_layout_within_the_bests_iteration_spread_is_a_tie() -> None:
    assert row("shared", 0.1).choice == "TIE"      # its fastest iteration 108 <= the best's slowest 110


def test_a_layout_beyond_the_bests_spread_is_a_miss() -> None:
    assert row("whole-file", 0.2).choice == "MISS"


def test_the_time_passes_within_the_tolerance_either_side_and_fails_beyond() -> None:
    assert row("sharded", 0.110).time_verdict(0.15) == "PASS"     # error -10%
    assert row("sharded", 0.090).time_verdict(0.15) == "PASS"     # error +10%
    assert row("sharded", 0.120).time_verdict(0.15) == "FAIL"     # error -20%
    assert row("sharded", 0.080).time_verdict(0.15) == "FAIL"     # error +20%


def test_an_upper_bound_holds_at_or_above_the_measurement_only() -> None:
    assert row("sharded", 0.300, upper_bound=True).time_verdict(0.15) == "upper bound: holds"
    assert row("sharded", 0.050, upper_bound=True).time_verdict(0.15) == (
        "upper bound: BELOW the measurement")
