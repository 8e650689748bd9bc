"""The sizing tested by running what it says, on the metadata-server emulator: fit the
small runs, ask the sizing (stampede.model.sizing) what metadata server a target time to
last rank needs at a larger count, set the emulator to that, run, and compare.

What runs. `stampede emulate-mds --service-s S0 --threads C` (default S0 = 4 ms, C = 2)
shows a backing directory; a sharded job of --size-per-rank per rank (stat, open, read,
close; cache warm: the metadata is the storm, the bytes negligible) is prepared and run
through the mount at each N of --ranks into one archive, as bench/project_out_of_sample.py
does. Then:

  fitted      `stampede project`'s fit of those runs, nothing given
  asked       the time to last rank at --target-n ranks the sizing must meet: --fraction
              of what the fit projects there at S0 (a server that must be faster)
  sized       the metadata drain the sizing says that needs (ops/s of stampede ops,
              c_eff / s, and its ratio K to the fitted drain), turned into the emulator's
              service time: S = S0 / K, the server made K times faster, which is what a
              reader does with "K x the fitted" (default); or with --absolute S = C /
              (drain x r), r the emulator's requests per model op (a rank's requests over
              the k = 2 ops and the fit's q, the reads' requests in ops), counted in its log
              over the restores themselves at the largest fitted N
              (bench/emulator_requests.py: a probe's stat and open count 3 + 3 requests
              where a restore's rank makes 7-8, the read's GETATTRs among them), which also
              tests the fitted drain against the emulator's own. The reads' requests queue
              at the same server: the model's q (stampede.model.contention) lets the sizing
              shorten them with the drain
  run         the emulator at that S, the job at --target-n ranks: its measured time to
              last rank (median over iterations) against the asked time. The tolerance is
              two-sided and fixed, --tolerance (15%): PASS when measured / asked is within
              [0.85, 1.15]; FAIL slower (the sized server misses the time) and FAIL faster
              (it over-delivers: a fit that drains slower than the emulator sizes a larger
              server than the time needs). The projection's band at S0 is printed beside
              it: when its half-width exceeds the tolerance the fit's own noise is larger
              than the check, and the line says so (the verdict stands). The exit status
              is 1 on FAIL.

A wall-clock agreement, so a bench and not a test. Needs root, /dev/fuse, mfusepy and
libfuse 3.
"""

from __future__ import annotations

import argparse
import shutil
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
from emulator_requests import count_requests, counts_text, per_iteration, timed_run

from stampede.emulate.mount import (
    fuse_unavailable,
    probe_ops,
    read_requests,
    requests_per_op,
    running,
)
from stampede.model.projection import Scale, project
from stampede.model.series import series_from_rows
from stampede.model.sizing import size
from stampede.units import format_rate, format_seconds, parse_size

K = 2                      # stat + open per rank


def verdict(error: float, tolerance: float) -> str:
    """PASS when the measured time is within `tolerance` (relative) of the asked one either
    side (error = measured / asked - 1): a sizing that asks for far more server than the
    time needs is as wrong as one that asks for too little."""
    if error > tolerance:
        return "FAIL: misses it"
    if error < -tolerance:
        return "FAIL: over-delivers, a larger server than needed"
    return "PASS: meets it"


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", type=lambda t: comma_separated(t, int), default=[1, 2, 4])
    parser.add_argument("--target-n", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--service-s", type=float, default=0.004)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size-per-rank", default="64KiB")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--absolute", action="store_true",
                        help="S = C / (drain x r) from the counted requests, not S0 / K")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="measured / asked must be within 1 -/+ this (default 0.15)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    if args.iterations < 2 or not 0 < args.tolerance < 1:
        parser.error("--iterations >= 2 (the requests of one iteration are a difference "
                     "from a one-iteration run), 0 < --tolerance < 1")
    return args


def run_at(job: Path, backing: Path, mountpoint: Path, nranks: int, per_rank: int,
           service_s: float, threads: int, iterations: int, archive_set: str) -> dict[str, float]:
    """Prepare at `nranks` in the backing directory, run through the emulator at
    `service_s`; the requests per rank of one measured iteration, from the emulator's log
    (a one-iteration run before the measured one, into no archive, gives the difference),
    and under "probe" those of one stat and one open alone (mount.probe_ops, before the
    runs): the rest of a rank's are its read's, served inside the data term."""
    sized = f"checkpoint.size={per_rank * nranks}"
    shutil.rmtree(backing)
    backing.mkdir()
    run_checked(mpiexec_command(nranks, sys.executable, "-m", "stampede", "prepare", str(job),
                                "--set", sized))
    run = mpiexec_command(nranks, sys.executable, "-m", "stampede", "run", str(job), "--set",
                          sized, "--set", f"target.path={mountpoint}")
    with running(backing, mountpoint, "--service-s", str(service_s), "--threads", str(threads)):
        probes = probe_ops(next((mountpoint / "sharded").iterdir()))
        single = timed_run([*run, "--set", "run.iterations=1", "--set",
                            f"archive.path={mountpoint.parent / 'single.csv'}"])
        full = timed_run([*run, "--set", archive_set])
    log = read_requests(mountpoint)   # the log, once unmounted
    print(f"  {nranks} rank(s) at S = {service_s * 1e3:.3g} ms measured (load "
          f"{load_average_text()})", file=sys.stderr, flush=True)
    counted = per_iteration([count_requests(log, full)], count_requests(log, single), iterations,
                            nranks)
    counted["probe"] = sum(len(served) for served in requests_per_op(log, probes).values())
    return counted


