"""`save`: each layout saved `warmup + iterations` times, each save a new version
(stampede.checkpoint.versions), timed by stampede.run.save_pattern (into files:
save_files; objects: save_objects).

Per save, untimed: rank 0 removes what earlier saves left unfinished, picks the version
and what its publish will release; every rank fills its shard in memory with the
version's content and hashes it; rank 0 records the version in the journal (its files,
temporary names, directories and hashes) before any byte of it is written. Then the start
barrier, the origin stamp, the timed save, the end-of-phase reduction and the verdict, as
in a restore (stampede.run.layout); rank 0 records the outcome: complete (published) or
invalid (left for the next save or clean to remove; the previous version stays published).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

from stampede import mpi
from stampede.backends import open_backend
from stampede.backends.base import Backend, missing_root, object_store
from stampede.buffers import AlignedBuffer
from stampede.checkpoint import versions
from stampede.checkpoint.content import ContentSource, content_label
from stampede.checkpoint.formats import safetensors_prefix
from stampede.checkpoint.lock import LOCK_NAME, TargetLock, writer_lock
from stampede.checkpoint.manifest import MANIFEST_NAME, layout_entry, read_manifest
from stampede.checkpoint.plan import Extent, bytes_per_rank, checkpoint_files, file_tensors
from stampede.checkpoint.prepare import save_space_needed
from stampede.checkpoint.save_plan import FileWrite, SavePlan, check_object_save, save_plan
from stampede.errors import CheckpointError, StampedeError, UsageError
from stampede.filesystems import StripeNote, stripe, stripe_in
from stampede.layouts import layout_of
from stampede.ops import OP_CODE
from stampede.results.model import ClientCounts, LayoutRun, RunContext, node_counts
from stampede.run import gather, mds_counts
from stampede.run.digests import new_digest
from stampede.run.file_system import AfterLayout, layouts_in_turn
from stampede.run.interrupt import Interrupts
from stampede.run.job import new_context
from stampede.run.layout import Phases, Tick, located, measured_rows, phase_totals, timed_phase
from stampede.run.outcome import MAX_MESSAGES, PhaseOutcome
from stampede.run.save_files import FileSave
from stampede.run.save_objects import ObjectSave, pointer_etag
from stampede.run.save_pattern import Save
from stampede.run.save_setup import SaveSetup
from stampede.run.verdict import iteration_name, judge
from stampede.run.where import Where
from stampede.spec import JobSpec
from stampede.sysinfo import meminfo_bytes
from stampede.units import format_bytes


def save_job(comm: mpi.Comm, spec: JobSpec, after_layout: AfterLayout | None = None,
             interrupts: Interrupts | None = None, tick: Tick | None = None,
             context: RunContext | None = None) -> tuple[RunContext, list[LayoutRun]]:
    """Every layout of the job saved in turn, each handed to `after_layout` as it
    completes; results complete on rank 0."""
    nranks = comm.Get_size()
    backend = mpi.collective(comm, "connecting to the target",
                             partial(open_backend, spec.target_path, spec.storage_options))
    if not backend.capabilities.saves:
        raise UsageError(f"target.path = {spec.target_path!r}: the {backend.name} backend has "
                         "no timed save yet", hint="save to a POSIX path or s3://")
    if object_store(backend) is not None:   # pure: before any request
        mpi.on_root(comm, "checking the save", partial(check_object_save, spec, nranks))
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    for layout in spec.layouts:   # --trace: refused before the target is touched
        gather.check_trace(comm, spec, save_plan(spec, layout, nranks, comm.Get_rank(),
                                                 versions.version_dir(layout, 0)))
    mpi.on_root(comm, "checking the target",   # lock held: commands.flags.job_world
                partial(open_target, spec, backend, nranks, hosts, writer_lock(spec.target_path)))
    run_context = context or new_context(comm, spec, backend, save=True)
    runs = layouts_in_turn(
        comm, backend, spec.target_path, spec.layouts,
        mds_counts.measured(comm, backend, lambda layout: save_layout(
            comm, spec, layout, backend, run_context.hosts, interrupts, tick)),
        partial(_saved_files, spec, backend, nranks), run_context, after_layout)
    return run_context, runs


def _saved_files(spec: JobSpec, backend: Backend, nranks: int, layout: str) -> list[Path]:
    """Rank 0, after a layout's saves: the files of its published version (none: no
    version was published), whose layout on the file system is read back."""
    journal = versions.read_journal(backend, spec.target_path)
    published = versions.published_version(backend, journal, layout)
    if published is None:
        return []
    root = versions.version_dir(layout, published)
    return [Path(spec.target_path) / relpath
            for relpath, _ in checkpoint_files(spec, layout, nranks, root)]


def open_target(spec: JobSpec, backend: Backend, nranks: int, hosts: list[str] | None,
                lock: TargetLock) -> None:
    """Rank 0, before anything is written, the target's lock held: the target is new,
    empty, or stampede's (a prepare's manifest or a save's journal); the versions this
    save keeps on disk at once fit; each node can hold its ranks' shards in memory.
    Creates the root and the journal; a refusal gives back what the lock made."""
    try:
        _check_target(spec, backend, nranks, hosts, lock.created_root)
    except StampedeError:      # refused, or the storage failed reading what is there
        lock.abandon()
        raise


def _check_target(spec: JobSpec, backend: Backend, nranks: int, hosts: list[str] | None,
                  created_root: bool) -> None:
    target = spec.target_path
    root = Path(target)
    files = backend.capabilities.has_directories
    local = backend.local_path("") is not None   # a directory here (else a server's: NFS)
    if local and root.is_symlink():
        raise CheckpointError(f"target.path = {target!r} is a symbolic link",
                              hint="give the real directory")
    if local and root.exists() and not root.is_dir():
        raise CheckpointError(f"target.path = {target!r} is not a directory")
    exists = root.exists() if local else True   # a bucket prefix: as good as its objects
    journal = versions.read_journal(backend, target) if exists else None
    marked = journal is not None or (exists and read_manifest(backend, target) is not None)
    if exists and not marked and [name for name in backend.names() if name != LOCK_NAME]:
        raise CheckpointError(
            f"target.path = {target!r} is not empty and holds nothing stampede wrote (no "
            f"{versions.JOURNAL_NAME} or {MANIFEST_NAME})",
            hint="give an empty or new directory")
    kept = {layout: versions.kept_bytes(journal, layout) for layout in spec.layouts}
    freed = {layout: versions.stale_bytes(backend, journal, layout) for layout in spec.layouts} \
        if journal is not None and files else {}
    space = save_space_needed(spec, nranks, kept, freed)
    if space.free_bytes is not None and not space.fits:
        raise CheckpointError(f"target.path = {target!r}: {space.describe()}",
                              hint="a smaller checkpoint.size or save.keep, or another target")
    _check_memory(spec, nranks, hosts or [])
    created_root = created_root or (files and missing_root(backend))
    try:
        backend.ensure_root()
    except OSError as error:
        raise CheckpointError(f"target.path = {target!r}: cannot create it "
                              f"({error.strerror or error})") from None
    if local and not os.access(target, os.W_OK | os.X_OK):
        raise CheckpointError(f"target.path = {target!r} is not writable")
    if journal is None:
        journal = versions.new_journal(created_root)
        versions.write_journal(backend, journal)


def _check_memory(spec: JobSpec, nranks: int, hosts: list[str]) -> None:
    """A save holds each rank's shard in memory (twice with save.mode = async), as a
    trainer does: refuse a job whose busiest node cannot hold them."""
    per_rank = bytes_per_rank(spec, nranks) * (2 if spec.save_mode == "async" else 1)
    _, per_node = node_counts(hosts) if hosts else (1, nranks)
    needed = per_rank * per_node
    available = meminfo_bytes("MemAvailable")
    if available is not None and needed > available * 0.9:
        raise UsageError(f"{spec.source}: save holds each rank's shard in memory"
                         f"{' twice (async)' if spec.save_mode == 'async' else ''}: "
                         f"{per_node} rank(s) on a node need {format_bytes(needed)}, over 90% "
                         f"of the {format_bytes(available)} this node has available",
                         hint="a smaller checkpoint.size, or fewer ranks per node")


# --- one layout -----------------------------------------------------------------------

@dataclass
class _Buffers:
    """What a rank holds for every save of one layout: its shard, and what it copies it to."""

    model: AlignedBuffer
    check: AlignedBuffer
    staging: AlignedBuffer | None
    content: ContentSource

    def close(self) -> None:
        for buffer in (self.model, self.check, self.staging):
            if buffer is not None:
                buffer.close()


def save_layout(comm: mpi.Comm, spec: JobSpec, layout: str, backend: Backend, hosts: tuple[str, ...],
                interrupts: Interrupts | None = None, tick: Tick | None = None) -> LayoutRun:
    """Every save of one layout; statistics complete on rank 0."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    first_plan = save_plan(spec, layout, nranks, rank, versions.version_dir(layout, 0))
    group = mpi.split(comm, first_plan.group, key=first_plan.member) \
        if layout_of(layout).stripes else None
    buffers = _Buffers(AlignedBuffer(first_plan.hold.length, populate=True),
                       AlignedBuffer(spec.block_bytes, populate=True),
                       AlignedBuffer(first_plan.hold.length, populate=True)
                       if spec.save_mode == "async" else None,
                       ContentSource(spec.block_bytes))
    phases, client_before = Phases(), gather.client_before(backend)
    where = Where() if spec.trace_limit else None   # --trace: kept over the versions
    try:
        for striped in mpi.collective(comm, f"making the {layout} series' directories",
                                  partial(_series_directories, spec, backend, layout, rank)):
            (phases.said if striped.applied else phases.notes).append(striped.text)
        for iteration in range(-spec.warmup, spec.iterations):
            try:
                setup, version = _version_setup(comm, spec, layout, backend, buffers, group)
            except StampedeError as error:   # a server gone between two saves: what the
                if iteration == -spec.warmup:   # saves before measured is archived (invalid)
                    raise
                phases.invalid_reason = f"{iteration_name(iteration, spec.warmup)}: {error}"
                # no phase of this one ran: the save before it is the evidence archived
                # (a warmup's samples are kept only as the failed iteration's)
                phases.failed_iteration = iteration - 1
                break
            setup.where = where
            try:
                outcome, published = _phase(comm, spec, setup, iteration, phases)
            finally:
                for buffer in setup.owned:
                    buffer.close()
            signalled = int(bool(interrupts and interrupts.received))
            totals = phase_totals(comm, spec, layout, outcome, 0, 0, signalled)
            if tick is not None:
                tick(layout, iteration, (time.perf_counter_ns() - phases.origins[iteration]) / 1e9)
            verdict = judge(totals, iteration, spec.warmup, phases.invalid_reason,
                            spec.max_error_fraction, spec.deadline_s, "save")
            name = iteration_name(iteration, spec.warmup)
            try:
                note = mpi.on_root(comm, f"recording {layout} v{version:06d}",
                                   partial(versions.record_outcome, backend, spec.target_path,
                                           spec.keep, layout, version, published,
                                           verdict.invalid_reason, name))
            except StampedeError as error:   # collective: every rank stops here together,
                # and what was measured is archived (invalid) before anything else is tried
                phases.invalid_reason = "; ".join(filter(None, (verdict.invalid_reason, f"{name}: {error}")))
                phases.failed_iteration = iteration
                break
            if note:
                phases.notes.append(note)
            phases.invalid_reason = verdict.invalid_reason
            if verdict.stop:
                phases.failed_iteration = iteration
                phases.interrupted = bool(totals.interrupted)
                break
    finally:
        buffers.close()
        if group is not None:
            mpi.free(group, comm)
    return _to_rank_zero(comm, spec, first_plan, hosts, phases,
                         gather.client_counts(comm, backend, client_before), where)


