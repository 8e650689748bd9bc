"""`stampede project` out of sample, on the metadata-server emulator: fitted on the small
rank counts, it must predict the larger ones, and the value at 16,384 ranks that the
emulator's known S and C give: the truth inside the band, the central value within 15%.

What runs. `stampede emulate-mds --service-s S --threads C` (default S = 3 ms, C = 2)
shows a backing directory; a sharded job of --size-per-rank per rank (weak scaling,
written as checkpoint.size = size x N, as a user sweeping by hand writes it: project
must match the runs on bytes per rank, not on the total) is prepared there at each N of
--ranks and run through the mount (pattern stat, open, read, close; --iterations + 1
warmup; cache warm). All runs go to one archive.

  fitted on   the rank counts up to --fit-up-to (default 4): project's own fit, nothing
              given (no --service-s, no --threads)
  predicted   each larger measured N: `project --target-ranks N` (central and band) against the
              measured time to last rank (the median over iterations)
  known       16,384 ranks: what the emulator's S and C give with nothing fitted but the
              round trip: RTT + S ceil(N k r / C) (k = 2 ops per rank, r = the emulator's
              requests per op: a rank's requests in one measured iteration over k, counted
              in the emulator's log over the restores at the largest N, as
              bench/model_vs_emulator.py does, bench/emulator_requests.py; a probe's one
              stat and one open would count 3 + 3 and miss the read's) plus the fitted data
              term without the reads' requests (the model's q: counted in r already, so
              not twice)

Beside it: the fit's q (the reads' requests, stampede.model.contention) against the
emulator's read's requests, and the projection at 16,384 of the same runs fitted without
q (their time read as bandwidth).

Output: per N the measured time, the projection with its band, the error and PASS when
the truth lies inside the band and the central value within --tolerance; the fitted s/c
against the emulator's (S r / C per op). Needs root, /dev/fuse, mfusepy and libfuse 3.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from common import (
    add_scratch_parent_option,
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
from stampede.model.contention import predict
from stampede.model.projection import Scale, project
from stampede.model.series import series_from_rows
from stampede.results.archived import Archive
from stampede.units import parse_size

LARGE = 16384
K = 2                      # stat + open per rank
PROBE_REQUESTS = 6         # one stat and one open alone: 3 + 3 (bench/emulator_requests.py)


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", type=lambda t: comma_separated(t, int), default=[1, 2, 4, 8])
    parser.add_argument("--fit-up-to", type=int, default=4)
    parser.add_argument("--service-s", type=float, default=0.003)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size-per-rank", default="2MiB")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--keep-archive", type=Path, help="copy the runs' archive (and its "
                        "sidecars) into this directory, to refit by hand")
    add_scratch_parent_option(parser)
    return parser.parse_args()


def measure(args: argparse.Namespace, scratch: Path) -> tuple[Path, Counts]:
    """Every N through the emulator, into one archive; a rank's requests in one measured
    iteration at the largest N (a one-iteration run, into no archive, before it)."""
    backing, mountpoint, archive = scratch / "backing", scratch / "mount", scratch / "runs.csv"
    per_rank = parse_size(args.size_per_rank)
    job = write_job_toml(scratch / "job.toml", {
        "target": {"path": backing},
        "checkpoint": {"size": args.size_per_rank, "layout": ["sharded"], "block_size": "1MiB"},
        "pattern": {"ops": ["stat", "open", "read", "close"], "stat_count": 1, "open_count": 1},
        "run": {"iterations": args.iterations, "warmup": 1, "cache": "warm", "verify": "none"},
        "archive": {"path": archive}})
    windows: tuple[Window, Window] = ((0.0, 0.0), (0.0, 0.0))
    backing.mkdir()
    with running(backing, mountpoint, "--service-s", str(args.service_s), "--threads",
                 str(args.threads)):
        for nranks in args.ranks:
            size = f"checkpoint.size={per_rank * nranks}"
            shutil.rmtree(backing)
            backing.mkdir()
            run_checked(mpiexec_command(nranks, sys.executable, "-m", "stampede", "prepare",
                                        str(job), "--set", size))
            run = mpiexec_command(nranks, sys.executable, "-m", "stampede", "run", str(job),
                                  "--set", size, "--set", f"target.path={mountpoint}")
            if nranks == max(args.ranks):
                single = timed_run([*run, "--set", "run.iterations=1", "--set",
                                    f"archive.path={scratch / 'single.csv'}"])
                windows = (single, timed_run(run))
            else:
                run_checked(run)
            print(f"  {nranks} rank(s) measured (load {load_average_text()})", file=sys.stderr,
                  flush=True)
    # counted in the emulator's own log of the requests it served
    log = read_requests(mountpoint)
    single, full = windows
    return archive, per_iteration([count_requests(log, full)], count_requests(log, single),
                                  args.iterations, max(args.ranks))


def main() -> int:
    args = parse_args()
    missing = fuse_unavailable()
    if missing:
        raise SystemExit(f"project_out_of_sample: cannot mount the emulator: {missing}")
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    print(f"emulator: S = {args.service_s * 1e3:g} ms, C = {args.threads}; sharded, "
          f"{args.size_per_rank} per rank (checkpoint.size = that x N), fitted on N <= "
          f"{args.fit_up_to}")
    with scratch_directory("stampede-out-of-sample-", args.dir) as scratch:
        archive, requests = measure(args, scratch)
        if args.keep_archive is not None:
            shutil.copytree(archive.parent, args.keep_archive, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("backing", "mount"))
        archived = Archive.open(archive)
        rows = archived.rows
        # each run's F from its sidecar, as `stampede project` reads it
        (series,) = series_from_rows(rows, ("sharded",),
                                     sidecars=lambda run_id: archived.sidecar(run_id).value)
    measured = {p.nranks: p for p in series.points}
    fitted = [p for p in series.points if p.nranks <= args.fit_up_to]
    per_op = requests["total"] / K
    print(f"emulator requests per rank and iteration at N = {max(args.ranks)} (counted in its "
          f"log over the restores): {counts_text(requests)}; per op r = {per_op:g}")
    print(f"{'N':>6} {'measured':>10} {'projected':>10} {'band':>21} {'error':>7}  verdict")
    for nranks in [n for n in args.ranks if n > args.fit_up_to] + [LARGE]:
        projection = project(fitted, "sharded", Scale(nranks), per_rank_size=series.per_rank_size,
                             locks=series.locks)
        if nranks == LARGE:
            # every request of a rank in the drain, the read's too: the fitted data term
            # without the reads' requests (q = 0), which it would count twice
            params = replace(projection.params, service_s=args.service_s, threads=args.threads,
                             ops_per_rank=K * per_op, whole_rounds=True,
                             rtt_s=projection.params.rtt_s / per_op, read_ops_per_rank=0.0)
            truth, what = predict(params, nranks, "sharded").total_s, "known S, C"
        else:
            truth, what = measured[nranks].last_s, "measured"
        central, (low, high) = projection.prediction.total_s, projection.band
        error = (truth - central) / truth
        held = low <= truth <= high
        ok = held and abs(error) <= args.tolerance
        print(f"{nranks:>6} {truth:>9.4g}s {central:>9.4g}s {low:>9.4g}-{high:<9.4g}s "
              f"{error:>+7.1%}  {'PASS' if ok else 'FAIL'} ({what}; band "
              f"{'holds' if held else 'misses'} it)")
    fit = project(fitted, "sharded", Scale(LARGE), per_rank_size=series.per_rank_size,
                  locks=series.locks).fit
    drain = fit.params.service_s / fit.params.threads
    print(f"fitted s/c {drain * 1e3:.3g} ms per op; the emulator's S r / C = "
          f"{args.service_s * per_op / args.threads * 1e3:.3g} ms per op (r = {per_op:g})")
    plain = project([replace(point, read_s=0.0) for point in fitted], "sharded", Scale(LARGE),
                    per_rank_size=series.per_rank_size, locks=series.locks)
    print(f"without the reads' requests (q = 0, their time fitted as bandwidth): "
          f"{plain.prediction.total_s:.4g}s projected at {LARGE}")
    read_ops = fit.params.read_ops_per_rank
    read_requests = requests["total"] - PROBE_REQUESTS
    print(f"fitted reads' requests q = {read_ops:.3g} op(s) per rank, q s/c = "
          f"{read_ops * drain * 1e3:.3g} ms per rank at the server; the emulator's read makes "
          f"{read_requests:g} (a rank's {requests['total']:g} less a stat and an open's "
          f"{PROBE_REQUESTS}): {read_requests * args.service_s / args.threads * 1e3:.3g} ms")
    for column in ("lat_p50_s", "lat_p90_s", "lat_max_s"):
        stalls = {}
        for row in rows:
            if row["op"] in ("stat", "open"):
                per_rank = float(row["count"]) / float(row["iterations"]) / float(row["nranks"])
                stalls[row["nranks"]] = stalls.get(row["nranks"], 0.0) + per_rank * float(row[column])
        print(f"stall from {column}: " + ", ".join(f"N={n} {s * 1e3:.1f} ms"
                                                  for n, s in stalls.items()))
    known = {n: args.service_s * math.ceil(n * K * per_op / args.threads) for n in measured}
    print("the emulator's drain S ceil(N k r / C): " + ", ".join(
        f"N={n} {s * 1e3:.1f} ms" for n, s in known.items()))
    print(f"band from: {project(fitted, 'sharded', Scale(LARGE), locks=series.locks).band_from}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
