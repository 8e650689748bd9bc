"""bench/sizing_check.py's verdict fails both ways: a sized server slower than the asked
time beyond the tolerance, and one faster beyond it (the sizing asked for far more server
than the time needs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The benches import their helpers as `common`, from bench/ on sys.path as when run.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from sizing_check import verdict  # noqa: E402

TOLERANCE = 0.10


@pytest.mark.parametrize("error", [0.0, 0.05, -0.05, TOLERANCE, -TOLERANCE])
def test_within_the_tolerance_either_side_passes(error: float) -> None:
    assert verdict(error, TOLERANCE) == "PASS: meets it"


@pytest.mark.parametrize("error", [0.101, 0.5])
def test_slower_than_asked_beyond_the_tolerance_fails(error: float) -> None:
    assert verdict(error, TOLERANCE) == "FAIL: misses it"


@pytest.mark.parametrize("error", [-0.101, -0.375])
def test_faster_than_asked_beyond_the_tolerance_fails(error: float) -> None:
    assert verdict(error, TOLERANCE) == "FAIL: over-delivers, a larger server than needed"


def test_a_wider_tolerance_passes_what_a_narrow_one_fails() -> None:
    assert verdict(-0.375, 0.40) == "PASS: meets it"
    assert verdict(-0.375, 0.30).startswith("FAIL")
