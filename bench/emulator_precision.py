"""How precisely `stampede emulate-mds` serves the service time it is asked for.

Two parts, one run.

1. How a slot is held (in-process, no FUSE): `--threads` threads at once each hold a
   "slot" --holds times for S and measure how far past S they return. Strategies:
     sleep          time.sleep(S), the emulator's hold before the deadline (at the
                    thread's default timer slack, 50 µs)
     deadline       sleep to take-time + S (stampede.emulate.service.hold_until, no spin)
     +slack 1ns     the same with the thread's timer slack at 1 ns (precise_timers)
     +spin X        and the last X µs spent in sched_yield until the deadline
   Printed: the median and p90 of the overshoot, in µs, per S and strategy. The
   emulator's own hold is hold_until with SPIN_S and precise_timers.

2. Through FUSE (root, /dev/fuse, mfusepy, libfuse 3): a sharded checkpoint is prepared at
   BACKING/ck, the emulator mounts BACKING with `--threads 1`, caches off, and one rank's
   `stampede run` stat storm (pattern stat, --stat-count stats per iteration) goes through
   MOUNT/ck/sharded/<file>: 4 requests a stat (LOOKUP ck, LOOKUP sharded, LOOKUP the
   file, GETATTR; counted here: the emulator's getattr count over the stats made).
   At S = 0 the stat's p50 is the base (FUSE's own round trip); at each S:
     held          the emulator's own record (its --summary-json): getattr p50 and mean
     measured      stampede's stat lat_p50_s - the base, / requests per stat
   and the ratios held / asked and measured / asked. The floor is the smallest S asked
   from which measured / asked is within --tolerance (5%) of 1. Then a straight line
   through (S, stat p50): its slope / requests is the service time per second asked
   that stampede sees, free of the base; its intercept, the round trip at S > 0 (on a
   VM the idle CPUs' wake-ups make it larger than at S = 0).

The machine is shared and small: the numbers are medians, the table says the load.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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

from stampede.emulate.mount import fuse_unavailable, read_summary, running
from stampede.emulate.service import PR_SET_TIMERSLACK, SPIN_S, hold_until, realtime_priority, spin_for

DEFAULT_SLACK = 0            # prctl(PR_SET_TIMERSLACK, 0): back to the thread's default
Hold = Callable[[float], None]


# --- 1. the hold, in-process ------------------------------------------------------------------

@dataclass(frozen=True)
class Strategy:
    slack_ns: int             # the thread's timer slack (0: the default, 50 µs)
    realtime: bool            # SCHED_FIFO, as `emulate-mds --priority realtime`
    hold: Hold


def strategies() -> dict[str, Strategy]:
    def deadline(spin_s: float) -> Hold:
        return lambda service_s: hold_until(time.monotonic() + service_s, spin_for(service_s, spin_s))

    spin = f"+spin {SPIN_S * 1e6:.0f}us"
    return {"sleep": Strategy(DEFAULT_SLACK, False, time.sleep),
            "deadline": Strategy(DEFAULT_SLACK, False, deadline(0.0)),
            "+slack 1ns": Strategy(1, False, deadline(0.0)),
            spin: Strategy(1, False, deadline(SPIN_S)),
            f"{spin} fifo": Strategy(1, True, deadline(SPIN_S))}


def overshoots(strategy: Strategy, service_s: float, holds: int, threads: int) -> list[float]:
    """Each hold's time past service_s, from `threads` threads holding at once."""
    found: list[float] = []
    guard = threading.Lock()

    def worker() -> None:
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, strategy.slack_ns, 0, 0, 0)
        if strategy.realtime:
            realtime_priority()
        mine = []
        for _ in range(holds):
            start = time.monotonic()
            strategy.hold(service_s)
            mine.append(time.monotonic() - start - service_s)
        with guard:
            found.extend(mine)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return found


