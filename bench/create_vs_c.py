"""The save's create latency: stampede's timed create versus a C loop of open(O_CREAT|O_EXCL)
+ close, on the same file system, in one run.

  C         a program compiled here with gcc (skipped, said, without gcc): --creates times,
            the metadata of one save, untimed around one timed create: the journal
            replaced (fsynced), the version's two directories made, then open(O_WRONLY |
            O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640) timed alone between two
            clock_gettime(CLOCK_MONOTONIC) reads, then a write, close, rename, the pointer
            replaced, the previous version's file and directories removed and the
            journal replaced again, so that its creates meet the file system in the state
            a save's do; p50 and p99 in ns (linear interpolation, as numpy). Row "timer":
            the clock pair alone. Row "C cold": the same with 8 MiB of memory touched
            before each create, as a save's untimed set-up (the shard filled and hashed,
            the journal written) touches memory between creates and a trainer does: the
            CPU's caches are as cold for the C create as for stampede's.
  stampede  `stampede save` at one rank, a 4 KiB sharded checkpoint, --creates measured
            saves (save.durability = none and save.validate = none: nothing but the
            metadata ops between saves, and quick), each a new version directory with one
            create in it; lat_p50_s and lat_p99_s of the create op from the archive.

The sides take turns, --rounds times, each after a sync(2) so that it does not pay for
the other's removals; the table shows the median over rounds. Overhead
per create = stampede p50 - C p50, against both C rows; target <= 1000 ns (1 µs). The verdict is printed,
never an exit status: the script exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

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
POLLUTE_BYTES = 8 * 2**20   # "C cold": touched between creates, as a save's set-up does
C_SOURCE = r"""
#define _GNU_SOURCE
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
/* what a save does around its create, untimed, so both sides time it on a file system in
   the same state: the journal replaced (fsynced), the version's directories made */
