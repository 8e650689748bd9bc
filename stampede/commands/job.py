"""The job commands: `run` (restore, timed, archived), `prepare` (write the checkpoint),
`plan` (who reads what, no I/O) and `clean` (remove what prepare wrote)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from stampede.commands import metrics_text
from stampede.commands.flags import (
    add_job_arguments,
    add_trace_arguments,
    hold_target,
    job_world,
    overrides,
    target_count,
    traced,
)
from stampede.errors import CheckpointError, UsageError
from stampede.launcher import launcher_rank, launcher_size
from stampede.spec import OPTIONS, REQUIRED
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from pathlib import Path

    from stampede.checkpoint.lock import Access
    from stampede.commands import Subparsers
    from stampede.model.traffic import LayoutBytes
    from stampede.mpi import Comm
    from stampede.present.report import RunReport
    from stampede.results.model import LayoutRun, LayoutTrace, RunContext
    from stampede.results.recorder import Recorder
    from stampede.spec import JobSpec


DEFAULT_RESTORE_TIME = "60s"   # plan's requests per prefix a second: a sub-minute restore


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    def job_command(name: str, help_text: str, epilog: Callable[[], str] | None = None, *,
                    access: Access) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text,
                                  formatter_class=formatter, epilog_text=epilog)
        add_job_arguments(sub, access=access)
        return sub

    run = job_command("run", "Restore the prepared checkpoint on every rank, timed; archive "
                             "and report. Launch with mpiexec/srun; alone it is one rank.",
                      lambda: metrics_text() + "\n" + job_keys_help(), access="read")
    run.add_argument("--checkpoint", metavar="PATH", default=None,
                     help="restore an existing checkpoint (safetensors file or directory with "
                          "an index, PyTorch DCP directory, HDF5), read-only: sets "
                          "checkpoint.source = existing and target.path = PATH")
    run.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                     help="run the copy `prepare --from PATH` made (its size comes from PATH): "
                          "sets checkpoint.from = PATH and checkpoint.source = synthetic")
    add_trace_arguments(run)
    run.set_defaults(func=cmd_run)
    prepare = job_command("prepare", "Write the job's checkpoint (every layout) in parallel, "
                                     "fsync it, and record sizes, SHA-256 and XXH3 in a "
                                     "manifest. Use the same rank count as run.", job_keys_help,
                          access="write")
    prepare.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                         help="fill the layouts with the tensors of this existing checkpoint "
                              "(a copy at target.path; the source is only read): sets "
                              "checkpoint.from = PATH and checkpoint.source = synthetic")
    prepare.set_defaults(func=cmd_prepare)
    plan = job_command("plan", "Dry run: validate the job and print who reads what. No I/O.",
                       job_keys_help, access="none")
    plan.add_argument("--np", type=int, default=None,
                      help="rank count to plan for (default: the launcher's, else 1)")
    plan.add_argument("--checkpoint", metavar="PATH", default=None,
                      help="plan the restore of an existing checkpoint: what it holds and who "
                           "reads what (reads its headers only)")
    plan.add_argument("--ranks-per-node", type=target_count("--ranks-per-node"), default=None,
                      metavar="K", help="ranks per node, for what every layout would read from "
                      "storage into a node (default: every rank on one node)")
    plan.add_argument("--save", action="store_true",
                      help="plan `stampede save` instead: who writes what in one version, and "
                           "whether the versions kept at once fit")
    plan.add_argument("--restore-time", default=DEFAULT_RESTORE_TIME, metavar="DURATION",
                      help="object stores: the restore time the requests per prefix a second "
                           f"are over (default {DEFAULT_RESTORE_TIME})")
    add_trace_arguments(plan)
    plan.set_defaults(func=cmd_plan)
    clean = job_command("clean", "Remove what prepare and save wrote (only what their "
                                 "manifest and journal list: every saved version, finished "
                                 "or not).", access="write")
    clean.add_argument("--from", dest="from_path", metavar="PATH", default=None,
                       help="clean the copy `prepare --from PATH` made (PATH is not touched)")
    clean.set_defaults(func=cmd_clean)


def job_keys_help() -> str:
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


def cmd_run(args: argparse.Namespace) -> int:
    from stampede.checkpoint.formats import require_packages
    from stampede.run.job import run_job
    from stampede.spec import load_job

    spec = traced(args, load_job(args.job, overrides(args)))  # validated before MPI and any I/O
    require_packages(spec)
    comm = job_world(args, spec)
    if spec.from_path:   # prepare --from's copy, sized from its source (imported only then)
        from stampede.existing.relayout import resolve
        spec, _ = resolve(comm, spec)
    existing = spec.checkpoint_source == "existing"
    strategies = spec.assign if existing else spec.layouts
    measure(comm, spec, "run", strategies, f"{'assign' if existing else 'layouts'} "
            f"{', '.join(strategies)}, {spec.warmup} warmup + {spec.iterations} iterations "
            f"each, cache {spec.cache}", run_job)
    return 0


def measure(comm: Comm, spec: JobSpec, step: str, strategies: tuple[str, ...], what: str,
            job: Callable[..., tuple[RunContext, list[LayoutRun]]], archiver: Archiver | None = None,
            context: RunContext | None = None, final: bool = True) -> tuple[RunContext, Archiver]:
    """What run, save and cycle share: the archive checked before any I/O, a line saying
    what runs, each layout reported and archived as it completes (`job`: run_job or
    save_job, in the run `context` when one is given), signals and failures said once, the
    summary when `final`. Returns the run's context and its archiver (a cycle's restore
    half goes on with the save half's)."""
    from stampede import mpi
    from stampede.errors import RunFailed
    from stampede.run.interrupt import Interrupts

    mpi.on_root(comm, "checking the archive", partial(_check_archive, spec.archive_path))
    if comm.Get_rank() == 0:
        print(f"stampede {step} {spec.name}: {comm.Get_size()} rank(s), {what}, target "
              f"{spec.target_path}", file=sys.stderr, flush=True)
    if archiver is None:
        archiver = Archiver(spec, len(strategies), comm.Get_rank() == 0, step)
    archiver.spec = spec
    interrupts = Interrupts().install()
    try:
        context, runs = job(comm, spec, archiver.layout_done, interrupts, archiver.tick,
                            context=context)
    finally:
        interrupts.restore()
        archiver.progress.close()
    if final or interrupts.received or any(run.invalid_reason for run in runs):
        archiver.finish()
    if interrupts.received:
        stopped = RunFailed(f"stopped by {interrupts.name}: {archiver.unmeasured(strategies)}")
        stopped.exit_status, stopped.collective = 128 + interrupts.received, True
        raise stopped
    failed = [f"{run.layout}: {run.invalid_reason}" for run in runs if run.invalid_reason]
    if failed:
        error = RunFailed(f"{step} finished with errors, archived as invalid: " + "; ".join(failed))
        error.collective = True  # every rank took the same decisions, so every rank is here
        raise error
    return context, archiver


