"""`stampede startup`: the start-up stampede, T_pod_init, per rank (stampede.run.startup
measures; here the ranks' records become archive rows and a report)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_ARCHIVE, add_output
from stampede.errors import UsageError, install_hint
from stampede.launcher import call, find_mpiexec, signals_stop_children

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.results.recorder import Show
    from stampede.run.startup import StartupRecord


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    startup = commands.add_parser(
        "startup", formatter_class=formatter,
        help="Measure the start-up stampede (T_pod_init) per rank: interpreter, imports, MPI "
             "init. Under a launcher it measures its own ranks; with --np it launches the "
             "venv's mpiexec --repeat times.",
        description="Measure the start-up stampede (T_pod_init) per rank.",
        epilog="ops: interpreter = launch -> stampede's first line; import = stampede's run "
               "modules and --import; mpi_init = MPI_Init; startup = launch -> MPI ready.\n"
               "launch = $STAMPEDE_LAUNCH_NS (ns since the epoch; --np sets it), else the "
               "process start time from /proc (one clock tick).")
    startup.add_argument("--import", dest="imports", default="", metavar="MODULES",
                         help="comma-separated modules every rank imports too, e.g. torch,numpy")
    add_output(startup, "--archive", kind=OUTPUT_ARCHIVE, default="results/startup.csv",
               help="archive to append to (default results/startup.csv)")
    startup.add_argument("--np", type=int, default=None,
                         help="launch the venv's mpiexec with this many ranks (else: measure "
                              "the ranks this process belongs to)")
    startup.add_argument("--repeat", type=int, default=3,
                         help="with --np: how many launches (default 3)")
    startup.set_defaults(func=cmd_startup)


def cmd_startup(args: argparse.Namespace) -> int:
    from stampede.run.startup import LAUNCH_VARIABLE

    imports = tuple(filter(None, (name.strip() for name in args.imports.split(","))))
    if args.np is None:
        return _measure_here(imports, args.archive)
    if args.np < 1 or args.repeat < 1:
        raise UsageError(f"--np {args.np} --repeat {args.repeat}: both must be at least 1")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise UsageError("startup --np needs mpiexec, and none was found",
                         hint=install_hint("mpich"))
    import subprocess  # with --np only: the ranks this command measures import this module

    signals_stop_children()
    command = [mpiexec, "-n", str(args.np), sys.executable, "-P", "-m", "stampede", "startup",
               "--archive", args.archive, *(["--import", ",".join(imports)] if imports else [])]
    for _ in range(args.repeat):
        environment = {**os.environ, LAUNCH_VARIABLE: str(time.time_ns())}
        status = call(command, env=environment, stdout=subprocess.DEVNULL)
        if status:
            return status
    from stampede.present.report import make_console, render_archive
    from stampede.results.archived import Archive
    render_archive(Archive.open(args.archive).rows, make_console(), last=args.repeat)
    return 0


def _measure_here(imports: tuple[str, ...], archive: str) -> int:
    from stampede import mpi
    from stampede.run.startup import measure

    comm, record = measure(mpi.world, imports)
    records = mpi.gather(comm, record)
    if records is not None:
        from stampede.present.report import make_console, render_run
        archive_startup(records, imports, archive, mpi.library_version(comm),
                        lambda rows, _: render_run(rows, make_console()))
    return 0


def archive_startup(records: list[StartupRecord], imports: tuple[str, ...], archive: str,
                    mpi_library: str, show: Show) -> None:
    """Rank 0: stats over ranks, the run recorded (rows, sidecar, `show`n)."""
    from stampede.results.recorder import Recorder
    from stampede.results.rows import new_run_id, now_stamp, op_rows, shared_columns
    from stampede.results.stats import layout_stats
    from stampede.run.startup import samples, startup_warnings

    hosts = tuple(record["host"] for record in records)
    stats = layout_stats("startup", samples(records), len(records), completion_op="startup")
    warnings = startup_warnings(records)
    recorder = Recorder(archive, new_run_id(), "startup", show)
    shared = {**shared_columns(recorder.run_id, now_stamp(), "startup", "-", "startup", hosts,
                               phase="startup"),
              "iterations": stats.iterations,
              "pattern": "+".join(("interpreter", "import", "mpi_init")),
              "warnings": " | ".join(warnings), "archive": archive}
    recorder.record(op_rows(shared, stats, 0, hosts), {
        "imports": list(imports), "mpi_library": mpi_library, "ranks": records,
        "warnings": warnings})