def compare_holds(services_s: list[float], holds: int, threads: int, rounds: int) -> None:
    """Every strategy in turn, `rounds` times over (so that the machine's load is shared)."""
    print(f"\n1. holding a slot: {threads} thread(s) at once, {rounds} x {holds} holds each; "
          "time past S in µs, median / p99 / mean")
    chosen = strategies()
    print(f"{'S':>8} " + " ".join(f"{name:>19}" for name in chosen))
    for service_s in services_s:
        found: dict[str, list[float]] = {name: [] for name in chosen}
        for _ in range(rounds):
            for name, strategy in chosen.items():
                found[name] += overshoots(strategy, service_s, holds, threads)
        cells = []
        for over in found.values():
            over.sort()
            cells.append(f"{statistics.median(over) * 1e6:4.0f} /{over[int(0.99 * len(over))] * 1e6:5.0f}"
                         f" /{statistics.mean(over) * 1e6:5.0f}")
        print(f"{service_s * 1e3:>5g} ms " + " ".join(f"{cell:>19}" for cell in cells))


# --- 2. through FUSE and stampede -------------------------------------------------------------

PRIORITIES = ("normal", "realtime")


def stat_storm(scratch: Path, job: Path, service_s: float, priority: str,
               args: argparse.Namespace) -> tuple[float, dict[str, float], int]:
    """(stampede's stat p50, the emulator's getattr summary, stats made) at one S."""
    archive, mountpoint = scratch / "storm.csv", scratch / "mnt"
    archive.unlink(missing_ok=True)
    with running(scratch / "backing", mountpoint, "--service-s", f"{service_s:g}", "--threads", "1",
                 "--priority", priority):
        run_checked(mpiexec_command(1, sys.executable, "-m", "stampede", "run", str(job),
                                    "--set", f"target.path={mountpoint / 'ck'}",
                                    "--set", f"archive.path={archive}"))
    [row] = [row for row in archive_rows(archive) if row["op"] == "stat"]
    stats = int(row["count"]) * (args.iterations + 1) // args.iterations   # and the warmup
    return float(row["lat_p50_s"]), read_summary(mountpoint)["ops"].get("getattr", {}), stats


def prepared_job(scratch: Path, args: argparse.Namespace) -> Path:
    (scratch / "backing").mkdir()
    job = write_job_toml(scratch / "job.toml", {
        "target": {"path": scratch / "backing" / "ck"},
        "checkpoint": {"size": "1MiB", "layout": "sharded"},
        "pattern": {"ops": ["stat"], "stat_count": args.stat_count},
        "run": {"iterations": args.iterations, "warmup": 1, "verify": "none"},
        "archive": {"path": scratch / "prepare.csv"}})
    run_checked(mpiexec_command(1, sys.executable, "-m", "stampede", "prepare", str(job)))
    return job


