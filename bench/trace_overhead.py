"""What `--trace` costs a run: the same restore with and without it, alternating, the read
GB/s and the stat latency of each side, and the ratio.

The trace keeps the sample rows the statistics are made of anyway, so nothing is added
to a timed op; what it adds is one more Gatherv after each phase and the file written
after it. A job of --layout with --size per rank, --block blocks, cache warm (the page
cache: the tightest timed path, where any added work would show), is prepared once in a
scratch directory; then --rounds rounds of `stampede run` and `stampede run --trace` at
--ranks ranks, the order swapped every round. Per side: the median over rounds of each
run's read aggregate GB/s and stat p50; the ratio traced / untraced is the median of the
per-round ratios (paired). Targets (issue 26): read GB/s within 1%, stat p50 within +100 ns;
the verdict is printed, never an exit status.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from common import (
    archive_rows,
    docstring_parser,
    load_average_text,
    machine_text,
    mpiexec_command,
    run_checked,
    scratch_directory,
    write_job_toml,
)


def one_run(job: Path, ranks: int, archive: Path, traced: bool) -> tuple[float, float]:
    """(read agg GB/s, stat p50 s) of one run, from its archived rows."""
    before = len(archive_rows(archive)) if archive.exists() else 0
    run_checked(mpiexec_command(ranks, sys.executable, "-m", "stampede", "run", str(job),
                                *(["--trace"] if traced else [])))
    rows = archive_rows(archive)[before:]
    read = next(row for row in rows if row["op"] == "read")
    stat = next(row for row in rows if row["op"] == "stat")
    return float(read["agg_gbps"]), float(stat["lat_p50_s"])


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layout", default="sharded")
    parser.add_argument("--size", default="64MiB", help="per rank")
    parser.add_argument("--block", default="1MiB")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    with scratch_directory("stampede-trace-overhead-", None) as scratch:
        archive = scratch / "runs.csv"
        job = write_job_toml(scratch / "job.toml", {
            "target": {"path": scratch / "ck"},
            "checkpoint": {"size_per_rank": args.size, "layout": [args.layout],
                           "block_size": args.block},
            "pattern": {"stat_count": 8},
            "run": {"iterations": args.iterations, "warmup": 1, "cache": "warm",
                    "verify": "none"},
            "archive": {"path": archive}})
        run_checked(mpiexec_command(args.ranks, sys.executable, "-m", "stampede", "prepare",
                                    str(job)))
        sides: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_number in range(args.rounds):
            for traced in (False, True) if round_number % 2 == 0 else (True, False):
                sides[traced].append(one_run(job, args.ranks, archive, traced))
        traces = sorted((scratch / "runs.runs").glob("*.trace.npz"))
        trace_bytes = traces[-1].stat().st_size if traces else 0
    gbps_ratio = statistics.median(t[0] / u[0] for t, u in zip(sides[True], sides[False]))
    stat_delta = statistics.median(t[1] - u[1] for t, u in zip(sides[True], sides[False]))
    for traced, label in ((False, "untraced"), (True, "--trace")):
        gbps = [value for value, _ in sides[traced]]
        stats = [value for _, value in sides[traced]]
        print(f"{label:>9}: read {statistics.median(gbps):.3g} GB/s ({min(gbps):.3g}-"
              f"{max(gbps):.3g}), stat p50 {statistics.median(stats) * 1e9:.0f} ns "
              f"({min(stats) * 1e9:.0f}-{max(stats) * 1e9:.0f})")
    print(f"{args.ranks} ranks, {args.layout}, {args.size} per rank, block {args.block}, "
          f"{args.iterations} iterations, {args.rounds} rounds; a trace file "
          f"{trace_bytes / 1024:.0f} KiB")
    print(f"traced / untraced read GB/s: {gbps_ratio:.3f} (median of per-round ratios; target "
          f"within 1%: {'met' if abs(gbps_ratio - 1) <= 0.01 else 'not met'}); stat p50 "
          f"{stat_delta * 1e9:+.0f} ns (target within +100 ns: "
          f"{'met' if stat_delta <= 100e-9 else 'not met'})")
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
