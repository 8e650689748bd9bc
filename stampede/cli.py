"""The `stampede` command: argument parsing, the MPI entry point, errors to exit codes.

Only this module resolves COMM_WORLD. Errors are caught here and nowhere else: a
StampedeError becomes one line on rank 0 and the same exit status on every rank; any
other exception aborts the whole MPI job instead of leaving ranks in a barrier.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from stampede import __version__
from stampede.errors import StampedeError, UsageError
from stampede.launcher import find_mpiexec, launcher_rank
from stampede.spec import OPTIONS, REQUIRED

# Subcommands that live in a module of their own: each has register(commands, formatter),
# which adds its parser with `func` set. Only the module of the command being run is
# imported (all of them for --help or a mistyped command): at 16,384 ranks every
# module a worker rank imports is a metadata storm of its own.
COMMAND_MODULES = {"sweep": "stampede.commands.sweep", "compare": "stampede.results.compare",
                   "import": "stampede.results.importers", "slurm": "stampede.commands.slurm",
                   "plot": "stampede.results.plot", "gpu": "stampede.run.h2d", "mttr": "stampede.model.mttr",
                   "emulate-mds": "stampede.emulate.mds", "project": "stampede.model.project"}
CORE_COMMANDS = ("run", "prepare", "plan", "clean", "report", "startup", "demo")

METRICS_HELP = """\
what stampede measures (per layout, per op; all ranks start together after a barrier):
  op            stat, open (object stores: one HEAD each), header (read and parse a
                safetensors/HDF5 header), read (one block: os.preadv into a page-aligned
                buffer, or one ranged GET; ttfb = its time to first byte), close, index
                (a shared index read whole), verify (hashing and the finite check,
                timed apart from reads), restore (pseudo-op: from the phase's start,
                the first rank of the node leaving the start barrier, until the rank
                holds all its bytes); all ranks of a node on one clock
  latency       min/p50/p90/p99/p99.9/max over every rank's samples of every measured
                iteration (exact, int64 ns, linear interpolation), with the count
  agg GB/s      total bytes / (last stop - first start over all ranks), GB = 1e9 B;
                per-rank rates are never summed (IOR's definition)
  time to last rank / first done
                slowest / fastest rank's restore time; straggler = slowest / median
  slowest-rank GB/s
                bytes per rank / time to last rank: BW_rank_io of the recovery model
  iterations    warmup iterations are run and dropped; the report shows the median
                over iterations and its min-max spread, and warns when it is wide
  cache         warm = page cache as it is (a warm read is not a restore);
                cold = each rank's pages evicted (posix_fadvise DONTNEED) before each
                iteration, then how many are still cached (mincore: cache_resident_pct);
                direct = O_DIRECT with aligned buffers
  retries       requests the storage client retried (503 SlowDown, timeouts), per op,
                apart from count (successes) and errors (failed after retries)
archive: one CSV row per (run, layout, op), appended, schema-versioned, plus a JSON
sidecar per run (hosts, MPI library, file system, Slurm variables).
"""


def _job_keys_help() -> str:
    lines = ["job file keys (TOML [section] key = value; override any with --set KEY=VALUE):"]
    for option in OPTIONS:
        default = "required" if option.default is REQUIRED else f"default {_toml(option.default)}"
        lines.append(f"  {option.key:<26} {default}\n      {option.help}")
    return "\n".join(lines)


def _toml(value: object) -> str:
    """A default as it would be written in the job file."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if value == "":
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


class _Parser(argparse.ArgumentParser):
    """argparse that prints usage errors on rank 0 only (every rank exits 2)."""

    def error(self, message: str) -> Any:
        if launcher_rank() == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _modules_for(argv: Sequence[str] | None) -> list[str]:
    """The command modules this command line needs registered."""
    words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
    command = words[0] if words else ""
    if command in CORE_COMMANDS:
        return []
    if command in COMMAND_MODULES:
        return [COMMAND_MODULES[command]]
    return list(COMMAND_MODULES.values())


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(prog="stampede", formatter_class=formatter,
                     description="Benchmark the storage stampede of a checkpoint restore: N MPI "
                                 "ranks open, stat and read a checkpoint at the same moment.",
                     epilog=METRICS_HELP)
    parser.add_argument("--version", action="version", version=f"stampede {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)

    def job_command(name: str, help_text: str, epilog: str = "") -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  formatter_class=formatter, epilog=epilog)
        sub.add_argument("job", help="job file (TOML), e.g. jobs/quickstart.toml")
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a job key, e.g. --set target.path=/lustre/me/ckpt")
        return sub

    run = job_command("run", "Restore the prepared checkpoint on every rank, timed; archive "
                             "and report. Launch with mpiexec/srun; alone it is one rank.",
                      METRICS_HELP + "\n" + _job_keys_help())
    run.add_argument("--checkpoint", metavar="PATH", default=None,
                     help="restore an existing checkpoint (safetensors file or directory with "
                          "an index, PyTorch DCP directory, HDF5), read-only: sets "
                          "checkpoint.source = existing and target.path = PATH")
    run.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                     help="run the copy `prepare --from PATH` made (its size comes from PATH): "
                          "sets checkpoint.from = PATH and checkpoint.source = synthetic")
    run.set_defaults(func=cmd_run)
    prepare = job_command("prepare", "Write the job's checkpoint (every layout) in parallel, "
                                     "fsync it, and record sizes, SHA-256 and XXH3 in a "
                                     "manifest. "
                                     "Use the same rank count as run.", _job_keys_help())
    prepare.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                         help="fill the layouts with the tensors of this existing checkpoint "
                              "(a copy at target.path; the source is only read): sets "
                              "checkpoint.from = PATH and checkpoint.source = synthetic")
    prepare.set_defaults(func=cmd_prepare)
    plan = job_command("plan", "Dry run: validate the job and print who reads what. No I/O.",
                       _job_keys_help())
    plan.add_argument("--np", type=int, default=None,
                      help="rank count to plan for (default: the launcher's, else 1)")
    plan.add_argument("--checkpoint", metavar="PATH", default=None,
                      help="plan the restore of an existing checkpoint: what it holds and who "
                           "reads what (reads its headers only)")
    plan.set_defaults(func=cmd_plan)
    clean = job_command("clean", "Remove what prepare wrote (only files in its manifest).")
    clean.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                       help="clean the copy `prepare --from PATH` made (PATH is not touched)")
    clean.set_defaults(func=cmd_clean)
    report = commands.add_parser("report", help="Re-render archived runs from a CSV archive.",
                                 description="Re-render archived runs from the CSV alone: the "
                                             "last run in full, then every run's restore.",
                                 formatter_class=formatter, epilog=METRICS_HELP)
    report.add_argument("archive", help="CSV archive, e.g. results/quickstart.csv")
    report.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                        help="show this run in full (repeatable)")
    report.add_argument("--last", type=int, default=1, help="show the last N runs in full")
    report.set_defaults(func=cmd_report)
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
    startup.add_argument("--archive", default="results/startup.csv",
                         help="archive to append to (default results/startup.csv)")
    startup.add_argument("--np", type=int, default=None,
                         help="launch the venv's mpiexec with this many ranks (else: measure "
                              "the ranks this process belongs to)")
    startup.add_argument("--repeat", type=int, default=3,
                         help="with --np: how many launches (default 3)")
    startup.set_defaults(func=cmd_startup)
    demo = commands.add_parser("demo", help="Prepare, run and report the embedded default job "
                                            "(local temp dir, shared and sharded) with the "
                                            "venv's own mpiexec.", formatter_class=formatter,
                               epilog=METRICS_HELP)
    demo.add_argument("--np", type=int, default=4, help="ranks (default 4)")
    demo.add_argument("--size", default="512MiB", help="checkpoint size (default 512MiB)")
    demo.add_argument("--archive", default="results/demo.csv",
                      help="archive to append to (default results/demo.csv)")
    demo.set_defaults(func=cmd_demo)
    for module in _modules_for(argv):
        importlib.import_module(module).register(commands, formatter)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    comm = None
    try:
        status: int = args.func(args)
        return status
    except StampedeError as error:
        comm = _initialised_comm()
        if comm is not None and comm.Get_size() > 1 and not error.collective:
            # Raised on this rank alone while MPI runs: the others may be waiting for it.
            print(f"stampede {args.command}: error on rank {comm.Get_rank()}: {error}",
                  file=sys.stderr, flush=True)
            comm.Abort(error.exit_status)
        if launcher_rank() == 0:
            print(f"stampede {args.command}: error: {error}", file=sys.stderr, flush=True)
        return error.exit_status
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug: stop the whole job rather than hang the other ranks
        traceback.print_exc()
        comm = _initialised_comm()
        if comm is not None and comm.Get_size() > 1:
            comm.Abort(1)
        return 1


