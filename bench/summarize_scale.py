"""Rank 0 at 16,384 ranks: gather-and-summarize, exact mode against histogram mode.

Synthetic per-rank samples (log-normal latencies: stat, open, --reads reads, close and the
restore, per iteration) go through stampede's own code: in histogram mode each rank's
`histo.summarize` (which every rank runs in parallel: its median time is shown), the
reduction MPI does (sum/min/max across ranks, done here with numpy as `histo.REDUCTIONS`
defines it), then rank 0's part, `stats.layout_stats_reduced` plus the archive rows. In
exact mode rank 0 gets every sample and runs `stats.layout_stats` on all of them. Both
rank-0 parts are timed with perf_counter and their peak memory with tracemalloc.
Target: histogram mode's rank-0 work under 1 s at 16,384 ranks x 10 iterations.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from common import docstring_parser, machine_text

from stampede.ops import OP_CODE
from stampede.results import histogram as histo
from stampede.results.rows import op_rows
from stampede.results.stats import layout_stats, layout_stats_reduced, timeline

OPS = (("stat", 3_000, 0), ("open", 9_000, 0), ("close", 4_000, 0))


def rank_samples(rank: int, iterations: int, reads: int) -> np.ndarray:
    """One rank's sample rows (absolute stamps on the phase's axis), rank column last."""
    generator = np.random.default_rng(rank)
    rows = []
    for iteration in range(iterations):
        clock = int(generator.integers(0, 100_000))
        kinds = [OPS[0], OPS[1], *[("read", 250_000, 4 << 20)] * reads, OPS[2]]
        durations = generator.lognormal(0, 0.5, len(kinds))
        for (op, scale_ns, nbytes), factor in zip(kinds, durations):
            stop = clock + int(scale_ns * factor)
            rows.append((iteration, OP_CODE[op], clock, stop, nbytes, 1, rank))
            clock = stop + 200
        rows.append((iteration, OP_CODE["restore"], 0, clock, reads * (4 << 20), 1, rank))
    return np.array(rows, dtype=np.int64)


def timed(action: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, seconds, peak MiB allocated while it ran): timed alone, then run again
    under tracemalloc for the memory (tracing slows allocation-heavy code severalfold)."""
    start = time.perf_counter()
    result = action()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    action()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return result, seconds, peak


def main() -> None:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--reads", type=int, default=16, help="reads per rank per iteration")
    args = parser.parse_args()
    print(machine_text(with_ram=True))
    iterations = tuple(range(args.iterations))
    shared = {"job": "synthetic", "run_id": "bench", "layout": "sharded", "nranks": args.ranks}

    restores: list[np.ndarray] = []
    timelines: list[Any] = []
    per_rank_s: list[float] = []
    all_rows: list[np.ndarray] = []
    folded: dict[str, np.ndarray] = {}
    combine = {"sum": np.add, "min": np.minimum, "max": np.maximum}
    for rank in range(args.ranks):
        rows = rank_samples(rank, args.iterations, args.reads)
        start = time.perf_counter()
        summary = histo.summarize(rows[:, :6], iterations)
        restores.append(rows[rows[:, 1] == OP_CODE["restore"]])
        timelines.extend(timeline(rows))
        per_rank_s.append(time.perf_counter() - start)
        all_rows.append(rows)
        # what MPI's reduction does, rank by rank (never every rank's arrays at once)
        for name, how in histo.REDUCTIONS.items():
            folded[name] = summary[name] if name not in folded else \
                combine[how](folded[name], summary[name])
    reduced = histo.Reduced(iterations=iterations, **folded)
    array_bytes = sum(array.nbytes for array in folded.values())
    restore_rows = np.concatenate(restores)

    def histogram_rank0() -> Any:
        stats = layout_stats_reduced("sharded", reduced, restore_rows, tuple(timelines), args.ranks)
        return op_rows(shared, stats, args.reads * (4 << 20), ("node",) * args.ranks)

    def exact_rank0() -> Any:
        stats = layout_stats("sharded", np.concatenate(all_rows), args.ranks)
        return op_rows(shared, stats, args.reads * (4 << 20), ("node",) * args.ranks)

    _, histogram_s, histogram_mib = timed(histogram_rank0)
    _, exact_s, exact_mib = timed(exact_rank0)
    samples = sum(len(rows) for rows in all_rows)
    print(f"{args.ranks} ranks x {args.iterations} iterations x {args.reads + 4} samples = "
          f"{samples:,} samples")
    print(f"every rank, histo.summarize of its own samples: median "
          f"{statistics.median(per_rank_s) * 1e3:.2f} ms (in parallel, on each rank); the "
          f"arrays each rank's reduction sends: {array_bytes / 2**10:.0f} KiB")
    print(f"{'rank 0':<10} {'seconds':>9} {'peak MiB':>9}")
    print(f"{'histogram':<10} {histogram_s:>9.3f} {histogram_mib:>9.1f}")
    print(f"{'exact':<10} {exact_s:>9.3f} {exact_mib:>9.1f}")
    print(f"exact / histogram: {exact_s / histogram_s:.1f}x time, {exact_mib / histogram_mib:.1f}x "
          f"memory; target: histogram under 1 s: {'PASS' if histogram_s < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
