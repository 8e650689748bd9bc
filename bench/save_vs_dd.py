"""Durable write bandwidth: `stampede save` versus `dd bs=4M conv=fsync`, same target, one run.

For each rank count (default 1 and 2), on the scratch directory's file system:

  stampede  `mpiexec -n N stampede save` of the sharded layout, --size in all, 4 MiB
            blocks, save.durability = fsync, save.validate = none (validation re-reads:
            not part of a write's bandwidth), save.keep = 1, warmup 1 and --iterations
            saves per round: agg GB/s of the `save` pseudo-op from the CSV archive (all
            ranks' bytes / (the last rank's bytes durable - the phase's start): create,
            writes, fsync, close, rename and the directory's fsync included); per run the
            median over saves, shown: the median of the rounds.
  dd        one `dd if=/dev/zero of=NEW_FILE bs=4M count=K conv=fsync` per rank, all
            started together, each into a new file (a save writes new files too), the
            files removed between repeats; aggregate GB/s = total bytes / the slowest dd's
            own elapsed time (dd reports it after the fsync; like stampede's, process start
            is not in it); --repeats per round, median over all rounds.
  C         the floor: a program compiled here with gcc (skipped, said, without gcc) doing
            what stampede's save does and nothing else: open(O_CREAT|O_EXCL), K pwrite()s
            of one page-aligned 4 MiB buffer of random bytes, fsync, close, timed from
            before the open to after the close; one process per rank, started together;
            aggregate GB/s as for dd.
  With --direct every side bypasses the page cache: run.cache = direct (O_DIRECT writes
  from page-aligned buffers), dd oflag=direct, the C program O_DIRECT.

dd writes zeros, read from /dev/zero into its buffer block by block (a copy stampede and
the C loop do not make); stampede and C write pseudo-random blocks from memory, as a
trainer's state is. The rounds alternate
who goes first, so that load from other work falls on both sides alike. GB = 1e9 bytes.
Target: median stampede save GB/s / median dd GB/s >= 0.95 (save/C is shown beside it:
what stampede costs over the bare syscalls). The verdict is printed,
never an exit status: the script exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from common import (
    MedianMinMax,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    compile_c,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    ratio_verdict,
    run_dd_together,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.units import parse_size

BLOCK_BYTES = 4 * 1024 * 1024
TARGET_RATIO = 0.95
C_SOURCE = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {   /* PATH BLOCKS DIRECT: prints seconds */
    if (argc != 4) return 2;
    size_t block = 4u << 20; long blocks = atol(argv[2]); void *buffer;
    if (posix_memalign(&buffer, 4096, block)) return 1;
    for (size_t i = 0; i < block; i++) ((unsigned char *)buffer)[i] = (unsigned char)rand();
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_EXCL | (atoi(argv[3]) ? O_DIRECT : 0), 0640);
    if (fd < 0) { perror("open"); return 1; }
    for (long i = 0; i < blocks; i++)
        if (pwrite(fd, buffer, block, (off_t)i * block) != (ssize_t)block) { perror("pwrite"); return 1; }
    if (fsync(fd) || close(fd)) { perror("fsync"); return 1; }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.9f\n", (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
"""


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="1GiB", help="bytes per save, all ranks (default 1GiB)")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating rounds of stampede and dd per rank count (default 5)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="stampede measured saves per round (default 3)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="dd repeats per round (default 3)")
    parser.add_argument("--direct", action="store_true",
                        help="O_DIRECT on both sides (run.cache = direct, dd oflag=direct)")
    add_scratch_parent_option(parser)
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


def write_job(scratch: Path, nranks: int, args: argparse.Namespace) -> Path:
    return write_job_toml(scratch / f"save_np{nranks}.toml", {
        "target": {"path": scratch / f"ckpt_np{nranks}"},
        "checkpoint": {"size": args.size_bytes, "layout": ["sharded"], "block_size": "4MiB"},
        "run": {"cache": "direct" if args.direct else "warm", "warmup": 1,
                "iterations": args.iterations},
        "save": {"durability": "fsync", "validate": "none", "keep": 1},
        "archive": {"path": scratch / f"archive_np{nranks}.csv"},
    })


