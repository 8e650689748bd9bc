"""MLPerf Storage's checkpointing metrics and rules, beside stampede's own: pure, no MPI.

MLPerf's numbers, from a cycle of layout mlperf (K saves, then K restores):

- duration of one checkpoint = its slowest rank's (time to last rank: phase start, every
  rank past a barrier, to the last rank's bytes durable, or held); MLPerf's throughput
  of a phase = the checkpoint's bytes over its mean duration (every checkpoint's bytes
  over the time the slowest rank took), and `slowest_rank_GB_per_second` = the least of
  the ranks' own (a rank's bytes over its median time).
- DLIO's summary (`save_checkpoint_io_mean_GB_per_second`, ...) is the mean of the
  per-checkpoint rates (checkpoint bytes / duration, each checkpoint), as DLIO's
  statscounter computes it, in its GB of 2**30 bytes; a mean of rates weighs a fast
  checkpoint as much as a slow one, so it is at or above the throughput.

The rules, as MLPerf's reviewers check them:

- cache: a host that wrote less than 3x its memory must not read from its page cache:
  the share of the bytes to read that was resident, measured (mincore) before each
  restore, must stay at most RESIDENT_MAX.
- gap: the reads start within 30 s of the writes ending.
- rank shift: every rank reads what a rank on another host wrote (recovery).

A run that breaks a rule, or is scaled, a subset or at another rank count, is not
comparable with submissions, and says why.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from stampede.spec import WORKLOAD_RANKS
from stampede.units import BYTES_PER_GIB

NOT_COMPARABLE = "not comparable with submissions"
CACHE_FACTOR = 3           # the rules: clear the cache when a host wrote < 3x its RAM
GAP_MAX_S = 30.0           # the rules: reads within 30 s of the writes
RESIDENT_MAX = 0.01        # what stampede calls cleared: at most 1% of the bytes resident
GB = BYTES_PER_GIB         # DLIO's "GB"


def comparability(workload: str, nranks: int, subset: bool, scale: Fraction) -> list[str]:
    """Why a run of this workload is not a submission's ([] when it is)."""
    closed = WORKLOAD_RANKS[workload]
    why = []
    if scale != 1:
        why.append(f"sizes scaled by {scale}")
    if subset and nranks < closed:
        why.append(f"subset: {nranks} of {closed} ranks")
    elif nranks != closed:
        why.append(f"{nranks} ranks, not the workload's {closed}")
    return why


def comparability_note(workload: str, nranks: int, subset: bool, scale: Fraction) -> str:
    """One line for every output of a run that is not comparable ("" when it is)."""
    why = comparability(workload, nranks, subset, scale)
    return f"mlperf {workload}: {'; '.join(why)}: {NOT_COMPARABLE}" if why else ""


@dataclass(frozen=True)
class Rule:
    name: str          # cache, gap, rank_shift
    ok: bool
    detail: str


def cache_rule(written_bytes: dict[str, int], memory_bytes: dict[str, int],
               resident: Sequence[float]) -> Rule:
    """written and memory per host; resident: per restore, the share resident before it."""
    small = sorted(host for host, nbytes in written_bytes.items()
                   if nbytes < CACHE_FACTOR * memory_bytes.get(host, 0))
    worst = max(resident, default=0.0)
    if not small:
        return Rule("cache", True, f"every host wrote at least {CACHE_FACTOR}x its memory")
    if not resident:
        return Rule("cache", False, f"{', '.join(small)} wrote less than {CACHE_FACTOR}x "
                    "its memory and no page-cache residency was measured before the reads")
    if worst > RESIDENT_MAX:
        read = 1 + max(range(len(resident)), key=lambda i: resident[i])
        return Rule("cache", False, f"{', '.join(small)} wrote less than {CACHE_FACTOR}x its "
                    f"memory, and {100 * worst:.1f}% of the bytes to read were in the page "
                    f"cache before read {read} (at most {100 * RESIDENT_MAX:g}%)")
    return Rule("cache", True, f"{', '.join(small)} wrote less than {CACHE_FACTOR}x its "
                f"memory; at most {100 * worst:.2f}% of the bytes to read were in the page "
                "cache before each read (measured)")


def gap_rule(gap_s: float) -> Rule:
    ok = gap_s <= GAP_MAX_S
    return Rule("gap", ok, f"the reads started {gap_s:.1f} s after the writes ended "
                f"({'within' if ok else 'over'} {GAP_MAX_S:g} s)")