def _series_directories(spec: JobSpec, backend: Backend, layout: str, rank: int) -> list[StripeNote]:
    """Rank 0, untimed: saves/ and saves/LAYOUT, recorded in the journal when made here;
    target.stripe_* set on saves/LAYOUT at every save, on a mount or by the backend's own
    client (cephfs://) (the version directories the timed phase makes in it inherit them,
    and the files in those). Returns what the striping said (an object store: not done)."""
    if rank != 0:
        return []
    if backend.capabilities.has_directories:
        journal = versions.journal_of_save(backend, spec.target_path)
        made = journal.setdefault("directories", [])
        for directory in (versions.SAVES_DIR, versions.layout_dir(layout)):
            try:
                backend.mkdir(backend.path(directory))
            except FileExistsError:
                continue
            made.append(directory)
        versions.rewrite_journal(backend, spec.target_path, journal)
    count, size = spec.stripe_count, spec.stripe_size_bytes
    if not (count or size):
        return []
    series = versions.layout_dir(layout)
    local = backend.local_path(series)   # else a client's own striper (cephfs://), if any
    return [stripe(Path(local), count, size) if local else stripe_in(backend, series, count, size)]


PUBLISHED = OP_CODE["published"]


def _phase(comm: mpi.Comm, spec: JobSpec, setup: SaveSetup, iteration: int,
           phases: Phases) -> tuple[PhaseOutcome, bool]:
    steps: type[Save] = FileSave if setup.backend.capabilities.has_directories else ObjectSave
    with timed_phase(comm, spec, setup.backend, setup.plan.layout, iteration, phases) as origin:
        setup.deadline_ns = origin + int(spec.deadline_s * 1e9)
        first = len(phases.log)
        outcome = steps(setup, iteration, origin, phases.log).run()
    phases.messages.extend(outcome.messages[:MAX_MESSAGES - len(phases.messages)])
    published = any(row[1] == PUBLISHED and row[5] for row in phases.log[first:])
    return outcome, published


