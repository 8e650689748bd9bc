"""Run across 2 emulated nodes x 2 ranks by tests/run/test_nodes.py: one time axis per node,
in both ways stampede.run.gather makes one (exact: rank 0 groups the stamps by processor
name; histogram: a MIN over COMM_TYPE_SHARED), from the hosts MPI reports.

Each rank's stamps are made, not slept: its node's first rank reads the clock once after
a barrier and shares the reading with its node; rank r stamps its origin LEAVE_MS[r] after
that reading (it left the start barrier late, as a descheduled rank does) and its stop
RESTORE_MS later. On its node's axis a rank's restore runs from its node's first origin to
its own stop: node0 (ranks 0, 1) and node1 (ranks 2, 3) each have their own zero, so rank
1 and rank 3 carry their 40 ms and rank 2 does not carry the 100 ms node1 as a whole
started after node0: exactly 5, 45, 5, 45 ms, whatever the machine's load. Rank 0 prints
one JSON line: per mode, each rank's restore in ms, and the hosts.
"""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import numpy as np

from stampede import mpi
from stampede.ops import OP_CODE
from stampede.run.gather import layout_stats

LEAVE_MS = (0, 40, 100, 140)
RESTORE_MS = 5
NS_PER_MS = 1_000_000


def main() -> int:
    comm = mpi.world()
    rank = comm.Get_rank()
    hosts = tuple(mpi.gather(comm, mpi.processor_name(comm)) or ())
    node = mpi.split(comm, 0, by_node=True)
    mpi.barrier(comm)
    reading = mpi.bcast(node, time.perf_counter_ns())        # the node's first rank's
    origin = reading + LEAVE_MS[rank] * NS_PER_MS
    stop = origin + RESTORE_MS * NS_PER_MS
    rows = np.array([[0, OP_CODE["read"], origin, stop, 1, 1],
                     [0, OP_CODE["restore"], origin, stop, 1, 1]], dtype=np.int64)
    plan = SimpleNamespace(op_counts=lambda: {"read": 1})
    found = {}
    for mode in ("exact", "histogram"):
        stats = layout_stats(comm, SimpleNamespace(samples=mode, iterations=1), plan, "axis",
                             rows, {0: origin}, hosts, None)
        if stats is not None:
            found[mode] = [seconds * 1000 for seconds in stats.restore.per_rank_s]
    if rank == 0:
        print(json.dumps({"hosts": hosts, **found}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