def _check_archive(path: str) -> None:
    """Rank 0: the archive can take this run's rows (the archive's modules, rank 0's alone)."""
    from stampede.results.archive import check_appendable

    check_appendable(path)


class Archiver:
    """Rank 0's side of a run: each layout reported and archived as it completes (its rows
    appended whole, the sidecar rewritten with every layout so far), so a run stopped
    later (a signal, a failure) keeps what it measured; the summary at the end. Every
    rank keeps its progress line object (enabled on rank 0 only). A cycle's two halves
    share one (one run, one report); `layouts` counts the layouts of both."""

    def __init__(self, spec: JobSpec, layouts: int, root: bool, command: str) -> None:
        from stampede.present.progress import Progress

        self.spec, self.layouts, self.root, self.command = spec, layouts, root, command
        self.runs: list[LayoutRun] = []
        self.messages: list[str] = []
        self.recorder: Recorder | None = None   # once the run has its id
        self.report: RunReport | None = None     # rank 0's
        self.traces: dict[str, LayoutTrace] = {}   # --trace: "phase/layout" -> its rows
        self.progress = Progress(root)
        self.steps = 0
        self.total_steps = layouts * (spec.warmup + spec.iterations)

    def tick(self, layout: str, iteration: int, seconds: float) -> None:
        from stampede.run.verdict import iteration_name
        from stampede.units import format_seconds

        self.steps += 1
        which = iteration_name(iteration, self.spec.warmup) + \
            (f" of {self.spec.iterations}" if iteration >= 0 else "")
        self.progress.step(f"{layout} ({len(self.runs) + 1}/{self.layouts}): {which} took "
                           f"{format_seconds(seconds)}", self.steps, self.total_steps,
                           final=iteration == self.spec.iterations - 1)

    def layout_done(self, context: RunContext, run: LayoutRun) -> None:
        """Rank 0, collectively: the layout recorded (reported, then archived whole or not
        at all, the sidecar rewritten with every layout so far)."""
        from stampede.present.report import RunReport
        from stampede.results.recorder import Recorder
        from stampede.results.rows import archive_rows, sidecar

        self.steps = (len(self.runs) + 1) * (self.spec.warmup + self.spec.iterations)
        if run.interrupted and not run.iterations_done:
            return   # stopped in a warmup: nothing measured, nothing archived
        rows = archive_rows(self.spec, context, run)
        self.progress.close()
        if self.recorder is None:
            self.report = RunReport()
            self.recorder = Recorder(self.spec.archive_path, context.run_id, self.command,
                                     self.report.show)
        traces = self.traces if run.trace is None else \
            {**self.traces, f"{run.phase}/{run.layout}": run.trace}
        # its rows archived only with its sidecar and (--trace) the phases traced so far
        self.recorder.record(rows, sidecar(self.spec, context, [*self.runs, run]),
                             None if run.trace is None else trace_writer(context, traces))
        self.runs.append(run)
        self.messages += run.messages
        self.traces = traces

    def finish(self) -> None:
        if not self.root or self.recorder is None:
            return
        from stampede.results.trace import trace_path

        assert self.report is not None and self.recorder.sidecar_file is not None   # set together
        traced = f", trace {trace_path(self.recorder.sidecar_file)}" if self.traces else ""
        self.report.finish(self.recorder.rows, self.messages, self.recorder.archived(traced))

    def unmeasured(self, strategies: tuple[str, ...]) -> str:
        """What a signal left: the layouts archived whole, the one archived as incomplete
        (the iterations it finished, marked invalid), the ones never measured."""
        whole = [run.layout for run in self.runs if not run.interrupted]
        cut = [f"{run.layout} ({run.iterations_done} of {self.spec.iterations} iterations, "
               "archived as incomplete)" for run in self.runs if run.interrupted]
        done = {run.layout for run in self.runs}
        left = [name for name in strategies if name not in done]
        return (f"archived {', '.join(whole + cut) or 'none'}; not measured (nothing of them "
                f"archived): {', '.join(left) or 'none'}")


