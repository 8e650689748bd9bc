"""The verdict on one phase, from the totals every rank holds after the end-of-phase
reduction: pure, so every rank takes the same decision (nothing hangs), and a unit test
checks it without MPI.

- Wrong bytes (run.verify, run.check_finite) are never tolerated, whatever
  run.max_error_fraction says: a restore of wrong bytes is not a restore.
- Missing bytes (a rank that does not hold all of its bytes) make the layout invalid,
  but measuring goes on: failed ops are tolerated up to max_error_fraction, missing bytes
  never.
- A deadline reached on any rank, or more failed ops than max_error_fraction of all
  ops, stops the layout's iterations on every rank.
"""

from __future__ import annotations

from typing import NamedTuple


class Totals(NamedTuple):
    """One phase summed over all ranks (the end-of-phase allreduce)."""

    errors: int          # failed ops
    ops: int             # storage ops issued, failed ones included
    timed_out: int       # ranks that reached the deadline
    incomplete: int      # ranks that do not hold all their bytes
    corrupt: int         # ranks that read bytes that differ from the checkpoint
    cached: int = 0      # bytes to read found in the page cache after a cold eviction
    asked: int = 0       # bytes to read whose residency was asked
    interrupted: int = 0  # ranks that received SIGTERM or SIGINT (stampede.run.interrupt)


class Verdict(NamedTuple):
    invalid_reason: str  # "" while valid; every reason found so far, joined
    stop: bool           # no further iteration of this layout


# What a failed rank did, in a restore and in a save (stampede.run.save).
WORDS = {
    "restore": {"corrupt": "read bytes that differ from the checkpoint",
                "checked": "run.verify / check_finite",
                "incomplete": "did not hold all their bytes"},
    "save": {"corrupt": "wrote bytes that differ when read back", "checked": "save.validate",
             "incomplete": "did not make all their bytes durable"},
}


def judge(totals: Totals, iteration: int, warmup: int, reason: str, max_error_fraction: float,
          deadline_s: float, phase: str = "restore") -> Verdict:
    """The layout's verdict after this phase, given what earlier phases found (`reason`).
    Iterations count as run_layout counts them: -warmup..-1 for warmups, then 0, 1, ..."""
    name = iteration_name(iteration, warmup)
    words = WORDS[phase]
    if totals.corrupt and "differ" not in reason:
        reason = "; ".join(filter(None, (
            reason, f"{totals.corrupt} rank(s) {words['corrupt']} in {name} "
                    f"({words['checked']})")))
    if totals.interrupted:
        return Verdict("; ".join(filter(None, (
            f"interrupted (SIGTERM or SIGINT) in {name}: not measured to the end", reason))),
            stop=True)
    if totals.incomplete and not reason:
        reason = f"{totals.incomplete} rank(s) {words['incomplete']} in {name}"
    if totals.timed_out or totals.errors > max_error_fraction * totals.ops:
        stopped = (f"deadline of {deadline_s:g} s reached in {name} on "
                   f"{totals.timed_out} rank(s)" if totals.timed_out else
                   f"{totals.errors} of {totals.ops} ops failed in {name} "
                   f"(run.max_error_fraction = {max_error_fraction:g})")
        return Verdict("; ".join(filter(None, (stopped, reason))), stop=True)
    return Verdict(reason, stop=False)


def iteration_name(iteration: int, warmup: int) -> str:
    """An iteration as the user counts it: "warmup iteration 1 of 2", "iteration 3"."""
    if iteration < 0:
        return f"warmup iteration {iteration + warmup + 1} of {warmup}"
    return f"iteration {iteration + 1}"
