"""`stampede demo`: prepare and run (the restore) an embedded job at 1, 2 and --np ranks,
save it (the save stampede), clean, and print the verdict of those runs (the sweep the
projection needs), in a temporary local directory, through the venv's own mpiexec: the
README's first command."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.html import add_target_arguments, target_of
from stampede.commands.outputs import OUTPUT_ARCHIVE, add_output
from stampede.errors import UsageError, install_hint
from stampede.launcher import call, find_mpiexec, signals_stop_children
from stampede.results.definitions import METRICS

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.model.workload import Workload


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    demo = commands.add_parser("demo", help="Prepare and restore the embedded default job "
                                            "(local temp dir, shared and sharded) at 1, 2 and "
                                            "--np ranks, save it at --np, clean, and print the "
                                            "verdict at --target-ranks, with the venv's own "
                                            "mpiexec.",
                               formatter_class=formatter,
                               epilog=METRICS)
    demo.add_argument("--np", type=int, default=4, help="ranks of the largest run (default 4)")
    demo.add_argument("--size", default="128MiB", help="checkpoint size (default 128MiB)")
    add_output(demo, "--archive", kind=OUTPUT_ARCHIVE, default="results/demo.csv",
               help="archive to append to (default results/demo.csv)")
    add_target_arguments(demo)
    demo.set_defaults(func=cmd_demo)


def rank_counts(np: int) -> tuple[int, ...]:
    """The restore's rank counts: 1, 2 and np, those up to np (three project; fewer are
    said by the verdict)."""
    return tuple(sorted({count for count in (1, 2, np) if count <= np}))


def cmd_demo(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise UsageError(f"--np {args.np}: must be at least 1")
    target = target_of(args)   # a bad target flag before any run
    mpiexec = find_mpiexec()
    if mpiexec is None and args.np > 1:
        raise UsageError(f"demo --np {args.np} needs mpiexec, and none was found",
                         hint=f"{install_hint('mpich')} (mpi4py and MPICH), or demo --np 1")
    signals_stop_children()   # SIGTERM as Ctrl-C: the steps stopped, the scratch removed
    workdir = Path(tempfile.mkdtemp(prefix="stampede-demo-"))
    job = workdir / "demo.toml"
    job.write_text(
        "# stampede demo: the embedded default job\n"
        f'[target]\npath = "{workdir / "ckpt"}"\n'
        f'[checkpoint]\nsize = "{args.size}"\nlayout = ["shared", "sharded"]\n'
        f'block_size = "4MiB"\n[run]\niterations = 5\nwarmup = 1\ncache = "warm"\n'
        f'[archive]\npath = "{Path(args.archive).resolve()}"\n')
    counts = rank_counts(args.np)
    print(f"stampede demo: {args.size} checkpoint in {workdir}, started and restored at "
          f"{', '.join(map(str, counts))} rank(s), saved at {args.np}")
    before = _run_ids(args.archive)

    def under(ranks: int, *command: str) -> list[str]:
        launch = [mpiexec, "-n", str(ranks)] if ranks > 1 and mpiexec else []
        return [*launch, sys.executable, "-P", "-m", "stampede", *command]

    # each count: the ranks' start-up (T_pod_init, and the barrier projected to the target),
    # then prepare its checkpoint (a layout is laid out for its rank count) and restore it;
    # then 3 saves (validated, published) at the largest
    steps = [command for ranks in counts for command in (
        [sys.executable, "-P", "-m", "stampede", "startup", "--np", str(ranks), "--repeat", "1",
         "--archive", str(Path(args.archive).resolve())],
        under(ranks, "prepare", str(job)),
        under(ranks, "run", str(job), "--set", "run.restore=prepared"))]
    steps.append(under(args.np, "save", str(job), "--set", "run.iterations=3"))
    try:
        for command in steps:
            status = call(command)
            if status:
                return status
        call([sys.executable, "-P", "-m", "stampede", "clean", str(job)])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _verdict(args.archive, before, target)
    return 0


def _run_ids(archive: str) -> set[str]:
    """The runs an archive holds already (none where it does not exist yet)."""
    from stampede.results.archived import Archive

    return {row["run_id"] for row in Archive.open(archive).rows} if Path(archive).exists() else set()


def _verdict(archive: str, before: set[str], target: tuple[Workload, float]) -> None:
    """The verdict of this demo's runs alone (an archive appended to by earlier demos, of
    other sizes, is not one sweep), as `stampede report ARCHIVE --html` prints it."""
    from stampede.model.assessment import assess
    from stampede.results.archived import Archive

    mine = Archive.open(archive).without(before)
    workload, target_mttr_s = target
    print(f"verdict of this demo's runs at {workload.ranks} ranks "
          f"(stampede report {archive} --html FILE: the page):")
    for line in assess(mine, workload, target_mttr_s).summary():
        print(f"  {line}")
