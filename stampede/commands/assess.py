"""`stampede assess`: one command, one answer. A short probe (one iteration at the
smallest rank count) plans the sweep to --budget (stampede.model.budget: iterations and
checkpoint size), the sweep runs through the local mpiexec (stampede sweep's steps) into
an archive of its own beside the report, and `report --html` writes the verdict: the
layout, time to last rank and T_MTTR projected to --target-ranks, the dominant term, the
band, with the plan said in the report. Each count also saves (`stampede save`, the job's
[save] keys) the layouts of the job that save writes, so that the verdict names a save
layout too; --no-save leaves the saves out. With --sbatch FILE it renders the sweep as one
sbatch script instead (stampede.sbatch; no probe: there is no allocation here).

A rank count the job cannot run (its checkpoint.replicas must divide every count) scales
the whole list by the replica count, so that the counts keep their ratios; the report
says so."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.flags import add_job_arguments, set_words
from stampede.commands.html import add_target_arguments, target_of
from stampede.commands.outputs import add_output

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.model.budget import Plan
    from stampede.spec import JobSpec

DEFAULT_BUDGET = "10min"


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "assess", formatter_class=formatter,
        help="Probe, plan a sweep to a time budget, run it (local mpiexec) or render it "
             "(--sbatch), fit the contention model, and write one HTML verdict: which layout, "
             "time to last rank and T_MTTR at --target-ranks, the dominant term, the band.",
        description="One sweep planned to --budget, and its verdict as one HTML file.")
    add_job_arguments(sub, "override a job key (passed to every step)",
                      access="none")   # the commands it launches lock for themselves
    sub.add_argument("--ranks", required=True, metavar="R[:N],...",
                     help="rank counts, three or more for a projection, e.g. 1,2,4 (R:N, R ranks "
                          "on N nodes, with --sbatch)")
    add_target_arguments(sub)
    sub.add_argument("--budget", default=DEFAULT_BUDGET, metavar="DURATION",
                     help=f"wall time for the whole assessment, e.g. 600, 90s, 10min (default "
                          f"{DEFAULT_BUDGET}); with --sbatch, the job's time limit")
    add_output(sub, "-o", "--output", default="", metavar="FILE.html",
               help="the report (default assess-JOB.html); its archive is FILE.csv beside "
                    "it, which must not exist yet")
    sub.add_argument("--no-save", action="store_true",
                     help="restores only: no `stampede save` at each count (by default the "
                          "job's layouts that save writes are saved too, after the restores)")
    add_output(sub, "--sbatch", default="", metavar="FILE.sbatch",
               help="render the sweep as an sbatch script instead of running it here")
    sub.set_defaults(func=cmd_assess)


def runnable_counts(spec: JobSpec, steps: tuple[tuple[int, int | None], ...]
                    ) -> tuple[tuple[int, ...], str]:
    """The counts to run and a note: scaled by the replica count when the job cannot run
    one of them as given (a UsageError when it cannot run them either way)."""
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.errors import UsageError

    counts = tuple(count for count, _ in steps)
    for factor in dict.fromkeys((1, max(spec.replicas, 1))):
        scaled = tuple(count * factor for count in counts)
        try:
            for nranks in scaled:
                bytes_per_rank(spec, nranks)
        except UsageError as error:
            refusal = error
            continue
        note = "" if factor == 1 else (
            f"--ranks {','.join(map(str, counts))} planned as {','.join(map(str, scaled))}: "
            f"checkpoint.replicas = {factor} must divide every rank count (each times {factor})")
        return scaled, note
    raise refusal


def outputs(args: argparse.Namespace, job_name: str) -> tuple[Path, Path]:
    """The report and its archive; a UsageError, before any run, when the archive exists,
    when the report would replace an input, or when its directory cannot be written."""
    from stampede.errors import UsageError
    from stampede.results.archive import sidecar_dir
    from stampede.values import refuse_overwrite

    report = Path(args.output or f"assess-{job_name}.html")
    archive = report.with_suffix(".csv")
    refuse_overwrite("-o", report, {"job file": Path(args.job), "archive": archive,
                                    "archive's sidecars": sidecar_dir(archive)})
    if archive.exists():
        raise UsageError(f"-o {report}: its archive {archive} exists already",
                         hint="give another -o, or remove it: an assessment fits its own runs")
    directory = report.absolute().parent
    if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"-o {report}: its directory {directory} is not a writable directory",
                         hint="give -o a path in a directory you can write")
    return report, archive


def cmd_assess(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError, install_hint
    from stampede.launcher import find_mpiexec, signals_stop_children
    from stampede.model.fit import MIN_RANK_COUNTS
    from stampede.sbatch import parse_steps
    from stampede.spec import load_job
    from stampede.units import parse_duration

    started = time.monotonic()
    steps = parse_steps(args.ranks)
    try:
        budget_s = parse_duration(args.budget)
    except ValueError as error:
        raise UsageError(f"--budget: {error}") from None
    target_of(args)   # the workload's flags checked before any I/O
    spec = load_job(args.job, args.set)
    counts, note = runnable_counts(spec, steps)
    saving = plan_saves(args, spec, counts)
    check_targets_empty(args.job, spec, saving)
    if args.sbatch:
        return render_sbatch(args, spec, saving,
                             ",".join(map(str, counts)) if note else args.ranks, budget_s)
    if any(nodes not in (None, 1) for _, nodes in steps):
        raise UsageError(f"--ranks {args.ranks}: R:N on several nodes needs Slurm here",
                         hint="render it with --sbatch FILE, or give rank counts alone")
    if len(steps) < MIN_RANK_COUNTS:   # the verdict projects to --target-ranks: never
        raise UsageError(                # a sweep that ends without one (--sbatch: its report)
            f"--ranks {args.ranks}: {len(steps)} rank count(s); the projection to "
            f"--target-ranks {args.target_ranks} needs at least {MIN_RANK_COUNTS}",
            hint="e.g. --ranks 1,2,4,8")
    report, archive = outputs(args, spec.name)
    signals_stop_children()   # SIGTERM as Ctrl-C: the step stopped, the targets cleaned
    mpiexec = find_mpiexec()
    if mpiexec is None and max(counts) > 1:
        raise UsageError("assess needs mpiexec for more than one rank, and none was found",
                         hint=install_hint("mpich"))
    probe, plan = probe_and_plan(args, saving, spec, counts, budget_s, started, mpiexec)
    return sweep_and_report(args, saving, spec, plan, (note, *probe), report, archive, mpiexec,
                            started)


@dataclass(frozen=True)
class Saving:
    """What each count saves after its run: `layouts` (none: no save) into `target`, a
    target of its own beside the job's (`run` restores a target's published save, and the
    next count must restore what its own prepare laid out); what was left out, and why."""

    layouts: tuple[str, ...] = ()
    target: str = ""
    object_store: bool = False
    left_out: str = ""

    @property
    def steps(self) -> tuple[str, ...]:
        return ("prepare", "run", "save") if self.layouts else ("prepare", "run")

    def pairs(self) -> list[str]:
        """The save's own --set pairs (none without a save)."""
        return [f"checkpoint.layout={json.dumps(list(self.layouts))}",
                f"target.path={json.dumps(self.target)}"] if self.layouts else []