def _initialised_comm() -> Any:
    mpi4py = sys.modules.get("mpi4py.MPI")
    if mpi4py is None or not mpi4py.Is_initialized() or mpi4py.Is_finalized():
        return None
    return mpi4py.COMM_WORLD


def cmd_run(args: argparse.Namespace) -> int:
    from stampede import mpi
    from stampede.errors import RunFailed
    from stampede.results.archive import append_rows, check_appendable, write_sidecar
    from stampede.results.rows import archive_rows, sidecar
    from stampede.run.job import run_job
    from stampede.spec import load_job

    spec = load_job(args.job, _overrides(args))  # validated before MPI starts and before any I/O
    comm = mpi.world()
    from stampede.checkpoint.relayout import resolve
    spec, _ = resolve(comm, spec)
    mpi.on_root(comm, "checking the archive", partial(check_appendable, spec.archive_path))
    if comm.Get_rank() == 0:
        strategies = (f"assign {', '.join(spec.assign)}" if spec.checkpoint_source == "existing"
                      else f"layouts {', '.join(spec.layouts)}")
        print(f"stampede run {spec.name}: {comm.Get_size()} rank(s), {strategies}, "
              f"{spec.warmup} warmup + {spec.iterations} iterations "
              f"each, cache {spec.cache}, target {spec.target_path}", file=sys.stderr, flush=True)
    context, runs = run_job(comm, spec)
    if comm.Get_rank() == 0:
        rows = [row for run in runs for row in archive_rows(spec, context, run)]
        append_rows(spec.archive_path, rows)
        sidecar_file = write_sidecar(spec.archive_path, context.run_id, sidecar(spec, context, runs))
        from stampede.results.report import make_console, render_run
        console = make_console()
        render_run(rows, console, [text for run in runs for text in run.messages])
        console.print(f"archived: {spec.archive_path} (+ {sidecar_file})")
    failed = [f"{run.layout}: {run.invalid_reason}" for run in runs if run.invalid_reason]
    if failed:
        error = RunFailed("run finished with errors, archived as invalid: " + "; ".join(failed))
        error.collective = True  # every rank took the same decisions, so every rank is here
        raise error
    return 0


