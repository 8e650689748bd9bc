"""Broadcast's network part: stampede's timed `bcast` op versus a bare mpi4py Bcast.

For each shard size (default 64MiB and 256MiB) and --ranks N (default 2) the script
prepares one checkpoint with stampede (layout broadcast, checkpoint.replicas = N: one
group of N ranks, one shard of that size) and measures, in one run:

  stampede  `mpiexec -n N stampede run`, run.cache=warm, --warmup + --iterations, once per
            round: the leader reads the shard into a page-aligned (mmap) buffer, the group
            waits politely (op `wait`), then the Bcast of the whole buffer is timed per rank
            (op `bcast`). From the archive: lat_p50_s (per-rank Bcast time pooled over ranks
            and iterations), elapsed_s (max stop - min start over ranks, median over
            iterations) and stampede's own agg_gbps of the op.
  bare      `mpiexec -n N python bcast_ref.py`: each rank writes every page of an anonymous
            mmap buffer of the same size, then per repetition a polite barrier (Ibarrier +
            Test + 0.5 ms sleep, then Barrier: stampede's) and comm.Bcast([buf, MPI.BYTE],
            root=0) between two perf_counter_ns stamps; same --warmup and --iterations;
            the same two medians.
  bare+fill the same launch, alternating with bare: before the barrier the root reads the
            same shard file into its buffer (os.preadv, 4 MiB blocks, warm page cache), so
            the Bcast starts as stampede's does. bare vs bare+fill is the physics of that
            sequence, not stampede's overhead.

GB/s = shard bytes / duration (GB = 1e9 B): what one receiver gets. The --rounds alternate
(bare first, then stampede first, ...) so that load which comes and goes on this small
machine falls on both sides alike; the table shows medians over rounds with (min-max).
Target: stampede p50 GB/s / bare p50 GB/s >= 0.9, judged on the median over rounds of
each round's own ratio (paired: the sides of a round ran seconds apart, so load that
drifts over minutes cancels); the same against bare+fill, and best/best, are shown too.
One launch's Bcasts can run at half the speed of the next launch's on a busy 2-core
machine: more rounds beat more iterations. The verdict is printed, never turned
into an exit status: the script exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

from common import (
    VENV_BIN,
    MedianMinMax,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    mpi_library_text,
    mpiexec_command,
    ratio_verdict,
    run_checked,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.checkpoint.plan import shard_path
from stampede.units import parse_size

TARGET_RATIO = 0.9
BLOCK_BYTES = 4 * 1024 * 1024   # stampede's block_size here, and the reference's preadv size
REFERENCE_SOURCE = r'''
import mmap, os, statistics, sys, time
from mpi4py import MPI

size_bytes, iterations, warmup, block = (int(text) for text in sys.argv[1:5])
comm, chunk, fd = MPI.COMM_WORLD, os.urandom(block), os.open(sys.argv[5], os.O_RDONLY)
view = memoryview(mmap.mmap(-1, size_bytes))   # anonymous mmap: page-aligned, as stampede's
for offset in range(0, size_bytes, block):     # every rank writes every page: no zero page
    view[offset:offset + block] = chunk[:min(block, size_bytes - offset)]

def refill():   # the root reads the shard file into its buffer, as stampede's leader does
    for offset in range(0, size_bytes, block):
        os.preadv(fd, [view[offset:offset + block]], offset)

def polite_barrier():
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.0005)
    comm.Barrier()

refill()
stamps = {False: [], True: []}
for repetition in range(warmup + iterations):
    for fill in (False, True):
        if fill and comm.Get_rank() == 0:
            refill()
        polite_barrier()
        start = time.perf_counter_ns()
        comm.Bcast([view, MPI.BYTE], root=0)
        stop = time.perf_counter_ns()
        if repetition >= warmup:
            stamps[fill].append((start, stop))
everyone = comm.gather(stamps, root=0)
if comm.Get_rank() == 0:
    for fill in (False, True):
        ranks = [rank[fill] for rank in everyone]
        durations = [stop - start for rank in ranks for start, stop in rank]
        elapsed = [max(rank[i][1] for rank in ranks) - min(rank[i][0] for rank in ranks)
                   for i in range(iterations)]
        print(statistics.median(durations) / 1e9, statistics.median(elapsed) / 1e9)
'''
Seconds = dict[str, list[float]]   # "p50" / "elapsed" / ... -> one value per round


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--sizes", default="64MiB,256MiB",
                        help="shard sizes, comma-separated (default 64MiB,256MiB)")
    parser.add_argument("--ranks", type=int, default=2,
                        help="ranks N = replicas: one broadcast group of N (default 2)")
    parser.add_argument("--rounds", type=int, default=9,
                        help="alternating rounds of stampede and bare per size (default 9)")
    parser.add_argument("--iterations", type=int, default=10,
                        help="measured iterations (Bcasts) per run, both sides (default 10)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="iterations run first and dropped, both sides (default 2)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes = comma_separated(args.sizes, parse_size)
    except ValueError as error:
        parser.error(str(error))
    if args.ranks < 2 or args.rounds < 1 or args.iterations < 1 or args.warmup < 0 or \
            any(size % 4096 for size in args.size_bytes):
        parser.error("--ranks >= 2, --rounds >= 1, --iterations >= 1, --warmup >= 0, "
                     "sizes in whole 4 KiB pages")
    return args


def machine_facts(scratch: Path, nranks: int) -> str:
    """One line: CPUs, memory, kernel, MPI library, load and the scratch file system."""
    oversubscribed = " (oversubscribed)" if nranks > (os.cpu_count() or 1) else ""
    return (f"{machine_text(with_ram=True)}; {mpi_library_text()}; "
            f"{nranks} ranks on one node{oversubscribed}; {scratch_text(scratch, with_device=False)}; "
            f"load average {load_average_text()} (other work widens the spread)")


def write_job(scratch: Path, size_bytes: int, args: argparse.Namespace) -> Path:
    """A broadcast job of one shard held by all N ranks; its own target, and its archive
    next to it (JOB.csv)."""
    job = scratch / f"bcast_{size_bytes}.toml"
    return write_job_toml(job, {
        "target": {"path": scratch / f"ckpt_{size_bytes}"},
        "checkpoint": {"size_per_rank": size_bytes, "layout": "broadcast", "replicas": args.ranks,
                       "block_size": BLOCK_BYTES},
        "pattern": {"ops": ["open", "read", "close"]},
        "run": {"cache": "warm", "iterations": args.iterations, "warmup": args.warmup},
        "archive": {"path": job.with_suffix(".csv")},
    })


def stampede_round(job: Path, args: argparse.Namespace, results: Seconds) -> None:
    """One stampede run; append its bcast p50 and elapsed seconds (and agg_gbps column)."""
    run_stampede("run", job, args.ranks)
    row = [row for row in archive_rows(job.with_suffix(".csv")) if row["op"] == "bcast"][-1]
    if row["errors"] != "0" or row["valid"] != "true":
        sys.stderr.write(f"stampede run {job}: bcast errors {row['errors']}, valid {row['valid']}\n")
        raise SystemExit(1)
    results["p50"].append(float(row["lat_p50_s"]))
    results["elapsed"].append(float(row["elapsed_s"]))
    results["agg_gbps"].append(float(row["agg_gbps"]))


def bare_round(source: Path, size_bytes: int, args: argparse.Namespace, results: Seconds) -> None:
    """One launch of the bare Bcast script; append its median duration and elapsed, plain
    and with the root's refill."""
    output = run_checked(mpiexec_command(
        args.ranks, str(VENV_BIN / "python"), str(source), str(size_bytes), str(args.iterations),
        str(args.warmup), str(BLOCK_BYTES),
        str(source.parent / f"ckpt_{size_bytes}" / shard_path(0, 1))))
    for key, text in zip(("p50", "elapsed", "fill_p50", "fill_elapsed"), output.split()):
        results[key].append(float(text))