def main() -> int:
    args = parse_args()
    missing = fuse_unavailable()
    if missing:
        raise SystemExit(f"sizing_check: cannot mount the emulator: {missing}")
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    per_rank = parse_size(args.size_per_rank)
    with scratch_directory("stampede-sizing-", args.dir) as scratch:
        backing, mountpoint = scratch / "backing", scratch / "mount"
        fitted_archive, checked_archive = scratch / "fit.csv", scratch / "check.csv"
        job = write_job_toml(scratch / "job.toml", {
            "target": {"path": backing},
            "checkpoint": {"size": args.size_per_rank, "layout": ["sharded"],
                           "block_size": "64KiB"},
            "pattern": {"ops": ["stat", "open", "read", "close"], "stat_count": 1,
                        "open_count": 1},
            "run": {"iterations": args.iterations, "warmup": 1, "cache": "warm",
                    "verify": "none"},
            "archive": {"path": fitted_archive}})
        backing.mkdir()
        requests: dict[str, float] = {}
        for nranks in args.ranks:
            requests = run_at(job, backing, mountpoint, nranks, per_rank, args.service_s,
                              args.threads, args.iterations, f"archive.path={fitted_archive}")
        (series,) = series_from_rows(read_archive(fitted_archive), ("sharded",))
        projection = project(series.points, "sharded", Scale(args.target_n),
                             per_rank_size=series.per_rank_size, locks=series.locks)
        projected_s = projection.prediction.total_s
        low, high = projection.band
        asked_s = projected_s * args.fraction
        sizing = size(projection.params, args.target_n, "sharded", asked_s)
        drain = next(need for need in sizing.needs if need.resource == "metadata drain")
        # the model's ops per rank: the k metadata ops and the reads' q requests (in ops)
        read_ops = projection.params.read_ops_per_rank
        per_op = requests["total"] / (K + read_ops)
        if not drain.reachable or drain.needed <= 0:
            print(f"the sizing says no metadata server alone makes {format_seconds(asked_s)} "
                  "(raise --fraction)")
            return 1
        absolute_s = args.threads / (drain.needed * per_op)
        service_s = absolute_s if args.absolute else args.service_s / drain.ratio
        checked_requests = run_at(job, backing, mountpoint, args.target_n, per_rank, service_s,
                                  args.threads, args.iterations, f"archive.path={checked_archive}")
        (checked,) = series_from_rows(read_archive(checked_archive), ("sharded",))
        measured_s = checked.points[0].last_s
    probe = requests.pop("probe")
    checked_requests.pop("probe")
    print(f"emulator requests per rank and iteration (its log, over the restores): N = "
          f"{args.ranks[-1]}: {counts_text(requests)}; N = {args.target_n} (the check): "
          f"{counts_text(checked_requests)}; one stat and one open alone: {probe:g}")
    print(f"the fit's reads' requests q = {read_ops:.3g} op(s) per rank (the emulator's read "
          f"makes {requests['total'] - probe:g} of a rank's {requests['total']:g} requests)")
    print(f"emulator C = {args.threads}; requests per model op (k + q per rank): {per_op:.3g}; "
          f"sharded, {args.size_per_rank} per rank, fitted on N = "
          f"{', '.join(map(str, args.ranks))} at S0 = {args.service_s * 1e3:g} ms")
    print(f"projected at N = {args.target_n}, S0: {format_seconds(projected_s)} (band "
          f"{format_seconds(low)}-{format_seconds(high)}); asked {format_seconds(asked_s)} "
          f"({args.fraction:g} of it)")
    print(f"sized: metadata drain {format_rate(drain.needed, 'ops/s')} (the fit's "
          f"{format_rate(drain.fitted, 'ops/s')}: K = {drain.ratio:.3g}x) -> emulator S = "
          f"{service_s * 1e3:.3g} ms ({'C / (drain x r)' if args.absolute else 'S0 / K'}; "
          f"{'S0 / K' if args.absolute else 'C / (drain x r)'} would be "
          f"{(args.service_s / drain.ratio if args.absolute else absolute_s) * 1e3:.3g} ms; the "
          f"emulator's own drain at S0: {format_rate(args.threads / (args.service_s * per_op), 'ops/s')})")
    half_width = (high - low) / 2 / projected_s
    error = (measured_s - asked_s) / asked_s
    said = verdict(error, args.tolerance)
    print(f"ran at N = {args.target_n}, S = {service_s * 1e3:.3g} ms: time to last rank "
          f"{format_seconds(measured_s)} against {format_seconds(asked_s)} asked: "
          f"{error:+.1%} ({said}; tolerance ±{args.tolerance:.0%}; the band's half-width at S0 "
          f"±{half_width:.1%}" + (": the fit's own noise exceeds the tolerance)"
                                  if half_width > args.tolerance else ")"))
    if said.startswith("FAIL: over"):
        # the read's requests: served inside the fitted data term, which the sizing keeps
        # as it was at S0 while the emulator serves them at S too (whole rounds of C)
        read_requests_per_rank = requests["total"] - probe
        shrink_s = args.target_n * read_requests_per_rank * (args.service_s - service_s) / args.threads
        print(f"why: {read_requests_per_rank:g} of the {requests['total']:g} requests per rank are "
              f"the read's (the kernel's size check), in the fit's data term "
              f"({format_seconds(projection.prediction.data_s)} at S0, of which the fit puts "
              f"{format_seconds(projection.prediction.read_meta_s)} at the server: q = "
              f"{read_ops:.3g}); served at S they take about {format_seconds(shrink_s)} less at "
              f"N = {args.target_n}, which the sizing credits only as far as q does")
    return 0 if said.startswith("PASS") else 1


if __name__ == "__main__":
    sys.exit(main())