def _version_setup(comm: mpi.Comm, spec: JobSpec, layout: str, backend: Backend, buffers: _Buffers,
                   group: mpi.Comm | None) -> tuple[SaveSetup, int]:
    """Untimed: the next version, its plan, its content in memory and its hashes, recorded
    in the journal before the phase."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    version, releases, release_dirs = mpi.on_root(
        comm, f"starting a {layout} save", partial(_begin_version, spec, backend, layout, nranks))
    root = versions.version_dir(layout, version)
    plan = save_plan(spec, layout, nranks, rank, root)
    hashes, expected = _fill(spec, plan, buffers)
    slices = mpi.gather(comm, hashes)
    mpi.on_root(comm, f"recording {root} in the journal",
                partial(_record_version, spec, backend, layout, version, nranks,
                        [item for part in slices or [] for item in part]))
    headers, bases, owned = _headers(spec, plan, nranks)
    index = None
    if plan.index is not None:
        index_buffer = AlignedBuffer(spec.index_bytes)
        owned.append(index_buffer)
        extent = plan.index.extents[0]
        for offset, length in extent.blocks(spec.block_bytes):
            buffers.content.fill(index_buffer.view[offset:offset + length],
                                 content_label(extent.relpath, ""), offset)
        index = index_buffer.view
    mine = releases[rank::nranks]
    named = {*(f.relpath for f in plan.files), *(f.partial for f in plan.files),
             *plan.directories, *mine, *(release_dirs if rank == 0 else ()),
             *(name for f in filter(None, (plan.index,)) for name in (f.relpath, f.partial)),
             versions.layout_dir(layout), versions.pointer_path(layout)}
    files = backend.capabilities.has_directories   # else an object store: no directories to sync
    pointer = versions.pointer_path(layout)
    setup = SaveSetup(
        plan=plan, backend=backend, paths={relpath: backend.path(relpath) for relpath in named},
        model=buffers.model, check=buffers.check, block_bytes=spec.block_bytes, world=comm,
        group=group, staging=buffers.staging, direct=spec.cache == "direct",
        durable=spec.durability == "fsync", mkdir_every=spec.mkdir_by == "every",
        part_bytes=spec.part_bytes,
        validate=spec.validate, finite_dtype=spec.dtype if spec.validate == "finite" else "",
        expected=expected, headers=headers, bases=bases, index=index,
        pointer=pointer, pointer_bytes=versions.pointer_text(version),
        pointer_etag=pointer_etag(backend, pointer) if rank == 0 and not files else None,
        spine=_spine(plan, layout) if rank == 0 and files else (),
        releasing=bool(releases or release_dirs), releases=tuple(mine),
        release_dirs=tuple(release_dirs) if rank == 0 and files else (), owned=owned)
    return setup, version


def _fill(spec: JobSpec, plan: SavePlan,
          buffers: _Buffers) -> tuple[list[dict[str, object]], dict[Extent, str]]:
    """This version's content into the shard in memory, block by block as prepare writes
    it (a pure function of path and offset); the shard's hashes for the journal (replica 0
    of each shard: what a restore checks) and the validate hash of each extent written."""
    hold, model = plan.hold, buffers.model
    per_file = layout_of(plan.layout).workload_files
    pieces = [extent for file in plan.files for extent in file.extents] if per_file else [hold]
    for piece in pieces:
        label, start = content_label(piece.relpath, piece.tensor), piece.at(hold)
        for offset, length in piece.blocks(spec.block_bytes):
            place = start + offset - piece.offset
            buffers.content.fill(model.view[place:place + length], label, offset)
    records: list[dict[str, Any]] = []
    if per_file:   # one slice per file: a restore checks each
        return _file_records(spec, plan, model.view, pieces)
    if plan.member == 0:
        record = {"rank": plan.rank, "path": hold.relpath, "tensor": hold.tensor,
                  "offset": hold.offset, "length": hold.length}
        for algorithm in ("xxh3", "sha256"):
            if algorithm == "xxh3" or "sha256" in (spec.validate, spec.verify):
                digest = new_digest(algorithm)
                digest.update(model.view)
                record[algorithm] = digest.hexdigest()
        records.append(record)
    expected: dict[Extent, str] = {}
    if spec.validate in ("sha256", "xxh3"):
        for file in plan.files:
            for extent in file.extents:
                if extent == hold and records:
                    expected[extent] = records[0][spec.validate]
                    continue
                digest = new_digest(spec.validate)
                place = extent.at(hold)
                digest.update(model.view[place:place + extent.length])
                expected[extent] = digest.hexdigest()
    return records, expected


def _file_records(spec: JobSpec, plan: SavePlan, view: memoryview, pieces: list[Extent]
                  ) -> tuple[list[dict[str, object]], dict[Extent, str]]:
    """Layout mlperf: the journal's slice and the validate hash of every file written."""
    records, expected = [], {}
    for piece in pieces:
        start = piece.at(plan.hold)
        record: dict[str, Any] = {"rank": plan.rank, "path": piece.relpath, "tensor": "",
                                  "offset": piece.offset, "length": piece.length}
        for algorithm in ("xxh3", "sha256"):
            if algorithm == "xxh3" or "sha256" in (spec.validate, spec.verify):
                digest = new_digest(algorithm)
                digest.update(view[start:start + piece.length])
                record[algorithm] = digest.hexdigest()
        records.append(record)
        if spec.validate in ("sha256", "xxh3"):
            expected[piece] = record[spec.validate]
    return records, expected