def gbps(size_bytes: int, seconds: list[float]) -> MedianMinMax:
    """(median, min, max) GB/s over rounds of shard bytes / seconds."""
    return median_min_max(size_bytes / value / 1e9 for value in seconds)


def print_table(sizes: list[int], measured: dict[int, tuple[Seconds, Seconds]]) -> None:
    """Per size: each side's p50 GB/s, the paired ratios, elapsed-based GB/s, verdict."""
    header = (f"{'shard':>8} {'stampede p50 GB/s':>20} {'bare p50 GB/s':>20} {'paired':>6} "
              f"{'bare+fill':>9} {'paired':>6} {'best':>5} {'elapsed st/bare/fill':>20} "
              f"{'agg col':>7}  verdict")
    print(header)
    print("-" * len(header))
    for size in sizes:
        ours, bare = measured[size]
        st, ref = gbps(size, ours["p50"]), gbps(size, bare["p50"])
        paired = statistics.median(b / s for s, b in zip(ours["p50"], bare["p50"]))
        fill = statistics.median(b / s for s, b in zip(ours["p50"], bare["fill_p50"]))
        verdict = ratio_verdict(paired, TARGET_RATIO, (st, ref))
        print(f"{size / 2**20:>5.0f}MiB {st[0]:>6.2f} ({st[1]:5.2f}-{st[2]:5.2f}) "
              f"{ref[0]:>6.2f} ({ref[1]:5.2f}-{ref[2]:5.2f}) {paired:>6.3f} "
              f"{gbps(size, bare['fill_p50'])[0]:>9.2f} {fill:>6.3f} {st[2] / ref[2]:>5.2f} "
              + " / ".join(f"{gbps(size, side[key])[0]:>4.2f}" for side, key in (
                  (ours, "elapsed"), (bare, "elapsed"), (bare, "fill_elapsed")))
              + f" {statistics.median(ours['agg_gbps']):>7.2f}  {verdict}")


