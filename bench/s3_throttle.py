"""The object-store stampede under throttling, on the wall clock: `stampede run` through
`stampede emulate-s3` in front of a real SeaweedFS, for shared and sharded checkpoints in
K = 1, 2, 4 copies, for a sharded one with hashed keys (`checkpoint.key_prefix = "hash"`:
each shard's key led by 4 hex digits of its number's hash) and for list-first (every rank
lists) against list-bcast (rank 0 lists and broadcasts), each with the S3 client's
`standard` and `adaptive` retry modes.

    .venv/bin/python bench/s3_throttle.py                 # 8 ranks, the defaults below
    .venv/bin/python bench/s3_throttle.py --nranks 4 --copies 1,2 --modes standard

Each checkpoint is prepared straight to SeaweedFS (not counted); then each (case, layout,
mode) is one `mpiexec -n N stampede run` through a fresh emulator (full buckets, its own
--log). One layout a run, so that no layout meets the buckets another drained (each
phase's clients start as a restarted job's: adaptive's limiter off, whatever the phase
before met; before that, shared's 503s slowed sharded in one run). `--split-delay-s inf`: no split, the
partitions are what the case makes them; K copies `--partitioned BUCKET/kK/copy-`, so
each copy's prefix has a budget of its own, as S3 gives a partitioned prefix; hashed keys
`--partitioned BUCKET/hash/`, so each first hex digit of the keys is a partition (up to
16: two shards may share one, as two keys under one of S3's partitions do). Printed, from
one run:

1. Per case, mode and layout (from the archive's rows): the throttling answers (503s)
   the ranks met in the timed ops, their retries, the seconds they spent backing off
   (summed over ranks and iterations) and the time to last rank (median over iterations),
   with each op's 503s / retries / backoff.
2. Per case, layout, mode and busy partition (from the emulator's --log): the rate it was
   asked to hold (--get-rate or --list-rate) against the rate the clients achieved: admitted
   requests of that kind over the partition's whole span (first request to last), and
   over its throttled spell (first 503 to last 503, when it lasted 1 s or more: the token
   bucket's own rate, where the clients kept it busy), with the ratios; and the 503s it
   answered. A ratio below 1 over
   the span is capacity the clients' back-off left unused.

The machine is shared and small: 8 ranks on 2 cores take minutes; each number is one
run's (the rates are counts over seconds of the emulator's own clock).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from common import (
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    mpiexec_command,
    scratch_directory,
)

from stampede.emulate.s3front import Request, read_log
from stampede.ops import RETRY_OPS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.s3server import S3Server, running_server  # noqa: E402
from tests.helpers.throttling import emulator  # noqa: E402

MODES = ("standard", "adaptive")
MIN_SPELL_S = 1.0
SPREAD_LAYOUTS = ("shared", "sharded")
LIST_LAYOUTS = ("list-first", "list-bcast")


@dataclass(frozen=True)
class Case:
    name: str                   # the checkpoint's prefix in the bucket
    layouts: tuple[str, ...]
    copies: int = 1
    key_prefix: str = "none"    # "hash": each shard's key led by its hash's hex digits


def parse_arguments() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--nranks", type=int, default=8)
    parser.add_argument("--size", default="8MiB", help="checkpoint size (default 8MiB)")
    parser.add_argument("--block-size", default="256KiB", help="one ranged GET (default 256KiB)")
    parser.add_argument("--copies", default="1,2,4", help="K of the shared/sharded cases")
    parser.add_argument("--modes", default="standard,adaptive")
    parser.add_argument("--no-lists", action="store_true", help="leave list-first/list-bcast out")
    parser.add_argument("--no-hashed", action="store_true",
                        help="leave the sharded checkpoint with hashed keys out")
    parser.add_argument("--get-rate", type=float, default=20.0, help="per partition (default 20)")
    parser.add_argument("--put-rate", type=float, default=20.0)
    parser.add_argument("--list-rate", type=float, default=2.0, help="per partition (default 2)")
    parser.add_argument("--burst", type=float, default=4.0)
    parser.add_argument("--max-attempts", type=int, default=10,
                        help="the client's attempts per request (default 10)")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--reports", action="store_true",
                        help="also print each run's own report (stampede run's output)")
    add_scratch_parent_option(parser)
    return parser.parse_args()


def job_text(case: Case, args: argparse.Namespace, bucket: str, endpoint: str, mode: str,
             archive: Path) -> str:
    return "\n".join([
        "[target]", f'path = "s3://{bucket}/{case.name}"',
        f'storage_options = {{endpoint_url = "{endpoint}", retry_mode = "{mode}", '
        f"max_attempts = {args.max_attempts}}}",
        "[checkpoint]", f'size = "{args.size}"', f'block_size = "{args.block_size}"',
        'format = "raw"', "layout = [" + ", ".join(f'"{name}"' for name in case.layouts) + "]",
        f"copies = {case.copies}", f'key_prefix = "{case.key_prefix}"',
        "[run]", f"iterations = {args.iterations}", "warmup = 0", 'verify = "none"',
        "[archive]", f'path = "{archive}"', ""])


def run_stampede(step: str, job: Path, nranks: int, env: dict[str, str]) -> str:
    """`mpiexec -n N stampede STEP JOB`; its output (the report), or exit with it."""
    command = mpiexec_command(nranks, sys.executable, "-m", "stampede", step, str(job))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.stderr.write(f"FAILED ({done.returncode}): {' '.join(command)}\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
        raise SystemExit(done.returncode)
    return done.stdout


def emulator_flags(case: Case, args: argparse.Namespace, bucket: str) -> list[str]:
    flags = ["--get-rate", f"{args.get_rate:g}", "--put-rate", f"{args.put_rate:g}",
             "--list-rate", f"{args.list_rate:g}", "--burst", f"{args.burst:g}",
             "--split-delay-s", "inf"]
    if case.copies > 1:
        flags += ["--partitioned", f"{bucket}/{case.name}/copy-"]
    if case.key_prefix == "hash":
        flags += ["--partitioned", f"{bucket}/{case.name}/"]
    return flags


def layout_lines(rows: list[dict[str, str]], case: Case, mode: str) -> list[str]:
    """One line per layout: 503s, retries, backoff, time to last rank; its ops' share."""
    lines = []
    for layout in case.layouts:
        mine = [row for row in rows if row["layout"] == layout]
        restore = next(row for row in mine if row["op"] == "restore")
        per_op = [(row["op"], int(row["throttles"] or 0), int(row["retries"] or 0),
                   float(row["backoff_s"] or 0.0)) for row in mine if row["op"] in RETRY_OPS]
        total = [sum(item[i] for item in per_op) for i in (1, 2, 3)]
        ops = ", ".join(f"{op} {n503}/{retried}/{waited:.1f}s" for op, n503, retried, waited
                        in per_op if n503 or retried or waited)
        lines.append(f"{mode:<9} {case.name:<6} {layout:<11} {case.copies:>2} {total[0]:>6} "
                     f"{total[1]:>8} {total[2]:>10.1f} {float(restore['time_to_last_rank_s']):>10.2f}"
                     f"   {ops or '-'}")
    return lines


