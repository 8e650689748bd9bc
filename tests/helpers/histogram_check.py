"""Run under mpiexec by test_histogram.py: the same samples through both modes.

Every rank makes deterministic synthetic samples (log-normal latencies, several ops and
iterations). The exact path gathers them whole (stats.layout_stats); the histogram path
reduces them with real MPI reductions (histogram.summarize + gather.reduce_summaries, then
stats.layout_stats_reduced). Rank 0 prints one verdict line per check.
"""

from __future__ import annotations

import sys

import numpy as np

from stampede import mpi
from stampede.ops import OP_CODE
from stampede.results import histogram as histo
from stampede.results.definitions import BUCKET_ERROR
from stampede.results.stats import layout_stats, layout_stats_reduced, timeline
from stampede.run.gather import reduce_summaries

ITERATIONS = (0, 1, 2)


def synthetic(rank: int) -> np.ndarray:
    generator = np.random.default_rng(1000 + rank)
    rows = []
    for iteration in ITERATIONS:
        clock = int(generator.integers(0, 50_000))
        for op, count, scale_ns, nbytes in (("stat", 40, 3_000, 0), ("open", 20, 9_000, 0),
                                            ("read", 300, 250_000, 4 << 20), ("close", 20, 4_000, 0)):
            for _ in range(count):
                duration = int(generator.lognormal(np.log(scale_ns), 0.6))
                ok = int(generator.random() > 0.01)
                rows.append((iteration, OP_CODE[op], clock, clock + duration, nbytes * ok, ok))
                clock += duration + 100
        rows.append((iteration, OP_CODE["restore"], 0, clock, 1, 1))
    return np.array(rows, dtype=np.int64)


def main() -> int:
    comm = mpi.world()
    rank, nranks = comm.Get_rank(), comm.Get_size()
    rows = synthetic(rank)
    ranked = np.column_stack([rows, np.full(len(rows), rank, dtype=np.int64)])
    exact_parts = mpi.gather_rows(comm, ranked)
    reduced = reduce_summaries(comm, histo.summarize(rows, ITERATIONS), ITERATIONS)
    restores = mpi.gather_rows(comm, ranked[ranked[:, 1] == OP_CODE["restore"]])
    timelines = mpi.gather(comm, timeline(ranked))
    if rank != 0:
        return 0
    assert exact_parts is not None and reduced is not None and restores is not None
    assert timelines is not None
    exact = layout_stats("sharded", np.concatenate(exact_parts), nranks)
    approx = layout_stats_reduced("sharded", reduced, np.concatenate(restores),
                                  tuple(row for part in timelines for row in part), nranks)
    failures = 0
    for mine, theirs in zip(exact.ops, approx.ops, strict=True):
        same = (mine.op, mine.count, mine.errors, mine.bytes, mine.latency.min_s, mine.latency.max_s,
                mine.elapsed_s, mine.agg_gbps) == (theirs.op, theirs.count, theirs.errors, theirs.bytes,
                                                   theirs.latency.min_s, theirs.latency.max_s,
                                                   theirs.elapsed_s, theirs.agg_gbps)
        worst = max(abs(getattr(theirs.latency, name) / getattr(mine.latency, name) - 1)
                    for name in ("p50_s", "p90_s", "p99_s", "p999_s"))
        ok = same and worst <= BUCKET_ERROR
        failures += not ok
        print(f"{mine.op}: exact-fields {'same' if same else 'DIFFER'}, worst percentile error "
              f"{worst:.3%} (allowed {BUCKET_ERROR:.1%}): {'ok' if ok else 'FAILED'}")
    same_restore = exact.restore.time_to_last_rank_s == approx.restore.time_to_last_rank_s
    same_timeline = exact.timeline == tuple(sorted(approx.timeline))
    print(f"restore: {'ok' if same_restore else 'FAILED'}; timeline: {'ok' if same_timeline else 'FAILED'}")
    print(f"ranks={nranks}")
    return 1 if failures or not (same_restore and same_timeline) else 0


if __name__ == "__main__":
    sys.exit(main())
