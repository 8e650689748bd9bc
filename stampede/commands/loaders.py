"""`stampede loaders`: the loaders ML jobs use (stampede.run.loaders) beside stampede's
own raw restore of the same existing checkpoint, per assign policy, in one invocation:
the ceiling (stampede.run.job, as `stampede run --checkpoint` restores it) and then each
loader on each device, the same ranks, assignment and cache state; archived as rows of
one run (the loader's name in the tool column) and reported with each loader's
efficiency (stampede.results.loaders).

A command, not a `run.loader` key: a loader opens and reads the files itself, so none of
a run's storage pattern (backends, block reads, verdicts per op) applies to it, and a
job key would be a new CSV column on every row of every run."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, TypedDict

from stampede.commands.flags import add_job_arguments, job_world, overrides
from stampede.errors import UsageError

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.existing.catalogue import Catalogue
    from stampede.mpi import Comm
    from stampede.results.ceiling import Ceiling
    from stampede.results.model import LayoutRun, RunContext
    from stampede.results.recorder import Recorder
    from stampede.run.devices import CudaDevice
    from stampede.run.loaders import LoaderEntry
    from stampede.run.loaders.trial import Measured, Target
    from stampede.spec import JobSpec

# The ceiling is the raw restore: hashing or checking inside it would slow the ceiling.
RAW_RESTORE = ('run.verify="none"', "run.check_finite=false")
DEVICES = ("cpu", "cuda")
HOST_MEMORY = "cpu"   # host memory; a GPU is labelled as `stampede gpu` labels it
LOADER_BACKEND = "posix"   # the loaders read files (parse_request refuses URLs)


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    from stampede.run.loaders import LOADERS

    sub = commands.add_parser(
        "loaders", formatter_class=formatter,
        help="Load an existing checkpoint with real loaders (safetensors, torch.load, DCP, "
             "Run:ai streamer, fastsafetensors, tensorizer) beside stampede's raw restore of "
             "the same bytes: time to last rank, GB/s, efficiency, what dominates.",
        description="Real loaders beside the storage ceiling. Launch with mpiexec/srun.",
        epilog="loaders (each an optional extra; a missing one is skipped, with why):\n" +
               "\n".join(f"  {entry.name:<16} reads {', '.join(entry.formats)}: {entry.how}"
                         for entry in LOADERS.values()))
    add_job_arguments(sub, access="none")   # existing checkpoints only: no lock file in them
    sub.add_argument("--checkpoint", metavar="PATH", default=None,
                     help="the existing checkpoint (a POSIX path): sets checkpoint.source = "
                          "existing and target.path = PATH")
    sub.add_argument("--loaders", default="all",
                     help=f"comma-separated, of {', '.join(LOADERS)} (default all: those that "
                          "read the checkpoint's format)")
    sub.add_argument("--devices", default="cpu,cuda",
                     help="where the tensors go: cpu, cuda (default cpu,cuda; cuda is skipped, "
                          "with why, where PyTorch sees no GPU)")
    sub.set_defaults(func=cmd_loaders)


def parse_request(args: argparse.Namespace) -> tuple[JobSpec, tuple[str, ...], tuple[str, ...]]:
    """The job (its restore made raw), the loaders and devices asked: before MPI and I/O."""
    from stampede.run.loaders import LOADERS
    from stampede.spec import load_job
    from stampede.targets import capabilities_for

    spec = load_job(args.job, [*overrides(args), *RAW_RESTORE])
    if spec.checkpoint_source != "existing":
        raise UsageError(f"{spec.source}: stampede loaders loads an existing checkpoint",
                         hint="give --checkpoint PATH (or checkpoint.source = \"existing\")")
    if not capabilities_for(spec.target_path).local_files:
        raise UsageError(f"target.path = {spec.target_path!r}: the loaders read POSIX paths",
                         hint="point at the checkpoint on a file system")
    names = tuple(dict.fromkeys(word.strip() for word in args.loaders.split(",") if word.strip()))
    names = tuple(LOADERS) if names == ("all",) else names
    devices = tuple(dict.fromkeys(word.strip() for word in args.devices.split(",") if word.strip()))
    unknown = [name for name in names if name not in LOADERS]
    if not names or unknown:
        raise UsageError(f"--loaders {args.loaders!r}: of all, {', '.join(LOADERS)}"
                         + (f" (not {', '.join(unknown)})" if unknown else ""))
    if not devices or any(device not in DEVICES for device in devices):
        raise UsageError(f"--devices {args.devices!r}: of {', '.join(DEVICES)}")
    return spec, names, devices


def cmd_loaders(args: argparse.Namespace) -> int:
    from stampede import mpi
    from stampede.errors import RunFailed
    from stampede.results.archive import check_appendable

    spec, names, devices = parse_request(args)
    comm = job_world(args, spec)
    mpi.on_root(comm, "checking the archive", partial(check_appendable, spec.archive_path))
    catalogue = mpi.on_root(comm, "reading the checkpoint's headers",
                            partial(_scan, spec, comm.Get_size()))
    entries, skipped = _runnable(catalogue.format, names)
    targets, skipped_devices = _targets(comm, devices)
    if not entries or not targets:
        raise UsageError(f"{catalogue.root}: nothing to run: "
                         + "; ".join(f"{name}: {why}" for name, why in skipped + skipped_devices))
    if comm.Get_rank() == 0:
        print(f"stampede loaders {spec.name}: {comm.Get_size()} rank(s), {catalogue.format} "
              f"checkpoint {catalogue.root}, assign {', '.join(spec.assign)}, cache {spec.cache}"
              f", loaders {', '.join(e.name for e in entries)} on "
              f"{', '.join(t.label for t in targets)}", file=sys.stderr, flush=True)
    session = _Session(comm, spec, catalogue, skipped + skipped_devices)
    for policy in spec.assign:
        session.ceiling(policy)
        for entry in entries:
            for target in targets:
                session.loader(entry, target, policy)
    session.finish(entries)
    if session.failed:
        error = RunFailed("loaders finished with errors, archived as invalid: "
                          + "; ".join(session.failed))
        error.collective = True
        raise error
    return 0


def _scan(spec: JobSpec, nranks: int) -> Catalogue:
    """Rank 0: the checkpoint's headers, and every policy checked against its format."""
    from stampede.existing.assign import assign
    from stampede.run.job import scan_existing

    catalogue = scan_existing(spec)
    for policy in spec.assign:
        assign(catalogue, policy, nranks, 0)
    return catalogue


