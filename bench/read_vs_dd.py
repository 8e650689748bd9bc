"""Warm-cache read bandwidth: stampede versus `dd bs=4M of=/dev/null`, same files, one run.

For each rank count (default 1 and 2) the script prepares one checkpoint with stampede
(both layouts, --size each), reads every file once untimed so the page cache is warm,
then measures, on the SAME files:

  stampede  `mpiexec -n N stampede run` with run.cache=warm, 4 MiB blocks, warmup 1 and
            --iterations measured iterations, once per round; agg GB/s of the `read` op
            (and of the `restore` pseudo-op) from the CSV archive: per run the median
            over iterations of bytes / (last read stop - first read start over all
            ranks); shown: the median of the rounds' medians.
  dd        one `dd if=FILE bs=4M of=/dev/null` per rank, all started together: for
            sharded one dd per shard file, for shared one dd per rank slice of the one
            file (skip=/count= in 4M units). Aggregate GB/s = total bytes / the slowest
            dd's own elapsed time (dd's report, which like stampede's excludes process
            start); --repeats per round, median over all rounds.

The --rounds alternate (dd first, then stampede first, ...) so that load from other work
on the machine, which comes and goes, falls on both sides alike. GB = 1e9 bytes.
Target: median stampede read GB/s / median dd GB/s >= 0.95. The best (max) of each side
is shown too: on a busy machine it is the least-disturbed number. The verdict is printed,
never turned into an exit status: the script exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    MedianMinMax,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    ratio_verdict,
    run_checked,
    run_dd_together,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.checkpoint.plan import SHARED_FILE, shard_path
from stampede.units import parse_size

BLOCK_BYTES = 4 * 1024 * 1024
LAYOUTS = ("sharded", "shared")
TARGET_RATIO = 0.95
Gbps = MedianMinMax   # (median, min, max) in GB/s


@dataclass(frozen=True)
class Case:
    """One row of the comparison: a layout at a rank count, both sides measured."""

    nranks: int
    layout: str
    read_gbps: Gbps        # stampede `read` op agg GB/s
    restore_gbps: float    # stampede `restore` pseudo-op agg GB/s (median)
    dd_gbps: Gbps


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="2GiB",
                        help="checkpoint size per layout and rank count (default 2GiB)")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (default 1,2)")
    add_scratch_parent_option(parser)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of stampede and dd per rank count (default 5)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="stampede measured iterations per round (default 3)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="dd repeats per layout per round (default 3)")
    args = parser.parse_args()
    try:
        args.size_bytes = parse_size(args.size)
        args.rank_counts = comma_separated(args.ranks, int)
    except ValueError as error:
        parser.error(str(error))
    for nranks in args.rank_counts:
        if nranks < 1 or args.size_bytes % (nranks * BLOCK_BYTES):
            parser.error(f"--size {args.size} must split into {nranks} rank(s) x whole 4 MiB blocks")
    return args


def machine_facts(scratch: Path) -> str:
    """One line: CPUs, memory, kernel, the scratch directory's file system, dd, load."""
    dd_version = subprocess.run(["dd", "--version"], capture_output=True, text=True).stdout
    return (f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; "
            f"{dd_version.splitlines()[0] if dd_version else 'dd ?'}; "
            f"load average {load_average_text()} "
            "(other work on the machine widens the spread)")


def write_job(scratch: Path, nranks: int, size_bytes: int) -> Path:
    """A job file for one rank count: its own target directory, archive in the scratch dir."""
    return write_job_toml(scratch / f"read_np{nranks}.toml", {
        "target": {"path": scratch / f"ckpt_np{nranks}"},
        "checkpoint": {"size": size_bytes, "layout": ["sharded", "shared"], "block_size": "4MiB"},
        "pattern": {"ops": ["open", "read", "close"]},
        "run": {"cache": "warm", "warmup": 1},
        "archive": {"path": scratch / "archive.csv"},
    })


def dd_commands(root: Path, layout: str, nranks: int, size_bytes: int) -> list[list[str]]:
    """One dd per rank reading exactly what that rank reads in stampede's plan."""
    if layout == "sharded":
        return [["dd", f"if={root / shard_path(rank, nranks)}", "bs=4M", "of=/dev/null"]
                for rank in range(nranks)]
    blocks_per_rank = size_bytes // nranks // BLOCK_BYTES
    return [["dd", f"if={root / SHARED_FILE}", "bs=4M", "of=/dev/null",
             f"skip={rank * blocks_per_rank}", f"count={blocks_per_rank}"]
            for rank in range(nranks)]


