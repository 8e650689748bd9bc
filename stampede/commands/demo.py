"""`stampede demo`: prepare, run (the restore), save (the save stampede), report and clean
an embedded job in a temporary local directory, through the venv's own mpiexec: the
README's first command."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_ARCHIVE, add_output
from stampede.errors import UsageError, install_hint
from stampede.launcher import call, find_mpiexec, signals_stop_children
from stampede.results.definitions import METRICS

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    demo = commands.add_parser("demo", help="Prepare, restore and save the embedded default job "
                                            "(local temp dir, shared and sharded), report and "
                                            "clean, with the venv's own mpiexec.",
                               formatter_class=formatter,
                               epilog=METRICS)
    demo.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    demo.add_argument("--size", default="512MiB", help="checkpoint size (default 512MiB)")
    add_output(demo, "--archive", kind=OUTPUT_ARCHIVE, default="results/demo.csv",
               help="archive to append to (default results/demo.csv)")
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise UsageError(f"--np {args.np}: must be at least 1")
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
    print(f"stampede demo: {args.np} ranks, {args.size} checkpoint in {workdir}")
    launch = [mpiexec, "-n", str(args.np)] if args.np > 1 and mpiexec else []
    try:
        # the restore of a prepared checkpoint, then 3 saves (validated, published) of it
        for step, *sets in (("prepare",), ("run", "--set", "run.restore=prepared"),
                            ("save", "--set", "run.iterations=3")):
            status = call([*launch, sys.executable, "-P", "-m", "stampede", step,
                                      str(job), *sets])
            if status:
                return status
        call([sys.executable, "-P", "-m", "stampede", "clean", str(job)])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
