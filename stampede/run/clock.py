"""One time axis for all the ranks of a phase.

Every rank stamps with `time.perf_counter_ns()` (CLOCK_MONOTONIC) and records, per phase,
the stamp at which it left the start barrier (its origin). On one node all processes read
the same clock, so rank 0 puts the stamps of a node's ranks on one axis: time since the
node's FIRST rank left the barrier. A rank that left late (descheduled on a busy node)
therefore carries that delay in its restore time, as it would in a real restart, and
max(stop) - min(start) spans what really happened. Taking each rank's own exit as its
zero would hide the delay: 32 ranks on 2 cores run one after another, yet each would
look as fast as if it ran alone.

Across nodes the clocks differ (each counts from its own boot), so the nodes' first exits
are taken as simultaneous: a barrier releases the nodes of a real network within
microseconds, far below the times a restore is made of.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stampede.ops import OP_CODE, PSEUDO_OPS
from stampede.results.samples import ITER, OP, START, STOP

PSEUDO_CODES = np.array([OP_CODE[name] for name in PSEUDO_OPS], dtype=np.int64)


def origins_array(origins: dict[int, int]) -> np.ndarray:
    """A rank's {phase: origin_ns} as rows (phase, origin_ns) for a Gatherv."""
    return np.array(sorted(origins.items()), dtype=np.int64).reshape(-1, 2)


def on_one_axis(rows_by_rank: Sequence[np.ndarray], origins_by_rank: Sequence[np.ndarray],
                hosts: Sequence[str]) -> list[np.ndarray]:
    """Rank 0: each rank's rows with absolute stamps -> nanoseconds since its node's first
    barrier exit of the same phase (ITER). The pseudo-ops (restore, save, ...) start at
    that shared zero: each is the time until the rank reached its moment, barrier
    included."""
    first_exit: dict[tuple[str, int], int] = {}
    for host, origins in zip(hosts, origins_by_rank):
        for phase, origin in origins:
            key = (host, int(phase))
            first_exit[key] = min(first_exit.get(key, int(origin)), int(origin))
    result = []
    for host, rows in zip(hosts, rows_by_rank):
        rows = rows.copy()
        if rows.size:
            phases = np.unique(rows[:, ITER])
            zeros = np.array([first_exit[(host, int(phase))] for phase in phases], dtype=np.int64)
            zero = zeros[np.searchsorted(phases, rows[:, ITER])]
            rows[:, START] -= zero
            rows[:, STOP] -= zero
            rows[np.isin(rows[:, OP], PSEUDO_CODES), START] = 0
        result.append(rows)
    return result
