"""`stampede sweep`: one job at several rank counts through the local mpiexec, every run
appended to the job's one archive (for users without Slurm; slurm/sweep.sbatch is the
batch-system twin).

A checkpoint is prepared for one rank count (a sharded one has a file per shard), so
each step prepares, then runs; `--clean` removes the checkpoint at the end.

`--prepare-path DIR` prepares (and cleans) at DIR but runs at the job's target.path: for a
target that cannot be written but shows DIR, such as the read-only mount of
`stampede emulate-mds MOUNT --backing DIR` (`--set target.path=MOUNT/ck --prepare-path
DIR/ck`). Both jobs are validated before the first launch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import TYPE_CHECKING

from stampede.commands.flags import add_job_arguments, set_words
from stampede.launcher import call

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def parse_ranks(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8); counts must be whole numbers >= 1, no repeats."""
    from stampede.errors import UsageError

    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise UsageError(f"--ranks {text!r}: must be distinct rank counts >= 1, e.g. 1,2,4,8")
    return counts


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "sweep", formatter_class=formatter,
        help="Run one job at several rank counts through the local mpiexec, appending every "
             "run to the job's archive (prepare, then run, at each count).",
        description="Run one job at several rank counts through the local mpiexec.",
        epilog="Each rank count is a separate `stampede run`, appended to archive.path; "
               "`stampede report ARCHIVE --png DIR` then draws GB/s and time to last rank against ranks.")
    add_job_arguments(sub, "override a job key (passed to every step)",
                      access="none")   # the commands it launches lock for themselves
    sub.add_argument("--ranks", required=True, type=str, help="rank counts, e.g. 1,2,4,8")
    sub.add_argument("--clean", action="store_true", help="remove the checkpoint at the end")
    sub.add_argument("--prepare-path", default=None, metavar="DIR",
                     help="prepare and clean with target.path = DIR, run with the job's "
                          "target.path: for a read-only view of DIR, such as an emulate-mds "
                          "mount of it")
    sub.set_defaults(func=cmd_sweep)


def prepare_overrides(args: argparse.Namespace) -> list[str]:
    """The --set list of prepare and clean: the job's, then target.path = --prepare-path."""
    if args.prepare_path is None:
        return list(args.set)
    from stampede import values
    from stampede.errors import UsageError

    try:
        values.target_path(args.prepare_path)
    except ValueError as error:
        raise UsageError(f"--prepare-path {values.shown(args.prepare_path)}: {error}") from None
    return [*args.set, f"target.path={json.dumps(args.prepare_path)}"]


def cmd_sweep(args: argparse.Namespace) -> int:
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.errors import UsageError, install_hint
    from stampede.launcher import find_mpiexec, signals_stop_children
    from stampede.spec import load_job

    counts = parse_ranks(args.ranks)
    spec = load_job(args.job, args.set)   # every error before the first launch
    prepared = prepare_overrides(args)
    load_job(args.job, prepared)          # the job prepare and clean will see
    for nranks in counts:
        bytes_per_rank(spec, nranks)      # replicas divide it, the size is large enough
    mpiexec = find_mpiexec()
    if mpiexec is None and max(counts) > 1:
        raise UsageError("sweep needs mpiexec for more than one rank, and none was found",
                         hint=install_hint("mpich"))
    sets = {step: set_words(pairs) for step, pairs in (("prepare", prepared), ("run", args.set))}
    signals_stop_children()
    status = run_steps(args.job, counts, sets, mpiexec, spec.archive_path)
    if status:
        return status
    if args.clean:
        call([sys.executable, "-P", "-m", "stampede", "clean", args.job, *sets["prepare"]])
    print(f"stampede sweep: {len(counts)} rank counts appended to {spec.archive_path}",
          file=sys.stderr)
    return 0


def run_steps(job: str, counts: tuple[int, ...], sets: dict[str, list[str]], mpiexec: str | None,
              archive: str, quiet: bool = False, steps: tuple[str, ...] = ("prepare", "run")) -> int:
    """prepare, then run (then save, where `steps` says), at each rank count through the
    local mpiexec; the first failing step's exit status (the runs before it stay in
    `archive`), else 0. `sets`: each step's --set words; quiet: the steps' output to
    /dev/null (their errors still on stderr); `steps`: which commands, in order."""
    for nranks in counts:
        launch = [mpiexec, "-n", str(nranks)] if nranks > 1 and mpiexec else []
        print(f"stampede sweep: {nranks} rank(s)", file=sys.stderr, flush=True)
        for step in steps:
            status = call([*launch, sys.executable, "-P", "-m", "stampede", step, job,
                           *sets[step]], stdout=subprocess.DEVNULL if quiet else None)
            if status:
                print(f"stampede sweep: {step} at {nranks} rank(s) failed (exit {status}); runs "
                      f"before it stay in {archive}", file=sys.stderr)
                return status
    return 0