def _runnable(fmt: str, names: tuple[str, ...]) -> tuple[list[LoaderEntry], list[tuple[str, str]]]:
    """The loaders asked that read this format and are installed; the others, with why."""
    from stampede.run.loaders import LOADERS, missing_package

    entries, skipped = [], []
    for name in names:
        entry = LOADERS[name]
        why = "" if fmt in entry.formats else \
            f"reads {', '.join(entry.formats)} checkpoints; this one is {fmt}"
        why = why or missing_package(entry)
        if why:
            skipped.append((name, why))
        else:
            entries.append(entry)
    return entries, skipped


def _targets(comm: Comm, devices: tuple[str, ...]) -> tuple[list[Target], list[tuple[str, str]]]:
    """Where the tensors go; a GPU on every rank, or on none (skipped, with why)."""
    import numpy as np

    from stampede import mpi
    from stampede.run.loaders.trial import Target

    targets, skipped = [], []
    for device in devices:
        if device == "cpu":
            targets.append(Target("cpu", HOST_MEMORY))
            continue
        from stampede.run.devices import CudaDevice
        try:
            gpu: CudaDevice | None = CudaDevice(mpi.node_rank(comm))
        except UsageError as error:
            gpu, why = None, error.message
        lacking = mpi.allreduce_sum(comm, np.array([int(gpu is None)]))
        if gpu is not None and lacking is not None and int(lacking[0]) == 0:
            targets.append(Target(f"cuda:{gpu.index}", gpu.label, gpu.torch.cuda.synchronize))
        else:
            skipped.append(("cuda", why if gpu is None else "not every rank sees a GPU"))
    return targets, skipped