def through_fuse(services_s: list[float], args: argparse.Namespace) -> None:
    """Every (S, priority) in turn, --repeats times over; the medians over the repeats."""
    cases = [(service_s, priority) for service_s in [0.0, *sorted(services_s)] for priority in PRIORITIES]
    found: dict[tuple[float, str], list[tuple[float, dict[str, float], int]]] = {case: [] for case in cases}
    with scratch_directory("stampede-emulator-precision-", args.dir) as scratch:
        job = prepared_job(scratch, args)
        for _ in range(args.repeats):
            for service_s, priority in cases:
                found[service_s, priority].append(stat_storm(scratch, job, service_s, priority, args))
    base_s = {priority: statistics.median(run[0] for run in found[0.0, priority]) for priority in PRIORITIES}
    print(f"\n2. through FUSE: 1 slot, caches off, 1 rank, {args.stat_count} stats x "
          f"{args.iterations} iterations (+1 warmup) of ck/sharded/<file>, medians of {args.repeats} "
          "runs; base (S = 0) stat p50 "
          + ", ".join(f"{base * 1e3:.3f} ms ({priority})" for priority, base in base_s.items()))
    print(f"{'asked':>8} {'priority':>8} {'req/stat':>8} {'held p50':>9} {'held mean':>9} "
          f"{'mean/asked':>10} {'stat p50':>9} {'measured':>9} {'meas/asked':>10}  (min-max)  verdict")
    within_at: dict[tuple[str, float], bool] = {}
    for service_s, priority in cases[len(PRIORITIES):]:
        runs = found[service_s, priority]
        requests = round(statistics.median(held["count"] / stats for _, held, stats in runs))
        ratios = sorted((p50_s - base_s[priority]) / requests / service_s for p50_s, _, _ in runs)
        ratio = statistics.median(ratios)
        held_p50_s = statistics.median(held["held_p50_s"] for _, held, _ in runs)
        held_mean_s = statistics.median(held["held_mean_s"] for _, held, _ in runs)
        p50_s = statistics.median(run[0] for run in runs)
        within = within_at[priority, service_s] = abs(ratio - 1) <= args.tolerance
        print(f"{service_s * 1e3:>5g} ms {priority:>8} {requests:>8} {held_p50_s * 1e3:>6.3f} ms "
              f"{held_mean_s * 1e3:>6.3f} ms {held_mean_s / service_s:>10.4f} {p50_s * 1e3:>6.3f} ms "
              f"{ratio * service_s * 1e3:>6.3f} ms {ratio:>10.4f} ({ratios[0]:.3f}-{ratios[-1]:.3f})  "
              f"{'within' if within else 'outside'} {args.tolerance:.0%}")
    for priority in PRIORITIES:
        # stat p50 against S: the slope / requests is the service time stampede sees per
        # second asked, whatever the constant on top (the round trip, at S > 0)
        asked = [service_s for service_s, chosen in cases[len(PRIORITIES):] if chosen == priority]
        p50s = [statistics.median(run[0] for run in found[service_s, priority]) for service_s in asked]
        slope, intercept = statistics.linear_regression(asked, p50s)
        requests = round(slope)
        print(f"fit ({priority}): stat p50 = {slope:.3f} x S + {intercept * 1e3:.3f} ms: {requests} "
              f"requests of {slope / requests:.4f} x S each, and {intercept * 1e3:.3f} ms a stat on "
              f"top (at S = 0: {base_s[priority] * 1e3:.3f} ms)")
    for priority in PRIORITIES:
        floor = [service_s for (chosen, service_s) in within_at if chosen == priority and
                 all(ok for (other, s), ok in within_at.items() if other == priority and s >= service_s)]
        print(f"floor ({priority}): {f'{min(floor) * 1e3:g} ms' if floor else 'none of these'} (the "
              f"smallest S from which every S asked is within {args.tolerance:.0%}, measured / asked)")


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--service-s", default="0.0005,0.001,0.002,0.004,0.01",
                        help="service times S asked, comma-separated (default 0.5, 1, 2, 4, 10 ms)")
    parser.add_argument("--stat-count", type=int, default=50, help="stats per iteration (default 50)")
    parser.add_argument("--iterations", type=int, default=3, help="measured iterations (default 3)")
    parser.add_argument("--holds", type=int, default=40, help="part 1: holds a thread and round (default 40)")
    parser.add_argument("--rounds", type=int, default=8, help="part 1: rounds (default 8)")
    parser.add_argument("--threads", type=int, default=2, help="part 1: threads holding at once (default 2)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="within this of S (default 0.05)")
    parser.add_argument("--repeats", type=int, default=3, help="part 2: runs per S and priority (default 3)")
    parser.add_argument("--skip-holds", action="store_true", help="only part 2")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.services_s = comma_separated(args.service_s, float)
    except ValueError:
        parser.error(f"--service-s {args.service_s}: comma-separated seconds")
    if min(args.services_s) <= 0 or min(args.stat_count, args.iterations, args.repeats) < 1:
        parser.error("--service-s > 0, --stat-count >= 1, --iterations >= 1, --repeats >= 1")
    return args


def main() -> int:
    args = parse_args()
    print(f"{machine_text(with_ram=False)}; load {load_average_text()}")
    if not args.skip_holds:
        compare_holds(args.services_s, args.holds, args.threads, args.rounds)
    missing = fuse_unavailable()
    if missing:
        print(f"\n2. through FUSE: skipped ({missing})")
        return 0
    through_fuse(args.services_s, args)
    print(f"load at the end {load_average_text()}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