def trace_writer(context: RunContext, traces: dict[str, LayoutTrace]) -> Callable[[Path], object]:
    """--trace: the phases traced so far, written whole where the recorder says."""
    from stampede.results.trace import write_trace

    meta: dict[str, object] = {"run_id": context.run_id, "hosts_by_rank": list(context.hosts)}
    return lambda path: write_trace(path, traces, meta)


def cmd_prepare(args: argparse.Namespace) -> int:
    from stampede.backends import backend_name_for
    from stampede.checkpoint.formats import require_packages
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.checkpoint.prepare import prepare
    from stampede.existing.relayout import SourceContent, resolve
    from stampede.present.progress import progress_bar
    from stampede.spec import load_job
    from stampede.units import format_bytes

    spec = load_job(args.job, overrides(args))
    require_packages(spec)
    backend_name_for(spec.target_path)   # an unknown scheme: before MPI and any I/O
    comm = job_world(args, spec)
    spec, source = resolve(comm, spec)   # checkpoint.from: sized from the source
    copied = None if source is None else \
        SourceContent(source, bytes_per_rank(spec, comm.Get_size()), spec.block_bytes)
    manifest = prepare(comm, spec, progress_bar, copied=copied)
    if comm.Get_rank() == 0:
        for layout in spec.layouts:
            entry = manifest["layouts"][layout]
            total = sum(record["bytes"] for record in entry["files"])
            print(f"prepared {layout}: {len(entry['files'])} file(s), {format_bytes(total)} "
                  f"({total:,} bytes) for {entry['nranks']} ranks in {spec.target_path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from stampede.backends import backend_name_for
    from stampede.checkpoint.plan import checkpoint_files, plan_rank, reads_storage, shown_ranks
    from stampede.checkpoint.prepare import space_needed
    from stampede.present.report import make_console
    from stampede.present.report_plan import render_plan
    from stampede.spec import load_job

    spec = load_job(args.job, overrides(args))
    nranks = args.np if args.np is not None else (launcher_size() or 1)
    if nranks < 1:
        raise UsageError(f"--np {nranks}: must be at least 1")
    restore_s = restore_time_s(args.restore_time)
    if launcher_rank() != 0:
        return 0
    shown = shown_ranks(nranks)
    if spec.checkpoint_source == "existing":
        from stampede.existing.assign import plan_existing
        from stampede.existing.scan import scan
        from stampede.present.report_plan import render_existing_plan

        catalogue = scan(spec.target_path, spec.storage_options)
        policies = [(policy, [plan_existing(catalogue, spec, policy, nranks, rank)
                              for rank in range(nranks)], shown) for policy in spec.assign]
        render_existing_plan(catalogue, nranks, policies, make_console())
        return 0
    if args.save:
        _plan_save(spec, nranks, shown)
        return 0
    if spec.from_path:
        from stampede.existing.relayout import sized, source_catalogue
        spec = sized(spec, source_catalogue(spec).total_bytes, nranks)
    layouts = []
    for layout in spec.layouts:
        plans = [(rank, plan_rank(spec, layout, nranks, rank) if rank >= 0 else None)
                 for rank in shown]
        layouts.append((layout, checkpoint_files(spec, layout, nranks),
                        [(rank, plan, plan is not None and reads_storage(spec, plan))
                         for rank, plan in plans]))
    space = space_needed(spec, nranks).describe()
    per_node = args.ranks_per_node or nranks
    render_plan(spec, nranks, backend_name_for(spec.target_path), layouts, space, make_console(),
                served_bytes(spec, nranks, per_node),
                f"{-(-nranks // per_node):,} node(s) of {min(per_node, nranks):,}")
    if capabilities_for(spec.target_path).object_store:
        from stampede.checkpoint.prefix_requests import prefix_load
        from stampede.present.report_plan import render_prefixes

        render_prefixes([prefix_load(spec, layout, nranks, restore_s)
                         for layout in spec.layouts], nranks, make_console())
    if args.trace:
        print(trace_estimate(traced(args, spec), nranks))
    return 0


def restore_time_s(text: str) -> float:
    """--restore-time in seconds (UsageError for anything but a positive duration)."""
    from stampede.units import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as error:
        raise UsageError(f"--restore-time: {error}") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"--restore-time {text}: must be a finite duration above 0",
                         hint="for example --restore-time 60s")
    return seconds