def saves_target(target: str) -> str:
    """TARGET-saves beside the target; "" for a bucket's root (no prefix to put one beside:
    BUCKET-saves would be another bucket)."""
    scheme, found, rest = target.partition("://")
    if not found:
        return f"{os.path.normpath(target)}-saves"
    bucket, _, prefix = rest.strip("/").partition("/")
    return f"{scheme}://{bucket}/{prefix.rstrip('/')}-saves" if prefix else ""


def plan_saves(args: argparse.Namespace, spec: JobSpec, counts: tuple[int, ...]) -> Saving:
    """The job's layouts that `save` writes and would not refuse at any of `counts` (its
    checks before any I/O), with the reasons for the others."""
    from stampede.backends import open_backend
    from stampede.backends.base import object_store
    from stampede.checkpoint.save_plan import save_refusal
    from stampede.layouts import layout_of

    writable = tuple(layout for layout in spec.layouts if layout_of(layout).saves)
    target = saves_target(spec.target_path)
    if args.no_save or not writable or not target:
        return Saving(left_out="--no-save" if args.no_save else
                      "the job has no layout that save writes" if not writable else
                      f"target.path = {spec.target_path!r} is a bucket's root: the saves need "
                      "a prefix of their own beside the job's (give target.path = "
                      "s3://BUCKET/PREFIX)")
    try:
        backend = open_backend(target, spec.storage_options)
    except OSError as error:
        return Saving(left_out=f"cannot open {target} ({error.strerror or error})")
    if not backend.capabilities.saves:
        return Saving(left_out=f"the {backend.name} backend has no timed save yet")
    store = object_store(backend) is not None
    kept, refused = [], []
    for layout in writable:
        why = save_refusal(replace(spec, layouts=(layout,), target_path=target), counts, store)
        if why:
            refused.append(f"{layout}: save refuses it ({why})")
        else:
            kept.append(layout)
    return Saving(tuple(kept), target if kept else "", store, "; ".join(refused))