def _headers(spec: JobSpec, plan: SavePlan,
             nranks: int) -> tuple[dict[str, memoryview], dict[str, dict[str, int]], list[AlignedBuffer]]:
    """The header the creator of each formatted file writes first (page-aligned, so it can
    go through O_DIRECT), and where each tensor starts in every file this rank writes."""
    headers: dict[str, memoryview] = {}
    bases: dict[str, dict[str, int]] = {}
    owned: list[AlignedBuffer] = []
    tensors = file_tensors(spec, plan.layout, nranks, plan.root) if plan.files else {}
    for file in plan.files:
        if spec.format == "raw":
            bases[file.relpath] = {"": 0}
            continue
        prefix, offsets = safetensors_prefix(tensors[file.relpath], spec.dtype)
        bases[file.relpath] = offsets
        if file.creates:
            buffer = AlignedBuffer(len(prefix))
            buffer.view[:] = prefix
            owned.append(buffer)
            headers[file.relpath] = buffer.view
    return headers, bases, owned


def _spine(plan: SavePlan, layout: str) -> tuple[str, ...]:
    """The directories whose entries the renames do not sync: those holding directories
    (the version's, fanout/) and the series' own, deepest first."""
    holders = {str(Path(directory).parent) for directory in plan.directories[1:]}
    return (*sorted(holders, key=lambda path: -path.count("/")), versions.layout_dir(layout))