def main() -> int:
    """Prepare one broadcast checkpoint per size, alternate both sides, print, clean up."""
    args = parse_args()
    with scratch_directory("stampede-bcast-", args.dir) as scratch:
        print(machine_facts(scratch, args.ranks))
        print(f"broadcast_vs_bcast: {args.ranks} ranks, one group (replicas = {args.ranks}), "
              f"shards {args.sizes}; {args.rounds} rounds of stampede and bare, each "
              f"{args.warmup} warmup + {args.iterations} measured Bcasts", flush=True)
        source = scratch / "bcast_ref.py"
        source.write_text(REFERENCE_SOURCE)
        jobs = {size: write_job(scratch, size, args) for size in args.size_bytes}
        for job in jobs.values():
            run_stampede("prepare", job, args.ranks)
        measured: dict[int, tuple[Seconds, Seconds]] = {
            size: ({"p50": [], "elapsed": [], "agg_gbps": []},
                   {"p50": [], "elapsed": [], "fill_p50": [], "fill_elapsed": []})
            for size in args.size_bytes}
        for number in range(args.rounds):
            for size, (ours, bare) in measured.items():
                if number % 2:   # alternate who goes first, so drifting load hits both sides
                    stampede_round(jobs[size], args, ours)
                bare_round(source, size, args, bare)
                if number % 2 == 0:
                    stampede_round(jobs[size], args, ours)
            print(f"  round {number + 1}/{args.rounds} done", flush=True)
        print()
        print_table(args.size_bytes, measured)
        print("GB = 1e9 B; GB/s = shard bytes / time: what each receiving rank gets; medians over "
              "rounds (min-max). p50 = median per-rank\nBcast time, all ranks and iterations; "
              "elapsed = max stop - min start over ranks, median over iterations. paired = median\n"
              "over rounds of the round's stampede / bare (the verdict, target >= 0.9), then / "
              "bare+fill; best = max / max.\nagg col = the archive's agg_gbps of the bcast op: "
              f"bytes of all {args.ranks} ranks, the root's own copy included, / elapsed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