def check_targets_empty(job: str, spec: JobSpec, saving: Saving) -> None:
    """A UsageError, before any step, unless the target (and the saves' one) holds nothing:
    assess removes what it wrote there when it ends, so it writes only where nothing was
    (the save's journal would otherwise take in another job's versions, and its clean them)."""
    from stampede.backends import open_backend
    from stampede.checkpoint.lock import LOCK_NAME
    from stampede.errors import UsageError

    for target in filter(None, (spec.target_path, saving.target)):
        try:   # a writer's lock left alone is no checkpoint
            held = [name for name in open_backend(target, spec.storage_options).names()
                    if name != LOCK_NAME]
        except OSError as error:
            raise UsageError(f"target.path = {target!r}: cannot list it "
                             f"({error.strerror or error})") from None
        if held:
            raise UsageError(
                f"target.path = {target!r} holds {len(held)} file(s) (e.g. {held[0]}): assess "
                "prepares and saves its own checkpoint there and removes it after, so it "
                "starts only on an empty or new target",
                hint=f"--set target.path=A_NEW_DIRECTORY, or remove what stampede wrote there: "
                     f"stampede clean {job} --set target.path={target}")


def step_sets(args: argparse.Namespace, saving: Saving, spec: JobSpec, archive: Path, iterations: int,
              warmup: int, size_factor: float) -> dict[str, list[str]]:
    """The --set words of every step: the user's, then the plan's (the save's: its layouts
    and target)."""
    if spec.size_per_rank_bytes is not None:
        sized = ("checkpoint.size_per_rank", spec.size_per_rank_bytes)
    else:
        assert spec.size_total_bytes is not None   # a job gives one of the two (spec's rules)
        sized = ("checkpoint.size", spec.size_total_bytes)
    pairs = [*args.set, f"archive.path={json.dumps(str(archive))}", f"run.iterations={iterations}",
             f"run.warmup={warmup}", f"{sized[0]}={int(sized[1] * size_factor) // 4096 * 4096}"]
    words = set_words(pairs)
    return {"prepare": words, "run": words, "save": words + set_words(saving.pairs())}


def valid_factors(args: argparse.Namespace, saving: Saving, spec: JobSpec,
                  counts: tuple[int, ...]) -> list[float]:
    """The size factors (model.budget.SIZE_FACTORS) the job can run at every count, and
    save (a part size must still divide the writers' slices)."""
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.checkpoint.save_plan import save_refusal
    from stampede.errors import UsageError
    from stampede.model.budget import SIZE_FACTORS
    from stampede.spec import load_job

    allowed = []
    for factor in SIZE_FACTORS:
        pairs = step_sets(args, saving, spec, Path("probe.csv"), 1, 0, factor)["run"][1::2]
        try:
            scaled = load_job(args.job, pairs)
            for nranks in counts:
                bytes_per_rank(scaled, nranks)
        except UsageError:
            continue
        saved = replace(scaled, layouts=saving.layouts, target_path=saving.target)
        if saving.layouts and save_refusal(saved, counts, saving.object_store):
            continue
        allowed.append(factor)
    return allowed or [1.0]


def clean(job: str, saving: Saving, sets: dict[str, list[str]]) -> None:
    """`stampede clean` of what the steps wrote: the checkpoint, and the saves' target."""
    import subprocess

    from stampede.launcher import call

    for step in ("prepare", "save") if saving.layouts else ("prepare",):
        call([sys.executable, "-P", "-m", "stampede", "clean", job, *sets[step]],
             stdout=subprocess.DEVNULL)


