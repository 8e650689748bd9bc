"""A sweep planned to a time budget from a short probe (`stampede assess`): the probe is
one prepare and one run of a single iteration at the smallest rank count; every step is
then estimated from it as if its work grew with the rank count (the worst case: ranks
that share CPUs or one storage server), and the plan takes the job's checkpoint size
(else the largest half, quarter, ... of it) with the most iterations that fit the budget
left. Pure: the command probes and runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_ITERATIONS = 2            # fewer gives no spread: compare and the band need a min and a max
SIZE_FACTORS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)
RESERVE_FRACTION = 0.1        # of the budget, kept for the fit, the report and the clean-up


@dataclass(frozen=True)
class Probe:
    """What one iteration at the smallest count cost, wall clock."""

    nranks: int
    wall_s: float             # prepare + run of one measured iteration, launches included
    work_s: float             # of it, the layouts' restores: the sum of their time to last rank

    @property
    def overhead_s(self) -> float:
        """A step's cost besides the iterations: launches, imports, prepare, eviction."""
        return max(self.wall_s - self.work_s, 0.0)


@dataclass(frozen=True)
class Plan:
    counts: tuple[int, ...]
    iterations: int
    warmup: int
    size_factor: float        # of the job's checkpoint size
    estimate_s: float         # the sweep's estimated wall time
    left_s: float             # the budget left for it
    fits: bool

    def describe(self) -> str:
        return (f"{self.iterations} iteration(s) + {self.warmup} warmup at ranks "
                f"{','.join(map(str, self.counts))}, checkpoint size x{self.size_factor:g}: "
                f"estimated {self.estimate_s:.0f} s of the {self.left_s:.0f} s left"
                + ("" if self.fits else " (OVER the budget: the smallest plan)"))


def step_s(probe: Probe, nranks: int, iterations: int, warmup: int, size_factor: float) -> float:
    """One prepare + run at `nranks`, the work scaled by the size and the rank count."""
    scale = max(nranks / probe.nranks, 1.0)
    return scale * (probe.overhead_s + (iterations + warmup) * probe.work_s * size_factor)


def plan_sweep(probe: Probe, counts: Sequence[int], budget_s: float, spent_s: float,
               max_iterations: int, warmup: int, sizes: Sequence[float] = SIZE_FACTORS) -> Plan:
    """The largest size, with the most iterations (down to MIN_ITERATIONS), that fits."""
    left_s = budget_s * (1 - RESERVE_FRACTION) - spent_s
    top = max(max_iterations, MIN_ITERATIONS)
    candidates = [(iterations, factor) for factor in sizes
                  for iterations in range(top, MIN_ITERATIONS - 1, -1)]
    plan = None
    for iterations, factor in candidates:
        estimate = sum(step_s(probe, n, iterations, warmup, factor) for n in counts)
        plan = Plan(tuple(counts), iterations, warmup, factor, estimate, left_s, estimate <= left_s)
        if plan.fits:
            return plan
    assert plan is not None
    return plan
