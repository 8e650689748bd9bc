"""The sweep planned to a budget from a probe: the job's size with the most iterations
that fit, else a smaller size, else the smallest plan, said to be over."""

from __future__ import annotations

from stampede.model.budget import MIN_ITERATIONS, Probe, plan_sweep, step_s


def test_the_plan_fits_the_budget_or_says_it_does_not() -> None:
    # prepare 1 s, run 2 s: 1 s of overhead and 1 s of restores per iteration
    probe = Probe(nranks=1, prepare_s=1.0, run_s=2.0, work_s=1.0)
    assert step_s(probe, 2, 3, 1, 1.0) == 1.0 + 2 * (1.0 + 4 * 1.0)   # a total size: prepare stays
    assert step_s(probe, 2, 3, 1, 1.0, per_rank_size=True) == 2.0 + 2 * (1.0 + 4 * 1.0)
    small = Probe(nranks=1, prepare_s=1.0, run_s=2.0, work_s=1.0, size_factor=0.125)
    assert step_s(small, 1, 1, 0, 1.0) == 8.0 + 1.0 + 8.0              # bytes scaled from the probe's
    roomy = plan_sweep(probe, (1, 2, 4), budget_s=1000, spent_s=3, max_iterations=5, warmup=1)
    assert roomy.fits and (roomy.iterations, roomy.size_factor) == (5, 1.0)
    tight = plan_sweep(probe, (1, 2, 4), budget_s=60, spent_s=3, max_iterations=5, warmup=1)
    assert tight.fits and tight.estimate_s <= tight.left_s
    assert (tight.iterations, tight.size_factor) < (5, 1.0) or tight.size_factor < 1.0
    over = plan_sweep(probe, (1, 2, 4), budget_s=10, spent_s=3, max_iterations=5, warmup=1)
    assert not over.fits and over.iterations == MIN_ITERATIONS and "OVER" in over.describe()


def test_a_probed_save_is_estimated_as_the_run_is() -> None:
    # save 3 s: 1 s of overhead and 2 s of saves per iteration, both by the rank count
    probe = Probe(nranks=1, prepare_s=1.0, run_s=2.0, work_s=1.0, save_s=3.0, save_work_s=2.0)
    assert probe.save_overhead_s == 1.0
    assert step_s(probe, 2, 3, 1, 1.0) == 1.0 + 2 * (1.0 + 4 * 1.0 + 1.0 + 4 * 2.0)
    restores_only = Probe(nranks=1, prepare_s=1.0, run_s=2.0, work_s=1.0)
    assert plan_sweep(probe, (1, 2, 4), 200, 3, 5, 1).estimate_s > \
        plan_sweep(restores_only, (1, 2, 4), 200, 3, 5, 1).estimate_s
