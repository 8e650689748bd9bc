"""The save commands: `save` (the save stampede, timed, archived) and `cycle` (K saves then
K restores of what they wrote, MPI ranks shifted, the page cache dropped between: one run,
one report)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING

from stampede.commands.flags import add_job_arguments, add_trace_arguments, job_world, overrides, traced
from stampede.results.definitions import SAVE_METRICS

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.mpi import Comm
    from stampede.spec import JobSpec


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    from stampede.commands.job import job_keys_help

    save = commands.add_parser(
        "save", formatter_class=formatter, epilog=SAVE_METRICS + "\n" + job_keys_help(),
        help="Save a new checkpoint version on every rank at once, timed (create, write, "
             "fsync, rename, publish, retention); archive and report.",
        description="Every rank writes its shard of a new version at the same moment, as a "
                    "training job's checkpoint does: timed op by op, made durable, "
                    "validated, then published (the layout's pointer, written last); older "
                    "versions beyond save.keep are deleted after it. `stampede run` then "
                    "restores the published version. Launch with mpiexec/srun.")
    add_job_arguments(save, access="write")
    _add_scale(save)
    add_trace_arguments(save)
    save.set_defaults(func=cmd_save)
    cycle = commands.add_parser(
        "cycle", formatter_class=formatter, epilog=SAVE_METRICS + "\n" + job_keys_help(),
        help="K saves then K restores of what they wrote (MLPerf Storage's checkpointing "
             "pattern), in one run and one report.",
        description="run.iterations saves of each layout, then the page cache dropped "
                    "(and its state checked: run.cache = cold), then run.iterations restores "
                    "of the published version with the ranks shifted (run.rank_shift, "
                    "default: half the ranks), so that every rank reads what another wrote.")
    add_job_arguments(cycle, access="write")
    _add_scale(cycle)
    add_trace_arguments(cycle)
    cycle.set_defaults(func=cmd_cycle)


def _add_scale(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--scale", metavar="FACTOR",
                     help="layout mlperf: every file's size times FACTOR (1/1024, 0.01), the "
                          "layout kept: checkpoint.scale; labelled not comparable with "
                          "submissions")


def _load(args: argparse.Namespace) -> JobSpec:
    from stampede.checkpoint.formats import require_packages
    from stampede.checkpoint.save_plan import check_object_save, check_save
    from stampede.launcher import launcher_size
    from stampede.spec import load_job
    from stampede.targets import capabilities_for

    # given, even empty (--scale '' once meant full size without a word): the parser refuses it
    scale = [f"checkpoint.scale={json.dumps(args.scale)}"] if args.scale is not None else []
    spec = traced(args, load_job(args.job, overrides(args) + scale))   # before MPI and any I/O
    check_save(spec)
    require_packages(spec)
    if capabilities_for(spec.target_path).object_store:   # pure, before the lock's requests
        check_object_save(spec, launcher_size() or 1)
    return spec


def _what(spec: JobSpec) -> str:
    return (f"layouts {', '.join(spec.layouts)}, {spec.warmup} warmup + {spec.iterations} "
            f"saves each, {spec.save_mode}, durability {spec.durability}, validate "
            f"{spec.validate}, keep {spec.keep}")


def cmd_save(args: argparse.Namespace) -> int:
    from stampede.commands.job import measure
    from stampede.run.save import save_job

    spec = _load(args)
    comm = job_world(args, spec)
    measure(comm, spec, "save", spec.layouts, _what(spec), save_job)
    return 0


def cmd_cycle(args: argparse.Namespace) -> int:
    from stampede import mpi
    from stampede.commands.job import Archiver, measure
    from stampede.run.job import run_job
    from stampede.run.save import save_job

    spec = _load(args)
    comm = job_world(args, spec)
    rank, nranks = comm.Get_rank(), comm.Get_size()
    archiver = Archiver(spec, 2 * len(spec.layouts), rank == 0, "cycle")
    gap = None
    if spec.workload != "none":   # MLPerf's rules read when the writes end, the reads start
        from stampede.run.mlperf import Gap

        gap = Gap()
        archiver.tick = gap.watch(archiver.tick)   # type: ignore[method-assign, assignment]
    context, archiver = measure(comm, spec, "cycle", spec.layouts, "saves: " + _what(spec),
                                save_job, archiver, final=False)
    restore = restore_spec(spec, nranks)
    if gap is not None:
        gap.reading = True
    mpi.collective(comm, "dropping the page cache", lambda: _drop_between(comm, restore))
    if rank == 0:
        print(f"stampede cycle {spec.name}: restores: the published versions, rank_shift "
              f"{restore.rank_shift}, cache {restore.cache}", file=sys.stderr, flush=True)
    context, archiver = measure(comm, restore, "cycle", restore.layouts,
                                f"{restore.iterations} restores each", run_job, archiver, context)
    if gap is not None:
        from stampede.run.mlperf import report

        report(comm, spec, restore, context, archiver.runs, gap)
    return 0


def restore_spec(spec: JobSpec, nranks: int) -> JobSpec:
    """The restore half of a cycle: the published saves, cold (or direct), every rank
    reading what another rank wrote."""
    shift = spec.rank_shift or nranks // 2
    cache = spec.cache if spec.cache == "direct" else "cold"
    values = {**spec.values, "run.rank_shift": shift, "run.cache": cache,
              "run.restore": "saved"}
    return replace(spec, rank_shift=shift, cache=cache, restore_from="saved", values=values)


def _drop_between(comm: Comm, spec: JobSpec) -> None:
    """Between the halves: the kernel's caches dropped once per node when run.drop_caches
    allows it (root); the restore's cold eviction then checks what is still resident."""
    from stampede import mpi

    if spec.drop_caches and mpi.node_rank(comm) == 0:
        from stampede.run.cache import drop_caches

        notes: list[str] = []
        drop_caches(notes)
        for note in notes:
            print(f"stampede: {note}", file=sys.stderr, flush=True)