def served_bytes(spec: JobSpec, nranks: int, per_node: int) -> list[LayoutBytes]:
    """What storage would serve every layout's restore at this rank count (the traffic
    model's bytes), beside the bytes the job needs (the plan's)."""
    from stampede.checkpoint.plan import bytes_per_rank, needed_bytes
    from stampede.model.traffic import Geometry, layout_bytes

    geometry = Geometry(nranks, per_node, spec.replicas, spec.broadcast_group)
    return [served._replace(needed_bytes=needed_bytes(spec, served.layout, nranks))
            for served in layout_bytes(geometry, bytes_per_rank(spec, nranks))]


def trace_estimate(spec: JobSpec, nranks: int) -> str:
    """--trace: what each layout's trace would hold at most (run refuses past the limit)."""
    from stampede.checkpoint.plan import plan_rank
    from stampede.results.trace import ROW_BYTES, estimated_rows
    from stampede.units import format_bytes

    parts = []
    for layout in spec.layouts:
        ops = sum(estimated_rows(sum(plan_rank(spec, layout, nranks, rank).op_counts().values()),
                                 spec.iterations + spec.warmup) for rank in range(nranks))
        verdict = "" if ops * ROW_BYTES <= spec.trace_limit else " (past the limit: refused)"
        parts.append(f"{layout} about {ops:,} ops, {format_bytes(ops * ROW_BYTES)}{verdict}")
    return (f"trace (--trace, limit {format_bytes(spec.trace_limit)}, {ROW_BYTES} bytes an op): "
            + "; ".join(parts))


