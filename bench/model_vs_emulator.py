"""The contention model (stampede project) against the metadata-server emulator, s and c known.

Issue 6 part 2's validation: with a metadata server whose service time S and threads C
are known (`stampede emulate-mds --service-s S --threads C`), the time to last rank that
`stampede run` measures at N = 1, 2, 4, 8 ranks must agree with the model's prediction
(stampede.model.contention.predict, nothing fitted to these runs' metadata) within 15%.

What runs. A scratch backing directory is mounted three times by `stampede emulate-mds`:

  base      --service-s 0: the FUSE pass-through with no service time. Gives what is not
            metadata service: the FUSE round trip of an op (RTT) and the data term.
  plain     --service-s S --threads C: the sharded layout (one file per rank).
  serial    the same plus --serialize-inode: the shared layout (one file, whose requests
            queue one at a time: the hot spot the model's c_eff = 1 stands for).

For each N a checkpoint of --size-per-rank (default 2MiB, so that the data term is small
but present) is prepared with stampede directly in the backing directory; then, --runs
times, `mpiexec -n N stampede run` (pattern stat, open, read, close; stat_count =
open_count = 1; --iterations, warmup 1; cache warm, verify none) reads it through each
mount: both layouts through base, sharded through plain, shared through serial. Measured:
the median over runs of the archive's time_to_last_rank_s (itself the median over
iterations), with the runs' min-max.

How stampede's ops map to emulator requests. The kernel's caches are off, so each op
on MOUNT/DIR/FILE walks the path: LOOKUPs of DIR and FILE, then GETATTR (stat) or OPEN
(open); the read may add GETATTRs of its own (the kernel checks the file's size). The
requests are COUNTED in each emulator's log (--log) over the restores themselves, not
assumed, and not probed with one stat and one open (a probe counts 3 + 3 where a
restore's rank made 8 per iteration here: 7 GETATTRs, 1 OPEN). Every `stampede run`
through the plain and serial mounts is bracketed by two readings of the monotonic clock
(the log's), and at each N one more run with a single measured iteration is made: the
requests of one measured iteration per rank = (the median run's requests - the
one-iteration run's) / ((iterations - 1) x N), which cancels the warmup and whatever the
run does once before its clock (bench/emulator_requests.py). Each request is split by
the log's own record: queued on the file's lock ("file:PATH", --serialize-inode) or not
(the DIR lookup: directories are not serialized).

  sharded   every request takes one of C slots for S, so a rank's r requests: model ops
            = r, s = S, c = C, RTT per request = k x the base mount's per-op latency / r
            (k = 2 ops: the round trips of the read's own requests are in the data term).
  shared    with --serialize-inode the file's f requests per rank queue one at a time,
            the d others do not (they take a slot, outside the file's queue): model ops
            = stampede's ops (k = 2), s = S x f / k, c_eff = 1, RTT = the base per-op
            latency + S x d / k. Treating the DIR lookups as round trips outside the
            server is the approximation of this layout: they do wait for a slot, but
            with C >= 2 one slot is free while the file's queue holds the other.

The drain counts whole rounds (s ceil(N k / c), project's known-c form).

RTT and the data term are measured separately, on the base mount (S = 0), not fitted to
the runs being predicted: RTT = the mean of the stat and open lat_p50_s at N = 1 (per
layout); the data term at each N = base time to last rank - k x RTT, and B_agg and
B_client are fitted to those with project's fit_data (so the data term's form,
bytes / min(B_agg / N, B_client), is part of what is tested). Whatever the base mount
adds at larger N (CPU contention of N ranks and the FUSE daemon on a small machine) is
thereby in the data term.

Output: a table N x layout with measured, model (its metadata and data parts), error =
(measured - model) / measured, and PASS when |error| <= --tolerance (15%). The verdict is
printed, never turned into an exit status: the script exits non-zero only if a command
failed. Needs root, /dev/fuse, mfusepy and libfuse 3 (as emulate-mds does). Every mount
is unmounted at the end, however the script ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path

from common import (
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    mpiexec_command,
    run_checked,
    scratch_directory,
    write_job_toml,
)
from emulator_requests import Counts, count_requests, counts_text, per_iteration, timed_run

from stampede.emulate.mount import Window, fuse_unavailable, read_requests, running
from stampede.model.contention import Params, data_time, predict
from stampede.model.fit import fit_data
from stampede.units import parse_size

OPS = ("stat", "open")                 # the metadata ops of the pattern, one of each per file
MOUNT_WAIT_S = 15.0


# --- measuring ------------------------------------------------------------------------------

def write_job(scratch: Path, backing: Path, args: argparse.Namespace) -> Path:
    return write_job_toml(scratch / "job.toml", {
        "target": {"path": backing},
        "checkpoint": {"size_per_rank": args.size_per_rank, "layout": ["shared", "sharded"],
                       "block_size": "1MiB"},
        "pattern": {"ops": ["stat", "open", "read", "close"], "stat_count": 1, "open_count": 1},
        "run": {"iterations": args.iterations, "warmup": 1, "cache": "warm", "verify": "none"},
        "archive": {"path": scratch / "prepare.csv"},
    })


def run_through(job: Path, nranks: int, mountpoint: Path, layouts: list[str],
                archive: Path, *overrides: str) -> tuple[dict[str, dict[str, dict[str, str]]], Window]:
    """One `stampede run` through the mount: ({layout: {op: its archive row}}, the run's
    window on the monotonic clock, in which the emulator's log holds its requests)."""
    archive.unlink(missing_ok=True)
    command = mpiexec_command(nranks, sys.executable, "-m", "stampede", "run", str(job),
                              "--set", f"target.path={mountpoint}",
                              "--set", f"checkpoint.layout={layouts!r}".replace("'", '"'),
                              "--set", f"archive.path={archive}", *overrides)
    window = timed_run(command)
    rows: dict[str, dict[str, dict[str, str]]] = {}
    for row in archive_rows(archive):
        rows.setdefault(row["layout"], {})[row["op"]] = row
    return rows, window



# --- the model, s and c known ---------------------------------------------------------------

def model_params(layout: str, service_s: float, threads: int, requests: Counts,
                 rtt_op_s: float, agg_bps: float, client_bps: float,
                 bytes_per_rank: float) -> Params:
    """Params for predict(): see the module docstring for the mapping of a rank's counted
    requests per iteration to the model's ops."""
    k = len(OPS)
    if layout == "shared":
        return Params(rtt_s=rtt_op_s + requests["other"] / k * service_s,
                      service_s=requests["file"] / k * service_s, threads=threads,
                      agg_bps=agg_bps, client_bps=client_bps, ops_per_rank=k,
                      bytes_per_rank=bytes_per_rank, whole_rounds=True)
    total = requests["total"]
    return Params(rtt_s=k * rtt_op_s / total, service_s=service_s, threads=threads, agg_bps=agg_bps,
                  client_bps=client_bps, ops_per_rank=total, bytes_per_rank=bytes_per_rank,
                  whole_rounds=True)


def why_outside(n: int, times: list[float], meta_s: float, data_s: float) -> str:
    """What a point outside the tolerance shows, from what was measured beside it."""
    measured = statistics.median(times)
    reasons = []
    if (max(times) - min(times)) / measured > 0.15:
        reasons.append(f"the runs themselves spread {(max(times) - min(times)) / measured:.0%} "
                       "(min-max over median)")
    if n > (os.cpu_count() or 1):
        reasons.append(f"{n} ranks and the FUSE daemon on {os.cpu_count()} CPUs: CPU contention "
                       "the model does not have")
    reasons.append(f"measured - data = {(measured - data_s) * 1e3:.1f} ms of metadata against the "
                   f"model's {meta_s * 1e3:.1f} ms")
    return "; ".join(reasons)


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", default="1,2,4,8", help="rank counts (default 1,2,4,8)")
    parser.add_argument("--service-s", type=float, default=0.010,
                        help="the emulator's service time S per request (default 0.010)")
    parser.add_argument("--threads", type=int, default=2, help="the emulator's slots C (default 2)")
    parser.add_argument("--size-per-rank", default="2MiB", help="checkpoint bytes per rank (default 2MiB)")
    parser.add_argument("--iterations", type=int, default=5, help="measured iterations per run (default 5)")
    parser.add_argument("--runs", type=int, default=3, help="runs per rank count and mount (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="agreement target (default 0.15)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.ranks = comma_separated(args.ranks, int)
    except ValueError:
        parser.error(f"--ranks {args.ranks}: comma-separated integers")
    if args.service_s <= 0 or args.threads < 1 or args.runs < 1 or args.iterations < 2:
        parser.error("--service-s > 0, --threads >= 1, --runs >= 1, --iterations >= 2 (the "
                     "requests of one iteration are the difference from a one-iteration run)")
    return args


def main() -> int:
    args = parse_args()
    missing = fuse_unavailable()
    if missing:
        print(f"model_vs_emulator: cannot mount the emulator: {missing}", file=sys.stderr)
        return 2
    service_s, threads = args.service_s, args.threads
    bytes_per_rank = float(parse_size(args.size_per_rank))
    layouts = ("sharded", "shared")
    mounts = {"base": ("--service-s", "0", "--threads", str(threads)),
              "plain": ("--service-s", str(service_s), "--threads", str(threads)),
              "serial": ("--service-s", str(service_s), "--threads", str(threads),
                             "--serialize-inode")}
    through = {"base": ["shared", "sharded"], "plain": ["sharded"], "serial": ["shared"]}
    measured_in = {"sharded": "plain", "shared": "serial"}
    # results[mount][layout][N] = list over runs of (time_to_last_rank_s, stat p50, open p50)
    results: dict[str, dict[str, dict[int, list[tuple[float, float, float]]]]] = {
        mount: {layout: {n: [] for n in args.ranks} for layout in layouts} for mount in mounts}
    # windows[mount][N] = the runs' windows; single[mount][N] = the one-iteration run's
    windows: dict[str, dict[int, list[Window]]] = {name: {n: [] for n in args.ranks} for name in mounts}
    single: dict[str, dict[int, Window]] = {name: {} for name in mounts}
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    print(f"emulator: S = {service_s * 1e3:g} ms, C = {threads}; {args.size_per_rank} per rank, "
          f"{args.iterations} iterations + 1 warmup, {args.runs} run(s) per point")
    with scratch_directory("stampede-model-vs-emulator-", args.dir) as scratch:
        backing = scratch / "backing"
        backing.mkdir()
        job = write_job(scratch, backing, args)
        points = {name: scratch / name for name in mounts}
        with ExitStack() as stack:
            for name, options in mounts.items():
                stack.enter_context(running(backing, points[name], *options))
            for nranks in args.ranks:
                shutil.rmtree(backing)
                backing.mkdir()
                run_checked(mpiexec_command(nranks, sys.executable, "-m", "stampede", "prepare",
                                            str(job)))
                for name in ("plain", "serial"):
                    _, single[name][nranks] = run_through(
                        job, nranks, points[name], through[name], scratch / f"{name}.csv",
                        "--set", "run.iterations=1")
                for _ in range(args.runs):
                    for name in mounts:
                        rows, window = run_through(job, nranks, points[name], through[name],
                                                   scratch / f"{name}.csv")
                        windows[name][nranks].append(window)
                        for layout, ops in rows.items():
                            results[name][layout][nranks].append(
                                (float(ops["restore"]["time_to_last_rank_s"]),
                                 float(ops["stat"]["lat_p50_s"]), float(ops["open"]["lat_p50_s"])))
        # requests[layout][N], counted in each emulator's own log of the requests it served
        requests: dict[str, dict[int, Counts]] = {}
        for layout in layouts:
            name = measured_in[layout]
            log = read_requests(points[name])
            requests[layout] = {n: per_iteration([count_requests(log, w) for w in windows[name][n]],
                                                 count_requests(log, single[name][n]),
                                                 args.iterations, n) for n in args.ranks}
    print("emulator requests per rank in one measured iteration (counted in the emulator's log "
          "over the restores; 'file': queued on the file's lock):")
    for layout in layouts:
        for n in args.ranks:
            print(f"  {layout:<8} N={n}: {counts_text(requests[layout][n])}")
    print()
    print(f"{'layout':<8} {'N':>3} {'measured':>10} {'(min-max over runs)':>21} {'model':>9} "
          f"{'= meta':>8} {'+ data':>7} {'error':>8}  verdict")
    failures = 0
    for layout in layouts:
        base = results["base"][layout]
        smallest = min(args.ranks)
        rtt_op = statistics.mean(statistics.median(run[i] for run in base[smallest]) for i in (1, 2))
        k = len(OPS)
        data_s = [max(statistics.median(run[0] for run in base[n]) - k * rtt_op, 1e-6)
                  for n in args.ranks]
        agg, client, _, _ = fit_data(args.ranks, [bytes_per_rank] * len(args.ranks), data_s)
        for n in args.ranks:
            params = model_params(layout, service_s, threads, requests[layout][n], rtt_op, agg,
                                  client, bytes_per_rank)
            times = [run[0] for run in results[measured_in[layout]][layout][n]]
            measured = statistics.median(times)
            prediction = predict(params, n, layout)
            error = (measured - prediction.total_s) / measured
            ok = abs(error) <= args.tolerance
            failures += not ok
            spread = f"({min(times) * 1e3:.1f}-{max(times) * 1e3:.1f})"
            print(f"{layout:<8} {n:>3} {measured * 1e3:>7.1f} ms {spread:>21} "
                  f"{prediction.total_s * 1e3:>6.1f} ms {prediction.meta_s * 1e3:>8.1f} "
                  f"{prediction.data_s * 1e3:>7.1f} {error:>+8.1%}  "
                  f"{'PASS' if ok else 'FAIL'}")
            if not ok:
                print(f"{'':>13}why: {why_outside(n, times, prediction.meta_s, prediction.data_s)}")
        data_at = {n: data_time(n, bytes_per_rank, agg, client) for n in args.ranks}
        print(f"  {layout}: RTT per op {rtt_op * 1e3:.2f} ms (base mount, N = {smallest}); model "
              f"at N = {n}: RTT {params.rtt_s * 1e3:.2f} ms, s {params.service_s * 1e3:.1f} ms, "
              f"c {threads}{' (c_eff 1)' if layout == 'shared' else ''}, k {params.ops_per_rank:g}; B_agg "
              f"{agg / 1e9:.3g} GB/s, B_client {client / 1e9:.3g} GB/s (fitted to the base data "
              f"term: " + ", ".join(f"N={n} {d * 1e3:.1f}/{data_at[n] * 1e3:.1f} ms"
                                   for n, d in zip(args.ranks, data_s)) + " measured/fitted)")
    total = len(layouts) * len(args.ranks)
    print(f"\nverdict: {total - failures}/{total} within {args.tolerance:.0%}"
          + ("" if not failures else f"; {failures} outside"))
    if any(n > (os.cpu_count() or 1) for n in args.ranks):
        print(f"note: ranks above {os.cpu_count()} CPUs are oversubscribed (the FUSE daemon shares them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
