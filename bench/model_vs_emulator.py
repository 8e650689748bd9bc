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
on MOUNT/DIR/FILE walks the path: a LOOKUP of DIR (the mount's root is free), a LOOKUP of
FILE, then GETATTR (stat) or OPEN (open); read and close are not metadata requests (read
goes straight through, close is a release). The requests per op are MEASURED here, not
assumed: one os.stat and one os.open of a checkpoint file through the plain and serial
mounts, their requests counted in each emulator's log (--log; 3 each is expected). Of
these, the DIR lookup is one per path component above the file (1 here); the rest are on
the file itself.

  sharded   every request takes one of C slots for S, so a rank's k ops are k r requests
            (r: requests per op, averaged over the ops): model ops = requests, s = S,
            c = C, RTT per request = the base mount's per-op latency / r.
  shared    with --serialize-inode the file's requests queue one at a time, but the DIR
            lookup does not (it takes a slot, outside the file's queue): model ops =
            stampede's ops (k = 2), s = S x (requests on the file per op, 2), c_eff = 1,
            RTT = the base per-op latency + S x (DIR lookups per op, 1). Treating the DIR
            lookup as a round trip outside the server is the approximation of this layout:
            it does wait for a slot, but with C >= 2 one slot is free while the file's
            queue holds the other.

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

from stampede.emulate.mount import (
    Window,
    fuse_unavailable,
    probe_ops,
    read_requests,
    requests_per_op,
    running,
)
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
                archive: Path) -> dict[str, dict[str, dict[str, str]]]:
    """One `stampede run` through the mount: {layout: {op: its archive row}}."""
    archive.unlink(missing_ok=True)
    command = mpiexec_command(nranks, sys.executable, "-m", "stampede", "run", str(job),
                              "--set", f"target.path={mountpoint}",
                              "--set", f"checkpoint.layout={layouts!r}".replace("'", '"'),
                              "--set", f"archive.path={archive}")
    run_checked(command)
    rows: dict[str, dict[str, dict[str, str]]] = {}
    for row in archive_rows(archive):
        rows.setdefault(row["layout"], {})[row["op"]] = row
    return rows


# --- the model, s and c known ---------------------------------------------------------------

def model_params(layout: str, service_s: float, threads: int, requests: dict[str, int],
                 dir_lookups: int, rtt_op_s: float, agg_bps: float, client_bps: float,
                 bytes_per_rank: float) -> Params:
    """Params for predict(): see the module docstring for the mapping of ops to requests."""
    k = len(OPS)
    per_op = sum(requests[op] for op in OPS) / k
    if layout == "shared":
        return Params(rtt_s=rtt_op_s + dir_lookups * service_s,
                      service_s=(per_op - dir_lookups) * service_s, threads=threads,
                      agg_bps=agg_bps, client_bps=client_bps, ops_per_rank=k,
                      bytes_per_rank=bytes_per_rank, whole_rounds=True)
    return Params(rtt_s=rtt_op_s / per_op, service_s=service_s, threads=threads, agg_bps=agg_bps,
                  client_bps=client_bps, ops_per_rank=k * per_op, bytes_per_rank=bytes_per_rank,
                  whole_rounds=True)


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
    if args.service_s <= 0 or args.threads < 1 or args.runs < 1 or args.iterations < 1:
        parser.error("--service-s > 0, --threads >= 1, --runs >= 1, --iterations >= 1")
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
    probes: dict[str, dict[str, Window]] = {}
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
                if not probes:
                    probes["sharded"] = probe_ops(next((points["plain"] / "sharded").iterdir()))
                    probes["shared"] = probe_ops(points["serial"] / "shared" / "checkpoint.raw")
                for _ in range(args.runs):
                    for name in mounts:
                        rows = run_through(job, nranks, points[name], through[name],
                                           scratch / f"{name}.csv")
                        for layout, ops in rows.items():
                            results[name][layout][nranks].append(
                                (float(ops["restore"]["time_to_last_rank_s"]),
                                 float(ops["stat"]["lat_p50_s"]), float(ops["open"]["lat_p50_s"])))
        # counted in each emulator's own log of the requests it served
        requests = {layout: {op: len(served) for op, served in requests_per_op(
            read_requests(points[measured_in[layout]]), probes[layout]).items()}
            for layout in layouts}
    # stat(2) of MOUNT/DIR/FILE: one LOOKUP per directory below the mount (DIR), then the file
    dir_lookups = 1
    print(f"emulator requests per op (counted in the emulator's log): sharded "
          f"{requests['sharded']}, shared {requests['shared']}; of each, {dir_lookups} LOOKUP of the "
          "directory\n")
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
        params = model_params(layout, service_s, threads, requests[layout], dir_lookups, rtt_op, agg,
                              client, bytes_per_rank)
        for n in args.ranks:
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
        data_at = {n: data_time(n, bytes_per_rank, agg, client) for n in args.ranks}
        print(f"  {layout}: RTT per op {rtt_op * 1e3:.2f} ms (base mount, N = {smallest}); model "
              f"RTT {params.rtt_s * 1e3:.2f} ms, s {params.service_s * 1e3:.1f} ms, c {threads}"
              f"{' (c_eff 1)' if layout == 'shared' else ''}, k {params.ops_per_rank:g}; B_agg "
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
