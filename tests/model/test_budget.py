"""The sweep planned to a budget from a probe: the job's size with the most iterations
that fit, else a smaller size, else the smallest plan, said to be over."""

from __future__ import annotations

from stampede.model.budget import MIN_ITERATIONS, Probe, plan_sweep, step_s


def test_the_plan_fits_the_budget_or_says_it_does_not() -> None:
    probe = Probe(nranks=1, wall_s=3.0, work_s=1.0)      # 2 s of overhead, 1 s per iteration
    assert step_s(probe, 2, 3, 1, 1.0) == 2 * (2.0 + 4 * 1.0)
    roomy = plan_sweep(probe, (1, 2, 4), budget_s=1000, spent_s=3, max_iterations=5, warmup=1)
    assert roomy.fits and (roomy.iterations, roomy.size_factor) == (5, 1.0)
    tight = plan_sweep(probe, (1, 2, 4), budget_s=60, spent_s=3, max_iterations=5, warmup=1)
    assert tight.fits and tight.estimate_s <= tight.left_s
    assert (tight.iterations, tight.size_factor) < (5, 1.0) or tight.size_factor < 1.0
    over = plan_sweep(probe, (1, 2, 4), budget_s=10, spent_s=3, max_iterations=5, warmup=1)
    assert not over.fits and over.iterations == MIN_ITERATIONS and "OVER" in over.describe()