class _LoaderPart(TypedDict):
    """One loader's part of the sidecar (by "loader device policy")."""
    valid: bool
    messages: list[str]
    digests: list[dict[str, list[object]]]   # per rank: name -> [bytes, xxh3]


class _Session:
    """One invocation's run: its id, the ranks' hosts, its recorder (rank 0: each ceiling
    and each loader archived as it completes, so a run stopped later keeps them; reported
    together at the end), the sidecar's parts so far, and what failed."""

    def __init__(self, comm: Comm, spec: JobSpec, catalogue: Catalogue,
                 skipped: list[tuple[str, str]]) -> None:
        from stampede import mpi
        from stampede.results.recorder import Recorder
        from stampede.results.rows import new_run_id, now_stamp

        self.comm, self.spec, self.catalogue, self.skipped = comm, spec, catalogue, skipped
        self.run_id = mpi.bcast(comm, new_run_id("loaders") if comm.Get_rank() == 0 else "")
        self.stamp = now_stamp()
        hosts = mpi.gather(comm, mpi.processor_name(comm))
        self.hosts: tuple[str, ...] = tuple(mpi.bcast(comm, hosts or []))
        self.recorder: Recorder | None = None if comm.Get_rank() else Recorder(
            spec.archive_path, self.run_id, "loaders", lambda rows, sidecar: None)  # finish reports
        self.ceilings: list[LayoutRun] = []
        self.context: RunContext | None = None
        self.measured: RunContext | None = None   # the run that measured the raw ceiling
        self.loaders: dict[str, _LoaderPart] = {}
        self.failed: list[str] = []

    def ceiling(self, policy: str) -> None:
        """stampede's own restore of the checkpoint under the policy (rows on rank 0)."""
        from stampede.results.rows import archive_rows
        from stampede.run.job import run_job

        spec = replace(self.spec, assign=(policy,))

        def collect(context: RunContext, run: LayoutRun) -> None:
            self.context = replace(context, run_id=self.run_id)
            self.ceilings.append(run)
            self._record(archive_rows(spec, self.context, run))

        # run.ceiling: the raw-read ceiling measured once, before the first policy's
        # restore (on every rank: each must agree it was), and the later policies' runs
        # carry it
        context, runs = run_job(self.comm, spec, collect, context=self.measured)
        if context.ceiling is not None:
            self.measured = context
        self.failed += [f"stampede {run.layout}: {run.invalid_reason}"
                        for run in runs if run.invalid_reason]

    def loader(self, entry: LoaderEntry, target: Target, policy: str) -> None:
        from stampede import mpi
        from stampede.results.rows import shared_columns
        from stampede.run.loaders.trial import measure
        from stampede.run.loaders.work import rank_work

        comm, spec = self.comm, self.spec
        work = rank_work(self.catalogue, policy, comm.Get_size(), comm.Get_rank())
        measured = measure(comm, entry, work, target, spec.iterations, spec.warmup,
                           spec.cache == "cold", self.hosts)
        assigned = mpi.gather(comm, work.assigned_bytes)
        failed = mpi.bcast(comm, bool(measured and measured.failed))
        if failed:
            self.failed.append(f"{entry.name} on {target.label}, {policy}: see the messages")
        rows: list[dict[str, str]] = []
        if measured is not None and assigned is not None:   # rank 0
            shared = {**spec.columns(),
                      **shared_columns(self.run_id, self.stamp, spec.name, LOADER_BACKEND,
                                       policy, self.hosts, valid=not measured.failed,
                                       tool=entry.name)}
            rows = _loader_rows(shared, self.catalogue.format, entry, target.label, measured,
                                assigned, self.hosts,
                                self.context.ceiling if self.context is not None else None)
            self.loaders[f"{entry.name} {target.label} {policy}"] = {
                "valid": not measured.failed, "messages": list(measured.messages),
                "digests": list(measured.digests)}
        mpi.on_root(comm, f"archiving {entry.name} on {target.label}, {policy}",
                    lambda: self._record(rows))

    def _record(self, rows: list[dict[str, str]]) -> None:
        """Rank 0: a ceiling's or a loader's rows archived, the sidecar with all so far."""
        from stampede.results.rows import sidecar

        assert self.recorder is not None and self.context is not None   # rank 0, a ceiling first
        self.recorder.record(rows, {
            "ceiling": sidecar(self.spec, self.context, self.ceilings), "loaders": self.loaders,
            "skipped": [list(pair) for pair in self.skipped]})

    def finish(self, entries: list[LoaderEntry]) -> None:
        """Rank 0: the report of everything recorded."""
        if self.comm.Get_rank() != 0:
            return
        from stampede.present.report import make_console
        from stampede.present.report_loaders import render_loaders
        from stampede.results.loaders import loader_lines

        assert self.recorder is not None   # rank 0's
        rows = self.recorder.rows
        notes = list(dict.fromkeys(
            f"{row['tool']} {row['layout']}: {note}" for row in rows
            if row["op"] == "restore" for note in filter(None, row["warnings"].split(" | "))))
        console = make_console()
        render_loaders(loader_lines(rows), self.skipped, notes,
                       [(entry.name, entry.how) for entry in entries], console,
                       [message for part in self.loaders.values() for message in part["messages"]])
        console.print(self.recorder.archived(), markup=False)