# --- the journal, on rank 0 -------------------------------------------------------------

def _begin_version(spec: JobSpec, backend: Backend, layout: str,
                   nranks: int) -> tuple[int, list[str], list[str]]:
    """Remove what unfinished saves left, pick the next version, and say what its publish
    releases: (version, files, directories deepest first)."""
    journal = versions.journal_of_save(backend, spec.target_path)
    published = versions.published_version(backend, journal, layout)
    stale = versions.stale_versions(journal, layout, published)
    store = object_store(backend)
    for entry in stale:
        if store is None:
            versions.remove_version(backend, entry)
            continue
        # objects: one LIST, then a DELETE for each one still there (a release already
        # deleted the others), and the unfinished uploads of a killed save, which no LIST
        # shows
        there = set(backend.names(entry["dir"]))
        for relpath in versions.written_paths(entry):
            if relpath in there:
                backend.remove(relpath)
        store.discard_uploads(entry["dir"])
    versions.drop_entries(journal, layout, [entry["version"] for entry in stale])
    series = versions.series(journal, layout)
    version = series["next"]
    series["next"] = version + 1
    versions.rewrite_journal(backend, spec.target_path, journal)
    released = versions.released_versions(journal, layout, version, spec.keep)
    files = [record["path"] for entry in released for record in entry["files"]]
    directories = sorted({directory for entry in released for directory in entry["directories"]},
                         key=lambda path: (-path.count("/"), path))
    return version, files, directories