def warm_up(root: Path) -> None:
    """Untimed: read every checkpoint file once so that all of it is in the page cache."""
    for path in sorted(root.rglob("*.raw")):
        run_checked(["dd", f"if={path}", "bs=4M", "of=/dev/null", "status=none"])


def archived_gbps(archive: Path, nranks: int) -> dict[tuple[str, str], Gbps]:
    """(layout, op) -> agg GB/s over every run at `nranks` ranks: (median of the runs'
    medians, min of their minima, max of their maxima)."""
    runs: dict[tuple[str, str], list[Gbps]] = {}
    for row in archive_rows(archive):
        if int(row["nranks"]) == nranks and row["agg_gbps"]:
            runs.setdefault((row["layout"], row["op"]), []).append(
                (float(row["agg_gbps"]), float(row["agg_gbps_min"]), float(row["agg_gbps_max"])))
    return {key: (statistics.median(run[0] for run in values), min(run[1] for run in values),
                  max(run[2] for run in values)) for key, values in runs.items()}


def measure(scratch: Path, nranks: int, args: argparse.Namespace) -> list[Case]:
    """Prepare, warm, then stampede and dd on the same files; one result per layout."""
    job = write_job(scratch, nranks, args.size_bytes)
    root = scratch / f"ckpt_np{nranks}"
    started = time.perf_counter()
    run_stampede("prepare", job, nranks)
    print(f"  {nranks} rank(s): prepared 2 x {args.size_bytes / 1e9:.2f} GB in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    warm_up(root)
    dd_gbps: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for round_number in range(args.rounds):
        if round_number % 2:   # alternate who goes first, so drifting load hits both sides
            run_stampede("run", job, nranks, f"run.iterations={args.iterations}")
        for _ in range(args.repeats):
            for layout in LAYOUTS:
                commands = dd_commands(root, layout, nranks, args.size_bytes)
                dd_gbps[layout].append(run_dd_together(commands, args.size_bytes))
        if round_number % 2 == 0:
            run_stampede("run", job, nranks, f"run.iterations={args.iterations}")
    measured = archived_gbps(scratch / "archive.csv", nranks)
    run_stampede("clean", job, 1)
    return [Case(nranks, layout, measured[(layout, "read")], measured[(layout, "restore")][0],
                 median_min_max(dd_gbps[layout]))
            for layout in LAYOUTS]


def print_table(cases: list[Case]) -> None:
    """The comparison: medians with min-max spread, and the ratio against the target."""
    header = (f"{'ranks':>5} {'layout':<8} {'stampede read GB/s':>24} {'restore GB/s':>12} "
              f"{'dd GB/s':>22} {'read/dd':>8} {'best/best':>9}  verdict")
    print(header)
    print("-" * len(header))
    for case in cases:
        read, dd = case.read_gbps, case.dd_gbps
        ratio = read[0] / dd[0]
        verdict = ratio_verdict(ratio, TARGET_RATIO, (read, dd))
        print(f"{case.nranks:>5} {case.layout:<8} "
              f"{read[0]:>7.2f} ({read[1]:5.2f}-{read[2]:5.2f}) {case.restore_gbps:>12.2f} "
              f"{dd[0]:>6.2f} ({dd[1]:5.2f}-{dd[2]:5.2f}) {ratio:>8.3f} {read[2] / dd[2]:>9.3f}  "
              f"{verdict}")


def main() -> int:
    """Measure every rank count in a fresh scratch directory, print the table, clean up."""
    args = parse_args()
    with scratch_directory("stampede-read-vs-dd-", args.dir) as scratch:
        print(machine_facts(scratch))
        print(f"read_vs_dd: {args.size} per layout, 4 MiB blocks, warm cache, ranks "
              f"{args.ranks}; {args.rounds} rounds of stampede {args.iterations} iterations and "
              f"dd {args.repeats} repeats", flush=True)
        cases = [case for nranks in args.rank_counts for case in measure(scratch, nranks, args)]
        print()
        print_table(cases)
        print("GB = 1e9 B; medians with (min-max) over all rounds; read/dd = median stampede read "
              "GB/s / median dd GB/s;\nbest/best = max / max; restore = agg GB/s from barrier exit "
              "to each rank's last byte, open and close included")
    return 0


if __name__ == "__main__":
    sys.exit(main())