def rate_lines(requests: list[Request], case: Case, mode: str,
               args: argparse.Namespace) -> list[str]:
    """Per busy partition and kind (read, list): asked rate against achieved."""
    configured = {"read": args.get_rate, "list": args.list_rate}
    by_partition: dict[tuple[str, str], list[Request]] = defaultdict(list)
    for request in requests:
        if request.kind in configured:
            by_partition[request.partition, request.kind].append(request)
    lines = []
    for (partition, kind), seen in sorted(by_partition.items()):
        denied = [r.time_s for r in seen if r.status == 503]
        if not denied:
            continue   # never throttled: its rate says nothing of the limit
        admitted = [r.time_s for r in seen if r.status != 503]
        span_s = seen[-1].time_s - seen[0].time_s
        spell = [t for t in admitted if denied[0] <= t <= denied[-1]]
        spell_s = denied[-1] - denied[0]
        overall = len(admitted) / span_s if span_s > 0 else float("nan")
        # a spell of a few 503s within a second says nothing of a rate
        busy = len(spell) / spell_s if spell_s >= MIN_SPELL_S else float("nan")
        rate = configured[kind]
        lines.append(f"{mode:<9} {case.name:<6} {case.layouts[0]:<11} {partition:<28} "
                     f"{kind:<5} {rate:>6g} "
                     f"{overall:>8.2f} {overall / rate:>6.2f} {busy:>8.2f} {busy / rate:>6.2f} "
                     f"{len(denied):>6} {len(seen):>6}")
    return lines


