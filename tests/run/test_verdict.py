"""The verdict on a phase (stampede.run.verdict), without MPI: what every rank decides
from the same reduced totals."""

from __future__ import annotations

from stampede.run.verdict import Totals, iteration_name, judge


def totals(**given: int) -> Totals:
    return Totals(**{"errors": 0, "ops": 100, "timed_out": 0, "incomplete": 0, "corrupt": 0,
                     **given})


def test_a_clean_phase_is_valid_and_goes_on() -> None:
    verdict = judge(totals(), 0, 1, "", 0.0, 600.0)
    assert verdict.invalid_reason == "" and not verdict.stop


def test_wrong_bytes_are_never_tolerated_but_measuring_goes_on() -> None:
    verdict = judge(totals(corrupt=2), 1, 1, "", 0.5, 600.0)
    assert not verdict.stop
    assert verdict.invalid_reason == ("2 rank(s) read bytes that differ from the checkpoint in "
                                      "iteration 2 (run.verify / check_finite)")
    again = judge(totals(corrupt=2), 2, 1, verdict.invalid_reason, 0.5, 600.0)
    assert again.invalid_reason == verdict.invalid_reason   # said once, not per iteration


def test_missing_bytes_make_the_layout_invalid() -> None:
    verdict = judge(totals(incomplete=1), -1, 2, "", 0.5, 600.0)
    assert verdict.invalid_reason == ("1 rank(s) did not hold all their bytes in warmup "
                                      "iteration 2 of 2")
    assert not verdict.stop


def test_failed_ops_past_the_tolerated_fraction_stop_every_rank() -> None:
    tolerated = judge(totals(errors=5), 0, 1, "", 0.05, 600.0)
    assert not tolerated.stop and tolerated.invalid_reason == ""
    stopped = judge(totals(errors=6), 3, 1, "", 0.05, 600.0)
    assert stopped.stop
    assert stopped.invalid_reason == ("6 of 100 ops failed in iteration 4 "
                                      "(run.max_error_fraction = 0.05)")


def test_a_deadline_stops_and_keeps_what_was_found_before() -> None:
    verdict = judge(totals(timed_out=3, incomplete=3), 0, 0, "", 0.0, 30.0)
    assert verdict.stop
    assert verdict.invalid_reason == ("deadline of 30 s reached in iteration 1 on 3 rank(s); "
                                      "3 rank(s) did not hold all their bytes in iteration 1")


def test_iterations_are_named_as_the_user_counts_them() -> None:
    assert iteration_name(-2, 2) == "warmup iteration 1 of 2"
    assert iteration_name(-1, 2) == "warmup iteration 2 of 2"
    assert iteration_name(0, 2) == "iteration 1"
