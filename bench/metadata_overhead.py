"""Metadata op latency: stampede's timed stat / open / close versus C and bare Python.

One small checkpoint (default 64MiB, 1 rank, sharded layout) is prepared with stampede;
then, on its one file, in one run:

  C         a program compiled here with gcc (skipped, with a message, if gcc is missing):
            stat() --stats times, then open() --opens times keeping every fd, then close()
            them in reverse order (stampede's own order), each call timed alone with
            clock_gettime(CLOCK_MONOTONIC); p50 and p99 in ns (linear interpolation, as
            numpy). Row "timer": two clock reads with nothing between them, i.e. what
            the timing itself adds to each sample.
  Python    the same loops in this interpreter, shaped like stampede's: bound os.stat /
            os.open / os.close, time.perf_counter_ns() before and after each call and a
            tuple appended to a list outside the stamps. Shows Python's own share.
  stampede  `mpiexec -n 1 stampede run` with pattern.ops = ["stat"], stat_count = --stats,
            and a separate run with ["open", "close"], open_count = --opens; lat_p50_s
            and lat_p99_s of each op from the CSV archive (all measured iterations pooled).

The sides take turns, --rounds times; the table shows the median over rounds.

Overhead per op = stampede p50 - C p50, in ns; target <= 1000 ns (1 µs). Every side
does a warm-up pass first. The verdict is printed, never an exit status: the script
exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
from common import (
    add_scratch_parent_option,
    archive_rows,
    compile_c,
    docstring_parser,
    load_average_text,
    machine_text,
    run_checked,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

TARGET_OVERHEAD_NS = 1000.0
OPS = ("stat", "open", "close")
Percentiles = dict[str, tuple[float, float]]   # op -> (p50_ns, p99_ns)
Log = list[tuple[int, int, int, int, int, int]]   # stampede's sample shape
C_SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b; return (x > y) - (x < y);
}
static double pct(const long long *d, int n, double q) {   /* numpy's linear method */
    double pos = q * (n - 1); int lo = (int)pos;
    return lo + 1 < n ? d[lo] + (pos - lo) * (d[lo + 1] - d[lo]) : d[lo];
}
static void report(const char *op, long long *d, int n) {
    qsort(d, n, sizeof *d, cmp);
    printf("%s %.1f %.1f\n", op, pct(d, n, 0.50), pct(d, n, 0.99));
}
/* run `call` between two clock reads into d[i]; yields the call's result (GNU C) */
#define TIMED(call) ({ long long t0 = now_ns(); long r_ = (call); d[i] = now_ns() - t0; r_; })
int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: PATH NSTATS NOPENS\n"); return 2; }
    const char *path = argv[1];
    int nstat = atoi(argv[2]), nopen = atoi(argv[3]), i;
    long long *d = malloc(sizeof *d * (nstat > nopen ? nstat : nopen));
    int *fds = malloc(sizeof *fds * nopen);
    struct stat st;
    for (int pass = 0; pass < 2; pass++) {          /* pass 0 is the warm-up */
        for (i = 0; i < nstat; i++) TIMED(0);       /* the clock pair alone */
        if (pass) report("timer", d, nstat);
        for (i = 0; i < nstat; i++)
            if (TIMED(stat(path, &st))) { perror("stat"); return 1; }
        if (pass) report("stat", d, nstat);
        for (i = 0; i < nopen; i++)
            if ((fds[i] = TIMED(open(path, O_RDONLY))) < 0) { perror("open"); return 1; }
        if (pass) report("open", d, nopen);
        for (i = nopen - 1; i >= 0; i--)
            if (TIMED(close(fds[i]))) { perror("close"); return 1; }
        if (pass) report("close", d, nopen);
    }
    return 0;
}
"""


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="64MiB", help="checkpoint size (default 64MiB)")
    parser.add_argument("--stats", type=int, default=20000,
                        help="stats per pass = stampede pattern.stat_count (default 20000)")
    parser.add_argument("--opens", type=int, default=10000,
                        help="opens per pass = pattern.open_count; all are open at once, so "
                             "it must stay below the open-files limit (default 10000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of C, Python, stampede in turn; the table shows the median "
                             "over rounds of each p50 and p99 (default 3)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and args.opens + 200 > hard:
        parser.error(f"--opens {args.opens}: the open-files hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))   # children inherit it
    return args


def machine_facts(scratch: Path) -> str:
    """One line: CPUs, kernel, load and the scratch directory's file system."""
    return (f"{machine_text(with_ram=False)}, load average {load_average_text()}; "
            f"{scratch_text(scratch)}")


def c_reference(binary: Path | None, path: str, nstats: int, nopens: int) -> Percentiles:
    """op -> (p50_ns, p99_ns) from the compiled C loop; empty without a binary."""
    if binary is None:
        return {}
    lines = run_checked([str(binary), path, str(nstats), str(nopens)]).split("\n")
    return {op: (float(p50), float(p99)) for op, p50, p99 in
            (line.split() for line in lines if line.strip())}


def _python_pass(path: str, nstats: int, nopens: int) -> dict[str, Log]:
    """One pass of each loop, written as stampede's pattern writes them."""
    clock = time.perf_counter_ns
    logs: dict[str, Log] = {op: [] for op in ("timer", *OPS)}
    append = logs["timer"].append
    for _ in range(nstats):
        start = clock()
        stop = clock()
        append((0, 0, start, stop, 0, 1))
    stat, append = os.stat, logs["stat"].append
    for _ in range(nstats):
        start = clock()
        stat(path)
        stop = clock()
        append((0, 0, start, stop, 0, 1))
    fds: list[int] = []
    open_, append = os.open, logs["open"].append
    for _ in range(nopens):
        start = clock()
        fd = open_(path, os.O_RDONLY)
        stop = clock()
        fds.append(fd)
        append((0, 1, start, stop, 0, 1))
    close, append = os.close, logs["close"].append
    while fds:
        fd = fds.pop()
        start = clock()
        close(fd)
        stop = clock()
        append((0, 2, start, stop, 0, 1))
    return logs


def python_reference(path: str, nstats: int, nopens: int) -> Percentiles:
    """op -> (p50_ns, p99_ns) of bare Python loops (plus the timer pair), after a warm-up."""
    _python_pass(path, nstats, nopens)
    results = {}
    for name, log in _python_pass(path, nstats, nopens).items():
        stamps = np.array(log, dtype=np.int64)
        p50, p99 = np.percentile(stamps[:, 3] - stamps[:, 2], (50, 99))
        results[name] = (float(p50), float(p99))
    return results


def stampede_latency(archive: Path, job: Path, args: argparse.Namespace) -> Percentiles:
    """op -> (p50_ns, p99_ns) of stampede's stat run and open/close run, from the archive."""
    for ops in ('["stat"]', '["open","close"]'):
        run_stampede("run", job, 1, f"pattern.ops={ops}", f"pattern.stat_count={args.stats}",
                     f"pattern.open_count={args.opens}", f"archive.path={archive}")
    rows = archive_rows(archive)
    return {row["op"]: (float(row["lat_p50_s"]) * 1e9, float(row["lat_p99_s"]) * 1e9)
            for row in rows if row["op"] in OPS}


def median_of_rounds(rounds: list[Percentiles]) -> Percentiles:
    """Per op, the median over rounds of the p50 and of the p99."""
    return {op: (float(np.median([r[op][0] for r in rounds])),
                 float(np.median([r[op][1] for r in rounds]))) for op in rounds[0]}


def print_table(c_ns: Percentiles, py_ns: Percentiles, stampede_ns: Percentiles) -> None:
    """p50 (p99) per op for each side, stampede's overhead over C and the verdict."""
    def cell(values: Percentiles, op: str) -> str:
        return f"{values[op][0]:8.0f} ({values[op][1]:6.0f})" if op in values else f"{'-':>17}"
    header = (f"{'op':<6} {'C p50 (p99) ns':>17} {'Python p50 (p99)':>17} "
              f"{'stampede p50 (p99)':>19} {'overhead ns':>12} {'Py-C':>5} {'st-Py':>5} "
              f"{'x C':>5}  verdict")
    print(header)
    print("-" * len(header))
    for op in ("timer",) + OPS:
        overhead_ns = python_ns = ratio = float("nan")
        verdict = "(the two clock reads alone)" if op == "timer" else "no C reference"
        if op in c_ns and op in stampede_ns and op != "timer":
            overhead_ns = stampede_ns[op][0] - c_ns[op][0]
            ratio = stampede_ns[op][0] / c_ns[op][0]
            python_ns = py_ns[op][0] - c_ns[op][0]
            verdict = ("PASS" if overhead_ns <= TARGET_OVERHEAD_NS
                       else f"above target ({TARGET_OVERHEAD_NS:.0f} ns)")
        numbers = (f"{overhead_ns:>12.0f} {python_ns:>5.0f} {overhead_ns - python_ns:>5.0f} "
                   f"{ratio:>5.2f}" if ratio == ratio else f"{'-':>12} {'-':>5} {'-':>5} {'-':>5}")
        print(f"{op:<6} {cell(c_ns, op)} {cell(py_ns, op)}  {cell(stampede_ns, op)} "
              f"{numbers}  {verdict}")


def main() -> int:
    """Prepare a small checkpoint, measure the three sides on its file, print, clean up."""
    args = parse_args()
    with scratch_directory("stampede-metadata-", args.dir) as scratch:
        print(machine_facts(scratch))
        job = write_job_toml(scratch / "metadata.toml", {
            "target": {"path": scratch / "ckpt"},
            "checkpoint": {"size": args.size, "layout": ["sharded"]},
            "run": {"cache": "warm", "iterations": 3, "warmup": 1},
        })
        run_stampede("prepare", job, 1)
        path = str(scratch / "ckpt" / "sharded" / "shard-00000-of-00001.raw")
        print(f"metadata_overhead: {path}; {args.rounds} rounds of: C and Python {args.stats} "
              f"stats and {args.opens} opens/closes (+ a warm-up pass), stampede 3 iterations "
              "of the same (+1 warm-up)", flush=True)
        binary = compile_c(C_SOURCE, scratch, "meta_ref", "the C reference")
        rounds: dict[str, list[Percentiles]] = {"C": [], "Python": [], "stampede": []}
        for number in range(args.rounds):
            rounds["C"].append(c_reference(binary, path, args.stats, args.opens))
            rounds["Python"].append(python_reference(path, args.stats, args.opens))
            rounds["stampede"].append(
                stampede_latency(scratch / f"archive-{number}.csv", job, args))
        print()
        print_table(*(median_of_rounds(rounds[side]) for side in ("C", "Python", "stampede")))
        print("ns per call, median over rounds of p50 (p99); overhead = stampede p50 - C p50, "
              f"target <= {TARGET_OVERHEAD_NS:.0f} ns;\nof it Py-C = Python's own share (bare loop"
              " - C), st-Py = stampede's (stampede - bare loop); x C = stampede p50 / C p50")
    return 0


if __name__ == "__main__":
    sys.exit(main())