def rank_shift_rule(hosts: Sequence[str], shift: int) -> Rule:
    """Every rank r reads what rank (r + shift) mod N wrote: on another host?"""
    n = len(hosts)
    same = [rank for rank in range(n) if hosts[rank] == hosts[(rank + shift) % n]]
    if not same:
        return Rule("rank_shift", True, f"rank shift {shift}: every rank reads what a rank on "
                    "another host wrote")
    return Rule("rank_shift", False, f"rank shift {shift}: {len(same)} of {n} ranks read what "
                f"a rank on their own host wrote{' (one host)' if len(set(hosts)) == 1 else ''}")


@dataclass(frozen=True)
class Phase:
    """One half of a cycle, as measured."""

    durations_s: tuple[float, ...]    # per checkpoint: time to last rank
    per_rank_s: tuple[float, ...]     # per rank: its median time
    rank_bytes: tuple[int, ...]       # per rank: bytes it wrote (or read)

    @property
    def checkpoint_bytes(self) -> int:
        return sum(self.rank_bytes)


def phase_metrics(phase: Phase, prefix: str) -> dict[str, float]:
    """DLIO's summary fields of one phase (prefix save or load), and MLPerf's and
    stampede's beside them."""
    size_gb = phase.checkpoint_bytes / GB
    rates = [size_gb / seconds for seconds in phase.durations_s if seconds > 0]
    mean_s = statistics.fmean(phase.durations_s)
    slowest = min(nbytes / seconds for nbytes, seconds in zip(phase.rank_bytes, phase.per_rank_s)
                  if seconds > 0) / GB
    return {
        f"{prefix}_checkpoint_io_mean_GB_per_second": statistics.fmean(rates),
        f"{prefix}_checkpoint_io_stdev_GB_per_second": statistics.pstdev(rates),
        f"{prefix}_checkpoint_duration_mean_seconds": mean_s,
        f"{prefix}_checkpoint_duration_stdev_seconds": statistics.pstdev(phase.durations_s),
        f"{prefix}_checkpoint_duration_max_seconds": max(phase.durations_s),   # the longest
        f"{prefix}_checkpoint_throughput_GB_per_second": size_gb / mean_s,
        f"{prefix}_checkpoint_slowest_rank_GB_per_second": slowest,
    }


DEFINITIONS = {
    "GB": "2**30 bytes, as DLIO counts them",
    "io_mean_GB_per_second": "DLIO's: the mean over checkpoints of checkpoint bytes / "
                             "duration (a mean of rates)",
    "duration_mean_seconds": "mean over checkpoints of the slowest rank's time (MLPerf's "
                             "duration: the max over ranks)",
    "throughput_GB_per_second": "MLPerf's: checkpoint bytes / mean duration (the slowest "
                                "rank's)",
    "slowest_rank_GB_per_second": "the least of the ranks' own bytes / median time",
}


def summary(workload: str, nranks: int, hosts: Sequence[str], memory_bytes: dict[str, int],
            save: Phase, load: Phase, rules: Sequence[Rule], why_not: Sequence[str],
            stampede: dict[str, object]) -> dict[str, object]:
    """The summary document: DLIO's summary.json fields (num_accelerators, num_hosts,
    host_memory_GB, metric.*), then MLPerf's verdict and stampede's numbers."""
    broken = [f"rule {rule.name}: {rule.detail}" for rule in rules if not rule.ok]
    reasons = [*why_not, *broken]
    names = list(dict.fromkeys(hosts))
    metric = {**phase_metrics(save, "save"), **phase_metrics(load, "load"),
              "checkpoint_size_GB": save.checkpoint_bytes / GB}
    return {
        "workload": workload, "num_accelerators": nranks, "num_hosts": len(names),
        "hostname": names[0] if names else "",
        "host_memory_GB": [memory_bytes.get(host, 0) / GB for host in names],
        "num_checkpoints_write": len(save.durations_s),
        "num_checkpoints_read": len(load.durations_s),
        "metric": metric, "definitions": DEFINITIONS,
        "rules": [{"rule": rule.name, "ok": rule.ok, "detail": rule.detail} for rule in rules],
        "comparable": not reasons,
        "not_comparable": [f"{reason}: {NOT_COMPARABLE}" for reason in reasons],
        "stampede": stampede,
    }
