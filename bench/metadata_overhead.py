"""Metadata op latency: stampede's timed stat / open / close versus C and bare Python.

One small checkpoint (default 64MiB, 1 rank, sharded layout) is prepared with stampede;
then, on its one file, in one run:

  C         a program compiled here with gcc: stat() N times, then open() N times keeping
            every fd, then close() them in reverse order (stampede's own order), each call
            timed alone with clock_gettime(CLOCK_MONOTONIC); p50 and p99 in ns (linear
            interpolation, numpy's default). Row "timer": two clock reads with nothing
            between them, i.e. what the timing itself adds to each sample. Skipped, with a message, if gcc is missing.
  Python    the same loops in this interpreter, shaped like stampede's: bound os.stat /
            os.open / os.close, time.perf_counter_ns() before and after each call and a
            tuple appended to a list outside the stamps. Shows Python's own share.
  stampede  `mpiexec -n 1 stampede run` with pattern.ops = ["stat"], stat_count = N, and
            a separate run with ["open", "close"], open_count = --opens; lat_p50_s and
            lat_p99_s of each op from the CSV archive (all measured iterations pooled).

Overhead per op = stampede p50 - C p50, in ns; target <= 1000 ns (1 µs). Every side
does a warm-up pass first. The verdict is printed, never an exit status: the script
exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stampede.sysinfo import mount_of

VENV_BIN = Path(sys.executable).parent
TARGET_OVERHEAD_NS = 1000.0
OPS = ("stat", "open", "close")
C_SOURCE = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
static double pct(const long long *d, int n, double q) {   /* numpy's linear method */
    double pos = q * (n - 1); int lo = (int)pos;
    return lo + 1 < n ? d[lo] + (pos - lo) * (d[lo + 1] - d[lo]) : d[lo];
}
static void report(const char *op, long long *d, int n) {
    qsort(d, n, sizeof *d, cmp);
    printf("%s %.1f %.1f\n", op, pct(d, n, 0.50), pct(d, n, 0.99));
}
int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: PATH NSTATS NOPENS\n"); return 2; }
    const char *path = argv[1];
    int nstat = atoi(argv[2]), nopen = atoi(argv[3]), n = nstat > nopen ? nstat : nopen;
    long long *d = malloc(sizeof *d * n);
    int *fds = malloc(sizeof *fds * nopen);
    struct stat st;
    for (int pass = 0; pass < 2; pass++) {               /* pass 0 is the warm-up */
        for (int i = 0; i < nstat; i++) {                /* the clock pair alone */
            long long t0 = now_ns(); long long t1 = now_ns();
            d[i] = t1 - t0;
        }
        if (pass) report("timer", d, nstat);
        for (int i = 0; i < nstat; i++) {
            long long t0 = now_ns(); int r = stat(path, &st); long long t1 = now_ns();
            if (r) { perror("stat"); return 1; }
            d[i] = t1 - t0;
        }
        if (pass) report("stat", d, nstat);
        for (int i = 0; i < nopen; i++) {
            long long t0 = now_ns(); fds[i] = open(path, O_RDONLY); long long t1 = now_ns();
            if (fds[i] < 0) { perror("open"); return 1; }
            d[i] = t1 - t0;
        }
        if (pass) report("open", d, nopen);
        for (int i = nopen - 1; i >= 0; i--) {
            long long t0 = now_ns(); int r = close(fds[i]); long long t1 = now_ns();
            if (r) { perror("close"); return 1; }
            d[i] = t1 - t0;
        }
        if (pass) report("close", d, nopen);
    }
    return 0;
}
"""


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="64MiB", help="checkpoint size (default 64MiB)")
    parser.add_argument("--stats", type=int, default=20000,
                        help="stats per pass = stampede pattern.stat_count (default 20000)")
    parser.add_argument("--opens", type=int, default=10000,
                        help="opens per pass = pattern.open_count; all are open at once, so "
                             "it must stay below the open-files limit (default 10000)")
    parser.add_argument("--dir", default=None,
                        help="parent of the scratch directory (default: the system temp dir); "
                             "the scratch directory is created fresh and removed at the end")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and args.opens + 200 > hard:
        parser.error(f"--opens {args.opens}: the open-files hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))   # children inherit it
    return args


def machine_facts(scratch: Path) -> str:
    """One line: CPUs, kernel, load and the scratch directory's file system."""
    mount = mount_of(scratch)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return (f"machine: {os.cpu_count()} CPUs, kernel {os.uname().release}, load average {load}; "
            f"scratch {scratch} on {mount.fs_type} ({mount.device} at {mount.mountpoint})")


def run_checked(command: list[str]) -> str:
    """Run a command; return its stdout, or exit with its status and output if it fails."""
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        sys.stderr.write(f"FAILED ({result.returncode}): {' '.join(command)}\n"
                         f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        raise SystemExit(result.returncode)
    return result.stdout


def stampede(step: str, job: Path, *overrides: str) -> None:
    """`mpiexec -n 1 stampede STEP JOB --set ...` with the venv's own tools."""
    command = [str(VENV_BIN / "mpiexec"), "-n", "1", str(VENV_BIN / "stampede"), step, str(job)]
    for override in overrides:
        command += ["--set", override]
    run_checked(command)


def c_reference(scratch: Path, path: str, nstats: int, nopens: int) -> dict[str, tuple[float, float]]:
    """op -> (p50_ns, p99_ns) from the compiled C loop; empty when gcc is missing."""
    gcc = shutil.which("gcc")
    if gcc is None:
        print("gcc not found: the C reference is skipped (apt-get install gcc to get it)")
        return {}
    source, binary = scratch / "meta_ref.c", scratch / "meta_ref"
    source.write_text(C_SOURCE)
    run_checked([gcc, "-O2", "-o", str(binary), str(source)])
    lines = run_checked([str(binary), path, str(nstats), str(nopens)]).split("\n")
    return {op: (float(p50), float(p99)) for op, p50, p99 in
            (line.split() for line in lines if line.strip())}


def python_reference(path: str, nstats: int, nopens: int) -> dict[str, tuple[float, float]]:
    """op -> (p50_ns, p99_ns) of loops shaped like stampede's pattern, plus the timer pair."""
    clock = time.perf_counter_ns
    results: dict[str, tuple[float, float]] = {}
    for is_warmup in (True, False):
        logs: dict[str, list[tuple[int, int, int, int, int, int]]] = {op: [] for op in OPS}
        logs["timer"] = []
        for name, call, arg in (("stat", os.stat, path), ("timer", None, None)):
            append = logs[name].append
            for _ in range(nstats):
                start = clock()
                if call is not None:
                    call(arg)
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
        if not is_warmup:
            for name, log in logs.items():
                stamps = np.array(log, dtype=np.int64)
                p50, p99 = np.percentile(stamps[:, 3] - stamps[:, 2], (50, 99))
                results[name] = (float(p50), float(p99))
    return results


def stampede_latency(scratch: Path, job: Path, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """op -> (p50_ns, p99_ns) of stampede's stat run and open/close run, from the archive."""
    stampede("run", job, 'pattern.ops=["stat"]', f"pattern.stat_count={args.stats}")
    stampede("run", job, 'pattern.ops=["open","close"]', f"pattern.open_count={args.opens}")
    rows = list(csv.DictReader((scratch / "archive.csv").open()))
    return {row["op"]: (float(row["lat_p50_s"]) * 1e9, float(row["lat_p99_s"]) * 1e9)
            for row in rows if row["op"] in OPS}


def print_table(c_ns: dict[str, tuple[float, float]], py_ns: dict[str, tuple[float, float]],
                stampede_ns: dict[str, tuple[float, float]]) -> None:
    """p50 (p99) per op for each side, stampede's overhead over C and the verdict."""
    def cell(values: dict[str, tuple[float, float]], op: str) -> str:
        return f"{values[op][0]:8.0f} ({values[op][1]:6.0f})" if op in values else f"{'-':>17}"
    header = (f"{'op':<6} {'C p50 (p99) ns':>17} {'Python p50 (p99)':>17} "
              f"{'stampede p50 (p99)':>19} {'overhead ns':>12} {'x C':>6}  verdict")
    print(header)
    print("-" * len(header))
    for op in ("timer",) + OPS:
        overhead_ns = ratio = float("nan")
        verdict = "(the two clock reads alone)" if op == "timer" else "no C reference"
        if op in c_ns and op in stampede_ns and op != "timer":
            overhead_ns = stampede_ns[op][0] - c_ns[op][0]
            ratio = stampede_ns[op][0] / c_ns[op][0]
            verdict = ("PASS" if overhead_ns <= TARGET_OVERHEAD_NS
                       else f"above target ({TARGET_OVERHEAD_NS:.0f} ns)")
        numbers = f"{overhead_ns:>12.0f} {ratio:>6.2f}" if ratio == ratio else f"{'-':>12} {'-':>6}"
        print(f"{op:<6} {cell(c_ns, op)} {cell(py_ns, op)}  {cell(stampede_ns, op)} "
              f"{numbers}  {verdict}")


def main() -> int:
    """Prepare a small checkpoint, measure the three sides on its file, print, clean up."""
    args = parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="stampede-metadata-", dir=args.dir))
    try:
        print(machine_facts(scratch))
        job = scratch / "metadata.toml"
        job.write_text(f'[target]\npath = "{scratch / "ckpt"}"\n'
                       f'[checkpoint]\nsize = "{args.size}"\nlayout = ["sharded"]\n'
                       f'[run]\ncache = "warm"\niterations = 3\nwarmup = 1\n'
                       f'[archive]\npath = "{scratch / "archive.csv"}"\n')
        stampede("prepare", job)
        path = str(scratch / "ckpt" / "sharded" / "rank-00000-of-00001.raw")
        print(f"metadata_overhead: {path}; C and Python {args.stats} stats and {args.opens} "
              f"opens/closes per pass; stampede 3 iterations of the same (+1 warm-up)", flush=True)
        c_ns = c_reference(scratch, path, args.stats, args.opens)
        py_ns = python_reference(path, args.stats, args.opens)
        stampede_ns = stampede_latency(scratch, job, args)
        print()
        print_table(c_ns, py_ns, stampede_ns)
        print("ns per call, p50 (p99); overhead = stampede p50 - C p50, target <= "
              f"{TARGET_OVERHEAD_NS:.0f} ns; x C = stampede p50 / C p50")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