def _overrides(args: argparse.Namespace) -> list[str]:
    """--set, plus what --checkpoint (run, plan) and --from (prepare) stand for."""
    overrides = list(args.set)
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint is not None:
        overrides += ["checkpoint.source=existing", f"target.path={json.dumps(checkpoint)}"]
    from_path = getattr(args, "from_path", None)
    if from_path is not None:   # a copy in stampede's layouts, whatever the job's source
        overrides += [f"checkpoint.from={json.dumps(from_path)}", "checkpoint.source=synthetic"]
    return overrides


def cmd_prepare(args: argparse.Namespace) -> int:
    from stampede import mpi
    from stampede.backends import backend_name_for
    from stampede.checkpoint.prepare import prepare
    from stampede.spec import load_job

    spec = load_job(args.job, _overrides(args))
    backend_name_for(spec.target_path)   # an unknown scheme: before MPI and any I/O
    comm = mpi.world()
    manifest = prepare(comm, spec)
    if comm.Get_rank() == 0:
        for layout in spec.layouts:
            entry = manifest["layouts"][layout]
            total = sum(record["bytes"] for record in entry["files"])
            print(f"prepared {layout}: {len(entry['files'])} file(s), {total} bytes for "
                  f"{entry['nranks']} ranks in {spec.target_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from stampede.backends import backend_name_for
    from stampede.results.report import make_console, render_plan
    from stampede.spec import load_job

    spec = load_job(args.job, _overrides(args))
    nranks = args.np if args.np is not None else \
        int(os.environ.get("PMI_SIZE") or os.environ.get("SLURM_NTASKS") or 1)
    if nranks < 1:
        raise UsageError(f"--np {nranks}: must be at least 1")
    if launcher_rank() != 0:
        return 0
    if spec.checkpoint_source == "existing":
        from stampede.existing.catalogue import scan
        from stampede.results.report import render_existing_plan
        render_existing_plan(spec, scan(spec.target_path, spec.storage_options), nranks,
                             make_console())
        return 0
    if spec.from_path:
        from stampede.checkpoint.relayout import sized, source_catalogue
        spec = sized(spec, source_catalogue(spec).total_bytes, nranks)
    render_plan(spec, nranks, backend_name_for(spec.target_path), make_console())
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from stampede.checkpoint.clean import clean
    from stampede.spec import load_job

    spec = load_job(args.job, _overrides(args))
    if spec.checkpoint_source == "existing":
        raise UsageError(f"{spec.source}: checkpoint.source = \"existing\": clean never deletes "
                         "a checkpoint stampede did not make")
    if launcher_rank() == 0:
        removed = clean(spec)
        print(f"removed {len(removed)} path(s) that prepare created in {spec.target_path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from stampede.results.archive import read_rows
    from stampede.results.report import make_console, render_archive

    rows = read_rows(args.archive)
    if not rows:
        raise UsageError(f"{args.archive}: the archive holds no runs")
    render_archive(rows, make_console(), args.run, max(args.last, 1))
    return 0


def cmd_startup(args: argparse.Namespace) -> int:
    import subprocess
    import time

    from stampede.run.startup import LAUNCH_VARIABLE

    imports = tuple(filter(None, (name.strip() for name in args.imports.split(","))))
    if args.np is None:
        return _startup_here(imports, args.archive)
    if args.np < 1 or args.repeat < 1:
        raise UsageError(f"--np {args.np} --repeat {args.repeat}: both must be at least 1")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise UsageError("startup --np needs mpiexec, and none was found",
                         hint="pip install -e '.[mpi]'")
    command = [mpiexec, "-n", str(args.np), sys.executable, "-P", "-m", "stampede", "startup",
               "--archive", args.archive, *(["--import", ",".join(imports)] if imports else [])]
    for _ in range(args.repeat):
        environment = {**os.environ, LAUNCH_VARIABLE: str(time.time_ns())}
        status = subprocess.call(command, env=environment, stdout=subprocess.DEVNULL)
        if status:
            return status
    from stampede.results.archive import read_rows
    from stampede.results.report import make_console, render_archive
    render_archive(read_rows(args.archive), make_console(), last=args.repeat)
    return 0


def _startup_here(imports: tuple[str, ...], archive: str) -> int:
    from stampede import mpi
    from stampede.run.startup import archive_startup, measure

    comm, record = measure(mpi.world, imports)
    records = mpi.gather(comm, record)
    if records is not None:
        rows = archive_startup(records, imports, archive, mpi.library_version(comm))
        from stampede.results.report import make_console, render_run
        render_run(rows, make_console())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Prepare, run, report and clean an embedded job in a temporary local directory."""
    import shutil
    import subprocess
    import tempfile
    if args.np < 1:
        raise UsageError(f"--np {args.np}: must be at least 1")
    mpiexec = find_mpiexec()
    if mpiexec is None and args.np > 1:
        raise UsageError(f"demo --np {args.np} needs mpiexec, and none was found",
                         hint="pip install -e '.[mpi]' (mpi4py and MPICH), or demo --np 1")
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
        for step in ("prepare", "run"):
            status = subprocess.call([*launch, sys.executable, "-P", "-m", "stampede", step, str(job)])
            if status:
                return status
        subprocess.call([sys.executable, "-P", "-m", "stampede", "clean", str(job)])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