def main() -> int:
    args = parse_arguments()
    modes = comma_separated(args.modes, str)
    if set(modes) - set(MODES):
        raise SystemExit(f"--modes {args.modes}: each must be one of {', '.join(MODES)}")
    cases = [Case(f"k{k}", SPREAD_LAYOUTS, k) for k in comma_separated(args.copies, int)]
    if not args.no_hashed:
        cases.append(Case("hash", ("sharded",), key_prefix="hash"))
    if not args.no_lists:
        cases.append(Case("lists", LIST_LAYOUTS))
    layouts, rates = [], []
    with scratch_directory("stampede-s3-throttle-", args.dir) as scratch, \
            running_server(scratch) as server:
        env = {**os.environ, **server.env, "COLUMNS": "120"}
        os.environ.update(server.env)    # the emulator's own bucket check, and clean
        for case in cases:
            direct = scratch / f"{case.name}-prepare.toml"
            direct.write_text(job_text(case, args, server.bucket, server.endpoint_url,
                                       "standard", scratch / "prepare.csv"))
            run_stampede("prepare", direct, args.nranks, env)
        for mode in modes:
            for case in cases:
                for layout in case.layouts:
                    alone = replace(case, layouts=(layout,))
                    stem = f"{case.name}-{layout}-{mode}"
                    archive, log = scratch / f"{stem}.csv", scratch / f"{stem}.jsonl"
                    with emulator(server, log, *emulator_flags(case, args,
                                                               server.bucket)) as endpoint:
                        job = scratch / f"{stem}.toml"
                        job.write_text(job_text(alone, args, server.bucket, endpoint, mode,
                                                archive))
                        report = run_stampede("run", job, args.nranks, env)
                    if args.reports:
                        print(f"--- {case.name} {layout} {mode}: mpiexec -n {args.nranks} "
                              f"stampede run\n{report}")
                    layouts += layout_lines(archive_rows(archive), alone, mode)
                    rates += rate_lines(read_log(str(log)), alone, mode, args)
                    statuses = Counter(r.status for r in read_log(str(log)))
                    print(f"done: {case.name} {layout} {mode} ({statuses})", file=sys.stderr,
                          flush=True)
        print_report(args, server, layouts, rates)
    return 0


def print_report(args: argparse.Namespace, server: S3Server, layouts: list[str],
                 rates: list[str]) -> None:
    print(f"{machine_text(with_ram=False)}; load {load_average_text()}")
    print(f"{args.nranks} ranks, {args.size} in {args.block_size} GETs, {args.iterations} "
          f"iterations; emulator per partition: GET/HEAD {args.get_rate:g}/s, PUT "
          f"{args.put_rate:g}/s, LIST {args.list_rate:g}/s, burst {args.burst:g}, no split; "
          f"max_attempts {args.max_attempts}; SeaweedFS {server.endpoint_url}")
    print("\n1. per layout: 503s, retries, backoff summed over ranks and iterations; last rank "
          "= median time to last rank; ops: 503s/retries/backoff")
    print(f"{'mode':<9} {'case':<6} {'layout':<11} {'K':>2} {'503s':>6} {'retries':>8} "
          f"{'backoff s':>10} {'last rank':>10}   ops")
    print("\n".join(layouts))
    print("\n2. per throttled partition: the rate asked (r/s) against the admitted rate over "
          "its span (first to last request) and over its throttled spell (first to last 503)")
    print(f"{'mode':<9} {'case':<6} {'layout':<11} {'partition':<28} {'kind':<5} "
          f"{'asked':>6} {'span r/s':>8} "
          f"{'ratio':>6} {'spell r/s':>8} {'ratio':>6} {'503s':>6} {'asked#':>6}")
    print("\n".join(rates) or "(no partition was throttled)")


if __name__ == "__main__":
    raise SystemExit(main())