def run_dd_writes(scratch: Path, nranks: int, size_bytes: int, direct: bool) -> float:
    """One dd per rank into a new file, all at once; total bytes / the slowest dd's time."""
    count = size_bytes // nranks // BLOCK_BYTES
    outputs = [scratch / f"dd-{rank}.out" for rank in range(nranks)]
    commands = [["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={count}", "conv=fsync"]
                + (["oflag=direct"] if direct else []) for path in outputs]
    gbps = run_dd_together(commands, size_bytes)
    for path in outputs:
        path.unlink()
    return gbps


def run_c_together(binary: Path, scratch: Path, nranks: int, size_bytes: int,
                   direct: bool) -> float:
    """One C writer per rank into a new file, all at once; total bytes / the slowest."""
    outputs = [scratch / f"c-{rank}.out" for rank in range(nranks)]
    procs = [subprocess.Popen([str(binary), str(path), str(size_bytes // nranks // BLOCK_BYTES),
                               str(int(direct))], stdout=subprocess.PIPE, text=True)
             for path in outputs]
    seconds = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise SystemExit(proc.returncode)
        seconds.append(float(out))
    for path in outputs:
        path.unlink()
    return size_bytes / max(seconds) / 1e9


def save_gbps(archive: Path) -> MedianMinMax:
    """The save pseudo-op's agg GB/s: median of the runs' medians, min, max."""
    runs = [(float(row["agg_gbps"]), float(row["agg_gbps_min"]), float(row["agg_gbps_max"]))
            for row in archive_rows(archive) if row["op"] == "save" and row["valid"] == "true"]
    return (statistics.median(run[0] for run in runs), min(run[1] for run in runs),
            max(run[2] for run in runs))


def measure(scratch: Path, nranks: int, args: argparse.Namespace,
            binary: Path | None) -> tuple[MedianMinMax, MedianMinMax, MedianMinMax | None]:
    """(stampede, dd, C) GB/s at one rank count, the sides taking turns."""
    job = write_job(scratch, nranks, args)
    dd: list[float] = []
    floor: list[float] = []
    for round_number in range(args.rounds):
        if round_number % 2:   # alternate who goes first, so drifting load hits both sides
            run_stampede("save", job, nranks)
        for _ in range(args.repeats):
            dd.append(run_dd_writes(scratch, nranks, args.size_bytes, args.direct))
            if binary is not None:
                floor.append(run_c_together(binary, scratch, nranks, args.size_bytes,
                                            args.direct))
        if round_number % 2 == 0:
            run_stampede("save", job, nranks)
    saved = save_gbps(scratch / f"archive_np{nranks}.csv")
    run_stampede("clean", job, 1)
    return saved, median_min_max(dd), median_min_max(floor) if floor else None


def main() -> int:
    args = parse_args()
    with scratch_directory("stampede-save-vs-dd-", args.dir) as scratch:
        print(f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; load average "
              f"{load_average_text()}")
        print(f"save_vs_dd: {args.size} per save, 4 MiB blocks, "
              f"{'O_DIRECT' if args.direct else 'buffered + fsync'}, ranks {args.ranks}; "
              f"{args.rounds} rounds of stampede {args.iterations} saves and dd {args.repeats} "
              "repeats", flush=True)
        binary = compile_c(C_SOURCE, scratch, "save_ref", "the C floor")
        header = (f"{'ranks':>5} {'stampede save GB/s':>24} {'dd conv=fsync GB/s':>24} "
                  f"{'C write+fsync GB/s':>24} {'save/dd':>8} {'save/C':>7}  verdict")
        lines = []
        for nranks in args.rank_counts:
            saved, dd, floor = measure(scratch, nranks, args, binary)
            ratio = saved[0] / dd[0]
            c_text = f"{floor[0]:>9.3f} ({floor[1]:5.3f}-{floor[2]:5.3f})" if floor else f"{'-':>24}"
            c_ratio = f"{saved[0] / floor[0]:>7.3f}" if floor else f"{'-':>7}"
            lines.append(f"{nranks:>5} {saved[0]:>9.3f} ({saved[1]:5.3f}-{saved[2]:5.3f}) "
                         f"{dd[0]:>9.3f} ({dd[1]:5.3f}-{dd[2]:5.3f}) {c_text} {ratio:>8.3f} "
                         f"{c_ratio}  {ratio_verdict(ratio, TARGET_RATIO, (saved, dd))}")
        print()
        print(header)
        print("-" * len(header))
        print("\n".join(lines))
        print("GB = 1e9 B; medians with (min-max) over all rounds; save = phase start -> the last "
              "rank's bytes durable (create .. fsync_dir)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
