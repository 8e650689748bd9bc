"""bench/emulator_requests.py: the requests of one measured iteration per rank, counted in
the emulator's log over a run's window, the warmup and set-up cancelled by the difference
from a one-iteration run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stampede.emulate.service import Served

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from emulator_requests import count_requests, counts_text, per_iteration  # noqa: E402


def served(op: str, at_s: float, locked: bool = False) -> Served:
    path = "/shared/checkpoint.raw"
    return Served(op, (path,), (f"file:{path}",) if locked else (), at_s, at_s, at_s + 0.001, 0)


def run_log(start_s: float, nranks: int, iterations: int) -> list[Served]:
    """What a run of `nranks` makes: 2 set-up lookups per rank, then per rank and iteration
    (the warmup among them) a DIR lookup, 6 requests on the file and 1 open on it."""
    log, at = [], start_s
    for _ in range(nranks):
        log += [served("getattr", at), served("getattr", at + 0.01)]
    for _ in range((iterations + 1) * nranks):
        at += 0.01
        log.append(served("getattr", at))
        log += [served("getattr", at + 0.001 * i, locked=True) for i in range(1, 7)]
        log.append(served("open", at + 0.008, locked=True))
    return log


def test_one_iterations_requests_per_rank_are_the_difference_of_two_runs() -> None:
    log = run_log(10.0, 3, 1) + run_log(20.0, 3, 5)
    single, full = count_requests(log, (10.0, 19.0)), count_requests(log, (20.0, 29.0))
    assert single["total"] == 3 * 2 + 2 * 3 * 8 and full["total"] == 3 * 2 + 6 * 3 * 8
    counted = per_iteration([full, full], single, 5, 3)
    assert counted["total"] == 8 and counted["file"] == 7 and counted["other"] == 1
    assert counted["getattr"] == 7 and counted["open"] == 1
    assert counts_text(counted) == "8 (getattr 7, open 1); file 7, other 1"


def test_requests_outside_the_window_are_not_counted() -> None:
    log = run_log(10.0, 1, 1)
    assert count_requests(log, (0.0, 9.99))["total"] == 0


def test_a_difference_needs_two_iterations() -> None:
    counts = {"total": 1.0, "file": 0.0, "other": 1.0}
    with pytest.raises(ValueError, match="at least 2"):
        per_iteration([counts], counts, 1, 1)