def _loader_rows(shared: dict[str, object], fmt: str, entry: LoaderEntry, label: str, measured: Measured,
                 assigned: list[int], hosts: tuple[str, ...],
                 ceiling: Ceiling | None = None) -> list[dict[str, str]]:
    """Rank 0: one loader's rows (its phases and restore), as a layout's: the policy is
    the layout, the loader the tool, its phases the pattern; bytes are assigned bytes."""
    from stampede.results.amplification import RankNeed, amplification
    from stampede.results.ceiling import ceiling_columns
    from stampede.results.cells import cell
    from stampede.results.rows import amplification_columns, op_rows

    stats = measured.stats
    if stats is None:
        return []
    loaded = next((op.bytes for op in stats.ops if op.op == "load"), 0) / max(stats.iterations, 1)
    notes = []
    if sum(assigned) and loaded > 1.01 * sum(assigned):
        notes.append(f"{entry.name} loads {loaded / sum(assigned):.2f}x the assigned bytes "
                     f"({int(loaded):,} for {sum(assigned):,}: whole tensors or files)")
    columns = {**shared, "format": fmt, "cache": shared.get("cache", ""), "block_bytes": "",
               "pattern": "+".join(entry.phases), "bytes_per_rank": max(assigned),
               "bytes_total": sum(assigned), "iterations": stats.iterations, "device": label,
               "warnings": " | ".join(notes),
               "invalid_reason": "a rank's loader raised (see the errors)" if measured.failed
               else ""}
    rows = op_rows(columns, stats, max(assigned), hosts)
    if sum(assigned):   # what it loaded over what the ranks needed: the job's, per iteration,
        # at its worst node and rank (the ranks' assignments are disjoint: each its own key)
        needs = [RankNeed(float(read), int(need), rank) for rank, (read, need)
                 in enumerate(zip(measured.loaded_bytes or [0.0] * len(assigned), assigned,
                                  strict=True))]
        worst = amplification(needs, hosts)
        for row in rows:
            if row["op"] == stats.completion_op:
                row.update(amplification_columns(worst, loaded))
    if ceiling is not None:   # its GB/s per node (the assigned bytes) over the raw ceiling
        nnodes = len(set(hosts))
        for row in rows:
            if row["op"] == stats.completion_op:
                row.update({name: cell(value) for name, value in ceiling_columns(
                    ceiling, sum(assigned), stats.restore.time_to_last_rank_s.median,
                    nnodes).items()})
    return rows
