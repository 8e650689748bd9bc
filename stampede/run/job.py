"""`run`: a job's layouts (or, for an existing checkpoint, its assign policies) one
after another on the same target, each measured by stampede.run.layout; what is the
same for all of them (the backend, the device, the run's context) is set up here once.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from stampede import mpi
from stampede.backends import backend_name_for, open_backend
from stampede.backends.base import Backend, rpc_prober
from stampede.checkpoint.plan import bytes_per_rank
from stampede.errors import UsageError
from stampede.results.model import LayoutRun, RunContext
from stampede.run import mds_counts
from stampede.run.file_system import AfterLayout, layouts_in_turn
from stampede.run.interrupt import Interrupts
from stampede.run.layout import Tick, plan_for, run_layout
from stampede.spec import JobSpec
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from stampede.existing.catalogue import Catalogue
    from stampede.run.devices import Device


def run_job(comm: mpi.Comm, spec: JobSpec, after_layout: AfterLayout | None = None,
            interrupts: Interrupts | None = None, tick: Tick | None = None,
            context: RunContext | None = None) -> tuple[RunContext, list[LayoutRun]]:
    """Every layout (or, for an existing checkpoint, every assign policy) of the job in
    turn, each handed to `after_layout` as it completes; a signal stops at the end of the
    iteration it arrives in, and no layout is started after it. Results are complete on
    rank 0 only. `context`: the run this is part of (a cycle's restore half)."""
    nranks = comm.Get_size()
    catalogue: Catalogue | None = None
    if spec.checkpoint_source == "existing":
        catalogue = mpi.on_root(comm, "reading the checkpoint's headers",
                                partial(scan_existing, spec))
        strategies, root = spec.assign, catalogue.root
        entries: dict[str, dict[str, object]] = {policy: {} for policy in strategies}
    else:
        entries = mpi.on_root(comm, "checking the checkpoint",
                              partial(_prepared_entries, spec, nranks))
        strategies, root = spec.layouts, spec.target_path
    backend = mpi.collective(comm, "connecting to the target",
                             partial(open_backend, root, spec.storage_options))
    mpi.collective(comm, "checking limits",
                   partial(_check_open_files, spec, catalogue, strategies, nranks, comm.Get_rank()))
    device = None
    if spec.h2d != "none":
        from stampede.run.devices import open_device
        local_rank = mpi.node_rank(comm)
        device = mpi.collective(comm, "opening the device",
                                partial(open_device, spec.h2d.split("-")[0], local_rank))
    context = context or new_context(comm, spec, backend, device, catalogue)
    if spec.ceiling and context.ceiling is None:
        context = _with_ceiling(comm, spec, context, catalogue, strategies, entries)
    try:
        hosts = context.hosts
        runs = layouts_in_turn(
            comm, backend, spec.target_path, strategies,
            mds_counts.measured(comm, backend, lambda layout: run_layout(
                comm, spec, layout, backend, entries[layout], device, hosts, catalogue,
                interrupts, tick)),
            partial(_restored_files, spec, nranks, catalogue, entries), context, after_layout)
    finally:
        if device is not None:
            device.close()
    return context, runs


def _with_ceiling(comm: mpi.Comm, spec: JobSpec, context: RunContext,
                  catalogue: Catalogue | None, strategies: tuple[str, ...],
                  entries: dict[str, dict[str, object]]) -> RunContext:
    """run.ceiling: every node's raw-read ceiling, before the first layout, on the files
    that layout reads (an existing checkpoint's files): the node's own share of them."""
    from dataclasses import replace

    from stampede.run.ceiling import measure

    def files() -> list[tuple[str, int]]:
        paths = _restored_files(spec, comm.Get_size(), catalogue, entries, strategies[0])
        return [(str(path), path.stat().st_size) for path in paths]

    ceiling = measure(comm, mpi.on_root(comm, "listing the ceiling's files", files))
    return replace(context, ceiling=ceiling)


def _run_stamps() -> tuple[str, str]:
    """Rank 0: the run's id and timestamp (the archive's rows, rank 0's alone to import)."""
    from stampede.results.rows import new_run_id, now_stamp

    return new_run_id(), now_stamp()


def new_context(comm: mpi.Comm, spec: JobSpec, backend: Backend, device: Device | None = None,
                catalogue: Catalogue | None = None, save: bool = False) -> RunContext:
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    labels = mpi.gather(comm, device.label if device is not None else "")
    run_id, timestamp = mpi.bcast(comm, _run_stamps() if comm.Get_rank() == 0 else ("", ""))
    storage: dict[str, object] = {}
    fs_type = ""   # rank 0's, as the hosts: the run's facts are complete there only
    if comm.Get_rank() == 0:
        fs_type, storage = backend.fs_type(), dict(backend.describe())
        prober = rpc_prober(backend)   # NFS: what each op costs on the wire
        if prober is not None:
            storage["rpcs_per_op"] = _probed(prober.rpc_probe, spec, comm.Get_size(), catalogue, save)
    return RunContext(run_id=run_id, timestamp=timestamp,
                      nranks=comm.Get_size(), hosts=tuple(hosts or ()),
                      backend=backend_name_for(spec.target_path), fs_type=fs_type,
                      mpi_library=mpi.library_version(comm),
                      device=" ".join(sorted(set(labels or ()))), storage=storage,
                      checkpoint_format=catalogue.format if catalogue else "")


def _restored_files(spec: JobSpec, nranks: int, catalogue: Catalogue | None,
                    entries: dict[str, dict[str, object]], layout: str) -> list[Path]:
    """Rank 0: the files a layout read (a saved version's, the prepared checkpoint's, or
    an existing checkpoint's), whose layout on the file system is read back."""
    if catalogue is not None:
        return [Path(catalogue.root) / relpath for relpath, _ in catalogue.files]
    from stampede.checkpoint.plan import checkpoint_files

    root = str(entries[layout].get("root", ""))
    return [Path(spec.target_path) / relpath
            for relpath, _ in checkpoint_files(spec, layout, nranks, root)]


def _probed(probe: Callable[[str | None, int, bool], dict[str, object]], spec: JobSpec,
            nranks: int, catalogue: Catalogue | None, save: bool) -> dict[str, object]:
    """Rank 0, untimed, before the timed phase: the backend's RPCs per op, for the save's
    ops or the restore's on the first checkpoint file (a failed probe said, not fatal)."""
    from stampede.checkpoint.plan import checkpoint_files

    relpath = None
    if not save:
        files = [name for name, _ in catalogue.files] if catalogue else [
            name for layout in spec.layouts for name, _ in checkpoint_files(spec, layout, nranks)]
        relpath = files[0] if files else None
    try:
        return dict(probe(relpath, spec.block_bytes, save))
    except OSError as error:
        return {"how": f"not counted: {error}"}


def scan_existing(spec: JobSpec) -> Catalogue:
    """Rank 0: the existing checkpoint's headers (a POSIX path, or an object store's URL
    through the target's storage options; HDF5 only on POSIX), and a check that nothing
    this run writes lands next to it."""
    from stampede.existing.scan import scan

    catalogue = scan(spec.target_path, spec.storage_options)
    root = catalogue.root.removeprefix("file://")
    if not capabilities_for(root).local_files:   # the archive is a local path: never in a store
        return catalogue
    archive = Path(spec.archive_path).resolve()
    if Path(root).resolve() in archive.parents:
        raise UsageError(f"archive.path = {spec.archive_path!r} lies inside the checkpoint "
                         f"{catalogue.root}: stampede never writes next to a checkpoint it "
                         "did not make", hint="--set archive.path=results/{job}.csv")
    return catalogue


def _prepared_entries(spec: JobSpec, nranks: int) -> dict[str, dict[str, object]]:
    """Rank 0: the entry of every layout, checked against the job: the layout's published
    save when there is one (run.restore = auto or saved; its "root" is the version's
    directory), else the prepared checkpoint's manifest entry."""
    from stampede.checkpoint import versions
    from stampede.checkpoint.manifest import check_entry, prepared_layout, read_manifest
    from stampede.errors import CheckpointError

    backend = open_backend(spec.target_path, spec.storage_options)
    per_rank = bytes_per_rank(spec, nranks)
    # K copies are prepare's alone (a save writes one): auto restores them
    journal = versions.read_journal(backend, spec.target_path) \
        if spec.restore_from != "prepared" and spec.copies == 1 else None
    manifest: dict[str, object] | None = None
    entries = {}
    for layout in spec.layouts:
        saved = versions.published_version(backend, journal, layout)
        if saved is not None and journal is not None:
            entry = dict(versions.entry_of(journal, layout, saved))
            check_entry(entry, spec, f"{spec.target_path}: layout {layout!r} v{saved:06d} was "
                        "saved", nranks, per_rank, spec.command("save", nranks))
            entries[layout] = {**entry, "root": entry["dir"]}
            continue
        if spec.restore_from == "saved":
            raise CheckpointError(f"{spec.target_path}: layout {layout!r} has no published "
                                  "save here (run.restore = \"saved\")",
                                  hint=f"run `{spec.command('save', nranks)}` first")
        manifest = manifest or read_manifest(backend, spec.target_path)
        if manifest is None and journal is not None:   # a target of saves, not of prepare's
            saved_layouts = [name for name in journal["layouts"]
                             if versions.published_version(backend, journal, name) is not None]
            raise CheckpointError(
                f"{spec.target_path}: layout {layout!r} has no published save here, and this "
                f"target holds saves (of {', '.join(saved_layouts) or 'none published'}), not "
                "a prepared checkpoint (prepare refuses a target of saves)",
                hint=f"`{spec.command('save', nranks)} --set checkpoint.layout={layout}` first, "
                     "or restore only the layouts saved here (--set "
                     + (f"checkpoint.layout={saved_layouts[0]})" if len(saved_layouts) == 1 else
                        f"'checkpoint.layout={json.dumps(saved_layouts)}')"))
        entries[layout] = prepared_layout(manifest, spec, layout, nranks, per_rank)
    return entries


def _check_open_files(spec: JobSpec, catalogue: Catalogue | None, layouts: tuple[str, ...],
                      nranks: int, rank: int) -> None:
    """An open storm keeps open_count handles per file open at once (file by file with a
    close, one file's: they are closed before the next file's opens): refuse a job that
    would hit the open-files limit mid-run rather than archive it half done."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return
    files = max(len(plan_for(spec, catalogue, layout, nranks, rank).files) for layout in layouts)
    needed = spec.open_count * (1 if spec.order == "file" and "close" in spec.ops else files)
    # Python, MPI and the launcher hold descriptors of their own; keep a margin for them.
    if needed > soft_limit - 64:
        raise UsageError(f"{spec.source}: pattern.open_count = {spec.open_count} keeps {needed} "
                         f"files open at once, over this process's open-files limit "
                         f"({soft_limit}, less 64 for Python and MPI)",
                         hint="lower open_count, or raise the limit (ulimit -n)")