def _record_version(spec: JobSpec, backend: Backend, layout: str, version: int, nranks: int,
                    slices: list[dict[str, object]]) -> None:
    """The version's entry, state writing: every file (and temporary name) and directory
    it may leave, before its first byte is written."""
    from stampede.checkpoint.save_plan import version_directories

    journal = versions.journal_of_save(backend, spec.target_path)
    root = versions.version_dir(layout, version)
    files = list(file_tensors(spec, layout, nranks, root).items())
    sizes = [(relpath, sum(nbytes for _, nbytes in tensors)) for relpath, tensors in files]
    entry = layout_entry(spec, layout, nranks, bytes_per_rank(spec, nranks), sizes, slices,
                         complete=False)
    named = backend.capabilities.has_directories   # else objects, under their final names only
    entry.update(version=version, dir=root, state="writing", reason="",
                 partials=[FileWrite(relpath, True, ()).partial for relpath, _ in sizes
                           if named],
                 directories=list(version_directories(spec, layout, nranks, root))
                 if named else [],
                 mode=spec.save_mode, durability=spec.durability, validate=spec.validate)
    versions.series(journal, layout)["versions"].append(cast("versions.SavedVersion", entry))
    versions.rewrite_journal(backend, spec.target_path, journal)


def _to_rank_zero(comm: mpi.Comm, spec: JobSpec, plan: SavePlan, hosts: tuple[str, ...],
                  phases: Phases, client: ClientCounts, where: Where | None) -> LayoutRun:
    rows = measured_rows(phases.log, phases.failed_iteration)
    all_messages = mpi.gather(comm, phases.messages)
    all_notes = mpi.gather(comm, phases.notes)
    stats, trace = gather.gathered_stats(comm, spec, plan, plan.layout, rows, phases.origins,
                                         hosts, phases.failed_iteration, completion_op="save",
                                         where=located(where, phases.log, phases.failed_iteration))
    messages = [text for part in all_messages or [] for text in part]
    nranks = comm.Get_size()
    per_rank = bytes_per_rank(spec, nranks)
    total = sum(nbytes for _, nbytes in checkpoint_files(spec, plan.layout, nranks))
    return LayoutRun(layout=plan.layout, bytes_per_rank=per_rank, stats=stats,
                     messages=tuple(messages), invalid_reason=phases.invalid_reason,
                     client=client, bytes_total=total,
                     notes=tuple(dict.fromkeys(n for part in all_notes or [] for n in part)),
                     interrupted=phases.interrupted, iterations_done=phases.iterations_done,
                     phase="save", trace=trace, said=tuple(phases.said))

