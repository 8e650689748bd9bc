"""A sweep planned to a time budget from a short probe (`stampede assess`): the probe is
one prepare, one run and (where the sweep saves) one save of a single iteration at the
smallest rank count, at PROBE_FACTOR of the checkpoint size where the job allows it; every
step is then estimated from it (step_s: linear in the bytes, and the run and the save as if
their work grew with the rank count, the worst case of ranks that share CPUs or one
storage server), and the plan takes the job's
checkpoint size (else the largest half, quarter, ... of it) with the most iterations that
fit the budget left. Pure: the command probes and runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_ITERATIONS = 2            # fewer gives no spread: compare and the band need a min and a max
PROBE_FACTOR = 0.125          # of the job's checkpoint size: a probe that costs little
SIZE_FACTORS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)
RESERVE_FRACTION = 0.1        # of the budget, kept for the fit, the report and the clean-up


@dataclass(frozen=True)
class Probe:
    """What one iteration at the smallest count cost, wall clock, at a fraction of the size."""

    nranks: int
    prepare_s: float          # the prepare step, its launch included
    run_s: float              # the run step of one measured iteration, its launch included
    work_s: float             # of it, the layouts' restores: the sum of their time to last rank
    size_factor: float = 1.0  # of the job's checkpoint size the probe ran with
    save_s: float = 0.0       # the save step of one iteration, its launch included (0: no save)
    save_work_s: float = 0.0  # of it, the layouts' saves: the sum of their time to last rank

    @property
    def overhead_s(self) -> float:
        """The run step's cost besides the iteration: launch, imports, set-up, eviction."""
        return max(self.run_s - self.work_s, 0.0)

    @property
    def save_overhead_s(self) -> float:
        """The save step's cost besides the iteration (launch, set-up, the journal)."""
        return max(self.save_s - self.save_work_s, 0.0)


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


def step_s(probe: Probe, nranks: int, iterations: int, warmup: int, size_factor: float,
           per_rank_size: bool = False) -> float:
    """One prepare + run (+ save) at `nranks`: the prepare scaled by the bytes written (a
    total size stays, a per-rank one grows with the ranks), the run's and the save's launch
    and iterations by the rank count (the worst case), and everything size-dependent
    linearly from the probe's size (its fixed costs scaled too: an overestimate)."""
    ranks = max(nranks / probe.nranks, 1.0)
    size = size_factor / probe.size_factor
    saves = probe.save_overhead_s + (iterations + warmup) * probe.save_work_s * size \
        if probe.save_s > 0 else 0.0
    return (probe.prepare_s * size * (ranks if per_rank_size else 1.0)
            + ranks * (probe.overhead_s + (iterations + warmup) * probe.work_s * size + saves))


def plan_sweep(probe: Probe, counts: Sequence[int], budget_s: float, spent_s: float,
               max_iterations: int, warmup: int, sizes: Sequence[float] = SIZE_FACTORS,
               per_rank_size: bool = False) -> Plan:
    """The largest size, with the most iterations (down to MIN_ITERATIONS), that fits."""
    left_s = budget_s * (1 - RESERVE_FRACTION) - spent_s
    top = max(max_iterations, MIN_ITERATIONS)
    candidates = [(iterations, factor) for factor in sizes
                  for iterations in range(top, MIN_ITERATIONS - 1, -1)]
    plan = None
    for iterations, factor in candidates:
        estimate = sum(step_s(probe, n, iterations, warmup, factor, per_rank_size)
                       for n in counts)
        plan = Plan(tuple(counts), iterations, warmup, factor, estimate, left_s, estimate <= left_s)
        if plan.fits:
            return plan
    assert plan is not None
    return plan