def _plan_save(spec: JobSpec, nranks: int, shown: list[int]) -> None:
    """`plan --save`: the save's checks, one version's writers per layout, the space."""
    from stampede.checkpoint.plan import checkpoint_files
    from stampede.checkpoint.prepare import save_space_needed
    from stampede.checkpoint.save_plan import check_save, save_plan, version_directories
    from stampede.checkpoint.versions import version_dir
    from stampede.present.report import make_console
    from stampede.present.report_plan import render_save_plan

    check_save(spec)
    layouts = []
    for layout in spec.layouts:
        root = version_dir(layout, 1)
        layouts.append((layout, checkpoint_files(spec, layout, nranks, root),
                        version_directories(spec, layout, nranks, root),
                        [(rank, save_plan(spec, layout, nranks, rank, root) if rank >= 0
                          else None) for rank in shown]))
    space = save_space_needed(spec, nranks).describe()   # as on a new target
    render_save_plan(spec, nranks, layouts, space, make_console())


def cmd_clean(args: argparse.Namespace) -> int:
    from stampede.checkpoint.clean import clean
    from stampede.spec import load_job

    spec = load_job(args.job, overrides(args))
    if spec.checkpoint_source == "existing":
        raise UsageError(f"{spec.source}: checkpoint.source = \"existing\": clean never deletes "
                         "a checkpoint stampede did not make")
    if launcher_rank() == 0:
        hold_target(args, spec, None)
        try:
            removed = clean(spec)
        except CheckpointError as error:
            raise CheckpointError(error.message, hint=error.hint or _rejoin_left(spec)) \
                from None
        print(f"removed {len(removed)} path(s) that prepare or save created in {spec.target_path}")
        left = _rejoin_left(spec)
        if left:
            print(f"stampede clean: note: {left}", file=sys.stderr)
    return 0


def _rejoin_left(spec: JobSpec) -> str:
    """What a rejoin of this job left on the target is `rejoin --clean`'s to remove (its
    files and every node's local tier), never clean's: said, or "" where it left nothing."""
    from stampede.backends import open_backend
    from stampede.run.tiers import storage_dir

    try:
        left = open_backend(spec.target_path, spec.storage_options).names(storage_dir(spec))
    except OSError:
        return ""
    if not left:
        return ""
    return (f"{spec.target_path.rstrip('/')}/{storage_dir(spec)}/ holds what a rejoin of this "
            f"job left ({len(left)} file(s)): `stampede rejoin --clean {spec.source}` removes "
            "it, launched as the rejoin was (on the same nodes: their local tiers too)")