def probe_and_plan(args: argparse.Namespace, saving: Saving, spec: JobSpec, counts: tuple[int, ...],
                   budget_s: float, started: float, mpiexec: str | None
                   ) -> tuple[tuple[str, ...], Plan]:
    """One iteration at the smallest count and PROBE_FACTOR of the size, its prepare, run
    and save timed apart, into a scratch archive (the probe's checkpoint and saves removed
    after it); the plan."""
    from stampede.commands.sweep import run_steps
    from stampede.errors import RunFailed
    from stampede.model.budget import PROBE_FACTOR, Probe, plan_sweep
    from stampede.results.archived import Archive

    sizes = valid_factors(args, saving, spec, counts)
    factor = min(sizes, key=lambda size: abs(size - PROBE_FACTOR))
    with tempfile.TemporaryDirectory(prefix="stampede-probe-") as scratch:
        archive = Path(scratch) / "probe.csv"
        sets = step_sets(args, saving, spec, archive, 1, 0, factor)
        walls = {}
        try:
            for step in saving.steps:
                begun = time.monotonic()
                if run_steps(args.job, counts[:1], sets, mpiexec, str(archive), True, (step,)):
                    raise RunFailed(f"assess: the probe's {step} at {counts[0]} rank(s) failed")
                walls[step] = time.monotonic() - begun
        finally:   # the sweep's first prepare starts from nothing, as the probe's did
            clean(args.job, saving, sets)
        probed = Archive.open(archive).rows
        work_s, save_work_s = (sum(row["time_to_last_rank_s"] for row in probed
                                   if row["op"] == op and row["valid"])
                                  for op in ("restore", "save"))
    probe = Probe(counts[0], walls["prepare"], walls["run"], work_s, factor,
                  walls.get("save", 0.0), save_work_s)
    plan = plan_sweep(probe, counts, budget_s, time.monotonic() - started, spec.iterations,
                      min(spec.warmup, 1), sizes, spec.size_per_rank_bytes is not None)
    saves = (f", save of 1 iteration {probe.save_s:.1f} s (its saves {save_work_s:.3f} s; "
             f"layouts {', '.join(saving.layouts)} into {saving.target}"
             + (f"; left out: {saving.left_out}" if saving.left_out else "") + ")"
             if saving.layouts else f", no save ({saving.left_out})")
    lines = (f"probe at {counts[0]} rank(s), checkpoint size x{factor:g}: prepare "
             f"{walls['prepare']:.1f} s, run of 1 iteration {walls['run']:.1f} s wall (its "
             f"restores {work_s:.3f} s){saves}", f"plan: {plan.describe()}")
    return lines, plan


def sweep_and_report(args: argparse.Namespace, saving: Saving, spec: JobSpec, plan: Plan,
                     notes: tuple[str, ...], report: Path, archive: Path, mpiexec: str | None,
                     started: float) -> int:
    """The planned sweep into `archive`, the checkpoint (and saves) cleaned when it
    ends, the report written."""
    from stampede.commands.html import write_report
    from stampede.commands.sweep import run_steps
    from stampede.results.archived import Archive

    sets = step_sets(args, saving, spec, archive, plan.iterations, plan.warmup, plan.size_factor)
    try:
        status = run_steps(args.job, plan.counts, sets, mpiexec, str(archive), quiet=True,
                           steps=saving.steps)
    finally:
        clean(args.job, saving, sets)
    if status:
        return status
    swept_s = time.monotonic() - started
    lines = (*(note for note in notes if note),
             f"assess: {swept_s:.0f} s wall from the start to the last run (budget "
             f"{args.budget}); "
             + (f"the checkpoint and the saves (in {saving.target}) were" if saving.layouts
                else "the checkpoint was") + " cleaned after the sweep",
             f"by hand: stampede project {archive} {by_hand(args)}; stampede mttr "
             f"{archive} --layout LAYOUT {by_hand(args)}")
    path, assessment = write_report(Archive.open(archive), str(report), *target_of(args), lines)
    print(f"stampede assess: wrote {path} (archive {archive}) in "
          f"{time.monotonic() - started:.0f} s", file=sys.stderr)
    for line in assessment.summary():
        print(f"  {line}", file=sys.stderr)
    return 0


def by_hand(args: argparse.Namespace) -> str:
    """The workload's flags as `project`, `mttr` and `report --html` take them."""
    words = [f"--target-ranks {args.target_ranks}"]
    for name in ("ranks-per-node", "model", "size", "bytes-per-rank"):
        value = getattr(args, f"target_{name}".replace("-", "_"))
        if value is not None:
            words.append(f"--target-{name} {value}")
    return " ".join(words)


def render_sbatch(args: argparse.Namespace, spec: JobSpec, saving: Saving, steps: str,
                  budget_s: float) -> int:
    """The sweep as one sbatch script (stampede slurm's template; `steps` as its --ranks;
    the saves after each count's run, as assess runs them), then the report's command."""
    import math

    from stampede.sbatch import allocation_for, render

    allocation = allocation_for(None, None, steps)
    minutes = max(math.ceil(budget_s / 60), 1)
    script = render(Path(args.job).resolve(), spec.name, args.set, allocation,
                    f"{minutes // 60:02d}:{minutes % 60:02d}:00", "", True,
                    f"stampede assess {args.job} --ranks {args.ranks} --sbatch {args.sbatch}",
                    save=saving.pairs())
    Path(args.sbatch).write_text(script)
    print(f"wrote {args.sbatch}; after it ran: stampede report {spec.archive_path} --html "
          f"{Path(spec.archive_path).with_suffix('.html')} {by_hand(args)} --target-mttr "
          f"{args.target_mttr}", file=sys.stderr)
    return 0