static void replace_file(const char *root, const char *name, int sync) {
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", root, name);
    snprintf(path, sizeof path, "%s/%s", root, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0640);
    if (fd < 0 || write(fd, "v000001\n", 8) != 8 || (sync && fsync(fd)) || close(fd)) exit(1);
    if (rename(tmp, path)) exit(1);
}
int main(int argc, char **argv) {   /* ROOT N POLLUTE: N saves' metadata, the create timed */
    if (argc != 4) return 2;
    const char *root = argv[1];
    int n = atoi(argv[2]); long long *d = malloc(sizeof *d * n), *t = malloc(sizeof *t * n);
    size_t pollute = (size_t)atol(argv[3]); volatile unsigned char *junk = malloc(pollute + 1);
    char path[4096], final[4096], old[4096];
    for (int i = 0; i < n; i++) { long long a = now_ns(); t[i] = now_ns() - a; }
    for (int i = 0; i < n; i++) {
        replace_file(root, "journal.json", 1);             /* the version recorded */
        for (size_t b = 0; b < pollute; b += 64) junk[b] = (unsigned char)b;   /* caches cold */
        snprintf(path, sizeof path, "%s/v%06d", root, i);
        if (mkdir(path, 0750)) { perror("mkdir"); return 1; }
        snprintf(path, sizeof path, "%s/v%06d/sharded", root, i);
        if (mkdir(path, 0750)) { perror("mkdir"); return 1; }
        snprintf(path, sizeof path, "%s/v%06d/sharded/.shard-00000-of-00001.raw.partial", root, i);
        long long a = now_ns();
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
        d[i] = now_ns() - a;
        if (fd < 0 || write(fd, t, 8) != 8 || close(fd)) { perror("open"); return 1; }
        snprintf(final, sizeof final, "%s/v%06d/sharded/shard-00000-of-00001.raw", root, i);
        if (rename(path, final)) return 1;
        replace_file(root, "latest", 0);                   /* published */
        if (i > 0) {                                        /* the previous version released */
            snprintf(old, sizeof old, "%s/v%06d/sharded/shard-00000-of-00001.raw", root, i - 1);
            unlink(old);
            snprintf(old, sizeof old, "%s/v%06d/sharded", root, i - 1);
            rmdir(old);
            snprintf(old, sizeof old, "%s/v%06d", root, i - 1);
            rmdir(old);
        }
        replace_file(root, "journal.json", 1);             /* the outcome recorded */
    }
    qsort(t, n, sizeof *t, cmp); qsort(d, n, sizeof *d, cmp);
    printf("timer %.1f %.1f\ncreate %.1f %.1f\n", pct(t, n, .5), pct(t, n, .99), pct(d, n, .5),
           pct(d, n, .99));
    return 0;
}
"""


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--creates", type=int, default=300,
                        help="creates per round on each side (default 300)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of C then stampede; medians over rounds (default 3)")
    add_scratch_parent_option(parser)
    return parser.parse_args()


def c_round(binary: Path, root: Path, creates: int,
            pollute_bytes: int) -> dict[str, tuple[float, float]]:
    """op -> (p50_ns, p99_ns) from one run of the C loop, in a fresh directory."""
    shutil.rmtree(root, ignore_errors=True)
    series = root / "ckpt" / "saves" / "sharded"   # paths as deep as a save's
    series.mkdir(parents=True)
    lines = run_checked([str(binary), str(series), str(creates), str(pollute_bytes)]).split("\n")
    shutil.rmtree(root, ignore_errors=True)
    return {op: (float(p50), float(p99)) for op, p50, p99 in
            (line.split() for line in lines if line.strip())}


def stampede_round(scratch: Path, job: Path, round_number: int) -> tuple[float, float]:
    archive = scratch / f"create_{round_number}.csv"
    run_stampede("save", job, 1, f"archive.path={archive}")
    run_stampede("clean", job, 1)
    row = next(row for row in archive_rows(archive) if row["op"] == "create")
    return float(row["lat_p50_s"]) * 1e9, float(row["lat_p99_s"]) * 1e9


def main() -> int:
    args = parse_args()
    with scratch_directory("stampede-create-vs-c-", args.dir) as scratch:
        print(f"{machine_text(with_ram=False)}, load average {load_average_text()}; "
              f"{scratch_text(scratch)}")
        job = write_job_toml(scratch / "create.toml", {
            "target": {"path": scratch / "ckpt"},
            "checkpoint": {"size": "4KiB", "layout": ["sharded"], "block_size": "4KiB"},
            "run": {"iterations": args.creates, "warmup": 1},
            "save": {"durability": "none", "validate": "none", "keep": 1},
            "archive": {"path": scratch / "unused.csv"}})
        binary = compile_c(C_SOURCE, scratch, "create_ref", "the C reference")
        c_rounds, cold_rounds, ours = [], [], []
        for round_number in range(args.rounds):
            # each side starts on a settled file system: the other's removals written back
            if binary is not None:
                os.sync()
                c_rounds.append(c_round(binary, scratch / "c", args.creates, 0))
                os.sync()
                cold_rounds.append(c_round(binary, scratch / "c", args.creates, POLLUTE_BYTES))
            os.sync()
            ours.append(stampede_round(scratch, job, round_number))
        print(f"\n{'side':<10} {'create p50 ns':>14} {'p99 ns':>12}")
        sides = [("C timer", c_rounds, "timer"), ("C create", c_rounds, "create"),
                 ("C cold", cold_rounds, "create")] if c_rounds else []
        for name, rounds, op in sides:
            print(f"{name:<10} {statistics.median(r[op][0] for r in rounds):>14.0f} "
                  f"{statistics.median(r[op][1] for r in rounds):>12.0f}")
        p50 = statistics.median(p for p, _ in ours)
        print(f"{'stampede':<10} {p50:>14.0f} {statistics.median(p for _, p in ours):>12.0f}")
        for name, rounds in (("C", c_rounds), ("C cold", cold_rounds)) if c_rounds else ():
            overhead = p50 - statistics.median(r["create"][0] for r in rounds)
            verdict = "PASS" if overhead <= TARGET_OVERHEAD_NS else \
                f"above target ({TARGET_OVERHEAD_NS:.0f} ns)"
            print(f"create overhead (stampede p50 - {name} p50): {overhead:.0f} ns  {verdict}")
        print(f"medians over {args.rounds} rounds of {args.creates} creates each, each in a new "
              "directory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
