"""`run`: the MPI choreography around the timed pattern, one layout after another.

Per iteration: evict (cold) -> polite barrier + Barrier -> origin stamp -> pattern ->
polite allreduce of (errors, timed out). All ranks take the same decisions from the same
reduced values, so a failing rank never leaves the others in a collective. Samples reach
rank 0 once per layout with one Gatherv.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stampede import mpi
from stampede.backends import backend_name_for, open_backend
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.manifest import prepared_layout, read_manifest
from stampede.checkpoint.plan import RankPlan, bytes_per_rank, plan_rank, stripes
from stampede.errors import UsageError
from stampede.results.archive import new_run_id, node_counts
from stampede.results.samples import ITER, OP, OP_CODE, RANK
from stampede.run.clock import on_one_axis, origins_array
from stampede.run.pattern import MAX_MESSAGES, RankSetup, new_digest, run_pattern
from stampede.spec import JobSpec

if TYPE_CHECKING:
    from stampede.existing.catalogue import Catalogue
    from stampede.results.stats import LayoutStats

# How long past the deadline a rank waits for the others before aborting the whole job:
# a rank stuck inside one syscall (a hung NFS server) cannot check its own deadline.
ABORT_GRACE_S = 10.0


@dataclass(frozen=True)
class RunContext:
    """Facts about one run, the same for all its layouts (complete on rank 0)."""

    run_id: str
    timestamp: str
    nranks: int
    hosts: tuple[str, ...]       # host of each rank
    backend: str
    fs_type: str
    mpi_library: str
    device: str = ""             # run.h2d: the devices the bytes went on to
    storage: dict[str, Any] = field(default_factory=dict)   # backend settings, stripes
    checkpoint_format: str = ""  # an existing checkpoint's format, as found

    @property
    def nnodes(self) -> int:
        return node_counts(self.hosts)[0]

    @property
    def ranks_per_node(self) -> int:
        return node_counts(self.hosts)[1]


@dataclass(frozen=True)
class LayoutRun:
    """One layout's outcome on rank 0."""

    layout: str
    bytes_per_rank: int
    stats: LayoutStats | None    # None on ranks other than 0
    messages: tuple[str, ...]
    invalid_reason: str          # empty when valid
    retries: dict[str, int] = field(default_factory=dict)   # op -> requests retried
    resident_fraction: tuple[float, ...] = ()   # per measured iteration, cache residency
    bytes_total: int = 0         # all ranks' bytes, when they differ by rank (existing)
    digests: tuple[dict[str, Any], ...] = ()   # existing checkpoints: what each rank read
    notes: tuple[str, ...] = ()  # warnings from the ranks (a drop_caches refused, ...)


def new_context(comm: Any, spec: JobSpec, backend: Backend, device: Any = None,
                catalogue: Catalogue | None = None) -> RunContext:
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    labels = mpi.gather(comm, device.label if device is not None else "")
    stamp = datetime.now(UTC)
    run_id = mpi.bcast(comm, new_run_id() if comm.Get_rank() == 0 else "")
    storage: dict[str, Any] = {}
    if comm.Get_rank() == 0:
        describe = getattr(backend, "describe", None)
        storage = dict(describe()) if describe is not None else {}
        if backend.fs_type() == "lustre":
            from stampede.checkpoint.lustre import stripe_layout
            from stampede.checkpoint.plan import checkpoint_files
            root = catalogue.root if catalogue else spec.target_path
            files = [relpath for relpath, _ in catalogue.files] if catalogue else [
                relpath for layout in spec.layouts
                for relpath, _ in checkpoint_files(spec, layout, comm.Get_size())]
            storage["lfs_getstripe"] = stripe_layout(
                [Path(root) / relpath for relpath in dict.fromkeys(files)][:4])
    return RunContext(run_id=run_id, timestamp=stamp.isoformat(timespec="seconds"),
                      nranks=comm.Get_size(), hosts=tuple(hosts or ()),
                      backend=backend_name_for(spec.target_path), fs_type=backend.fs_type(),
                      mpi_library=mpi.library_version(comm),
                      device=" ".join(sorted(set(labels or ()))), storage=storage,
                      checkpoint_format=catalogue.format if catalogue else "")


def run_job(comm: Any, spec: JobSpec) -> tuple[RunContext, list[LayoutRun]]:
    """Every layout (or, for an existing checkpoint, every assign policy) of the job in
    turn; results are complete on rank 0 only."""
    nranks = comm.Get_size()
    catalogue: Catalogue | None = None
    if spec.checkpoint_source == "existing":
        catalogue = mpi.on_root(comm, "reading the checkpoint's headers",
                                partial(_scan_existing, spec))
        strategies, root = spec.assign, catalogue.root
        entries: dict[str, dict[str, Any]] = {policy: {} for policy in strategies}
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
    context = new_context(comm, spec, backend, device, catalogue)
    try:
        runs = [run_layout(comm, spec, layout, backend, entries[layout], device, context.hosts,
                           catalogue)
                for layout in strategies]
    finally:
        if device is not None:
            device.close()
    return context, runs


def plan_for(spec: JobSpec, catalogue: Catalogue | None, layout: str, nranks: int,
             rank: int) -> RankPlan:
    """A rank's plan: a stampede layout, or a policy over an existing checkpoint."""
    if catalogue is not None:
        from stampede.existing.catalogue import plan_existing
        return plan_existing(catalogue, spec, layout, nranks, rank)
    return plan_rank(spec, layout, nranks, rank)


def _scan_existing(spec: JobSpec) -> Catalogue:
    """Rank 0: the existing checkpoint's headers (a POSIX path, or an object store's URL
    through the target's storage options; HDF5 only on POSIX), and a check that nothing
    this run writes lands next to it."""
    from stampede.existing.catalogue import scan

    catalogue = scan(spec.target_path, spec.storage_options)
    root = catalogue.root.removeprefix("file://")
    if "://" in root:   # the archive is a local path: never inside an object store
        return catalogue
    archive = Path(spec.archive_path).resolve()
    if Path(root).resolve() in archive.parents:
        raise UsageError(f"archive.path = {spec.archive_path!r} lies inside the checkpoint "
                         f"{catalogue.root}: stampede never writes next to a checkpoint it "
                         "did not make", hint="--set archive.path=results/{job}.csv")
    return catalogue


def _setup(comm: Any, spec: JobSpec, plan: RankPlan, backend: Backend, entry: dict[str, Any],
           buffer: AlignedBuffer, device: Any, catalogue: Catalogue | None) -> RankSetup:
    """Untimed, once per layout: paths, the exchange group, expected hashes."""
    layout = plan.layout
    named = [*plan.files, *filter(None, (plan.index_file, plan.list_dir))]
    paths = {relpath: backend.path(relpath) for relpath in named}
    group, leads = None, True
    if plan.exchange:  # collective: every rank of the layout splits
        by_node = layout == "broadcast" and spec.broadcast_group == "node"
        # ordered by replica: member i of a striped group reads stripe i (with rank_shift
        # the replica order is not the world order)
        group = mpi.split(comm, plan.group, by_node=by_node, key=plan.member)
        leads = not plan.leader_reads or group.Get_rank() == 0
    expected = None
    if spec.verify != "none" and catalogue is None:
        wanted = {(e.relpath, e.tensor, e.offset) for e in (*plan.extents, plan.hold)}
        expected = {key: s[spec.verify] for s in entry["slices"]
                    if (key := (s["path"], s.get("tensor", ""), s["offset"])) in wanted}
    if spec.verify != "none":   # the hash module's import is not part of a restore
        new_digest(spec.verify)
    device_buffer = None
    if device is not None:
        device_buffer = device.device_buffer(plan.hold.length)
        if spec.h2d == "cuda-pinned":  # in place, untimed: the read buffer is page-locked
            mpi.collective(comm, "page-locking the read buffer", partial(device.pin, buffer))
    return RankSetup(plan=plan, backend=backend, paths=paths, buffer=buffer,
                     direct=spec.cache == "direct", leads=leads, group=group, world=comm,
                     stripes=stripes(spec, plan.hold) if plan.exchange == "allgather" else (),
                     format=_format(spec, catalogue), verify=spec.verify, expected=expected,
                     finite_dtype=spec.dtype if spec.check_finite else "",
                     tensor_dtypes=_tensor_dtypes(spec, catalogue),
                     index_parser=mpi.collective(comm, "loading the index parser",
                                                 partial(_index_parser, catalogue)),
                     tensors_of_file={relpath: tuple(e.tensor for e in plan.extents
                                                     if e.relpath == relpath)
                                      for relpath in plan.files},
                     record_digests=catalogue is not None,
                     content_block_bytes=int(entry.get("content_block_bytes", 0)),
                     device=device, device_buffer=device_buffer)


def _format(spec: JobSpec, catalogue: Catalogue | None) -> str:
    """How the files are read: DCP's byte ranges are raw; the others have headers."""
    if catalogue is None:
        return spec.format
    return "raw" if catalogue.format == "dcp" else catalogue.format


def _index_parser(catalogue: Catalogue | None) -> Any:
    if catalogue is None:
        return None
    from stampede.existing.catalogue import index_parser
    return index_parser(catalogue)


def _tensor_dtypes(spec: JobSpec, catalogue: Catalogue | None) -> dict[str, str] | None:
    """Existing checkpoints: run.check_finite checks each float tensor as its own dtype."""
    if catalogue is None or not spec.check_finite:
        return None
    from stampede.existing.catalogue import finite_dtypes
    return finite_dtypes(catalogue)


def jitter_s(spec: JobSpec, rank: int, iteration: int) -> float:
    """This rank's start delay in this iteration: reproducible from run.seed."""
    if spec.jitter == "none":
        return 0.0
    distribution, _, scale = spec.jitter.partition(":")
    generator = np.random.default_rng([spec.seed, rank, iteration + 2**20])
    if distribution == "uniform":
        return float(generator.uniform(0.0, float(scale)))
    return float(generator.exponential(float(scale)))


def run_layout(comm: Any, spec: JobSpec, layout: str, backend: Backend,
               entry: dict[str, Any], device: Any, hosts: tuple[str, ...],
               catalogue: Catalogue | None = None) -> LayoutRun:
    """One layout, every iteration; the statistics are complete on rank 0, whose `hosts`
    (host of each rank) put the ranks' stamps on one time axis."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    plan = plan_for(spec, catalogue, layout, nranks, rank)
    # Layouts that exchange hold the whole shard in memory; the others reuse one block.
    buffer_bytes = plan.hold.length if plan.exchange else spec.block_bytes
    log: list[tuple[int, int, int, int, int, int]] = []
    origins: dict[int, int] = {}
    messages: list[str] = []
    invalid_reason = ""
    failed_iteration = None
    retries_before = dict(getattr(backend, "retries", {}))
    digests: list[dict[str, Any]] = []
    notes: list[str] = []        # not errors: what the reader of the numbers must know
    if catalogue is not None and catalogue.format == "dcp" and spec.check_finite and rank == 0:
        notes.append("run.check_finite: DCP items are torch-serialised blobs, not checked")
    drops_caches = spec.drop_caches and mpi.node_rank(comm) == 0
    resident: list[float] = []
    with AlignedBuffer(buffer_bytes, populate=True) as buffer:  # no page fault in a timed read
        setup = _setup(comm, spec, plan, backend, entry, buffer, device, catalogue)
        for iteration in range(-spec.warmup, spec.iterations):
            cached = asked = 0
            if spec.cache == "cold":
                _evict(setup, messages)
                # Only where the pages were just evicted: asking opens each file, and on NFS
                # an open revalidates attributes, which would warm a warm run's timed stats.
                cached, asked = _residency(setup, notes)
                if spec.drop_caches:
                    # Last, once no rank opens a file again before the phase: the drop also
                    # takes the dentries and inodes those opens brought back.
                    mpi.barrier(comm)
                    if drops_caches:
                        _drop_caches(notes)
            delay_s = jitter_s(spec, rank, iteration)
            if not mpi.barrier(comm, timeout_s=spec.deadline_s + ABORT_GRACE_S):
                mpi.abort(comm, f"{layout}: other ranks did not reach the start of iteration "
                                f"{iteration} within {spec.deadline_s + ABORT_GRACE_S:g} s")
            origin = time.perf_counter_ns()
            origins[iteration] = origin
            outcome = run_pattern(setup, iteration, origin, origin + int(spec.deadline_s * 1e9),
                                  delay_s, log)
            messages.extend(outcome.messages[:MAX_MESSAGES - len(messages)])
            if iteration == 0:
                digests = outcome.digests
            totals = mpi.allreduce_sum(comm, np.array([outcome.errors, outcome.ops,
                                                       outcome.timed_out, outcome.incomplete,
                                                       outcome.corrupt, cached, asked]),
                                       timeout_s=spec.deadline_s + ABORT_GRACE_S)
            if totals is None:
                mpi.abort(comm, f"{layout}: other ranks still busy {ABORT_GRACE_S:g} s past "
                                f"the {spec.deadline_s:g} s deadline")
                raise AssertionError("unreachable")
            errors, ops, timed_out, incomplete, corrupt, cached, asked = (
                int(value) for value in totals)
            if iteration >= 0 and asked:
                resident.append(cached / asked)
            if corrupt and "differ" not in invalid_reason:
                # Never tolerated, whatever max_error_fraction says: a restore of wrong
                # bytes is not a restore.
                invalid_reason = "; ".join(filter(None, (
                    invalid_reason, f"{corrupt} rank(s) read bytes that differ from the "
                                    f"checkpoint in iteration {iteration} (run.verify / "
                                    "check_finite)")))
            if incomplete and not invalid_reason:
                # max_error_fraction tolerates failed ops, never missing bytes: measuring
                # goes on, but the layout is not a valid restore.
                invalid_reason = (f"{incomplete} rank(s) did not hold all their bytes in "
                                  f"iteration {iteration}")
            # Every rank holds the same sums, so every rank takes the same decision.
            if timed_out or errors > spec.max_error_fraction * ops:
                failed_iteration = iteration
                what = "warmup iteration" if iteration < 0 else "iteration"
                stopped = (
                    f"deadline of {spec.deadline_s:g} s reached in {what} {iteration} on "
                    f"{timed_out} rank(s)" if timed_out else
                    f"{errors} of {ops} ops failed in {what} {iteration} (run.max_error_fraction "
                    f"= {spec.max_error_fraction:g})")
                invalid_reason = "; ".join(filter(None, (stopped, invalid_reason)))
                break
        if setup.group is not None:
            mpi.free(setup.group, comm)
        if device is not None:
            device.unpin(buffer)
    rows = _measured(log, failed_iteration)
    retries = _retries(comm, backend, retries_before)
    all_messages = mpi.gather(comm, messages)
    all_digests = mpi.gather(comm, digests)
    all_notes = mpi.gather(comm, notes)
    shares = mpi.gather(comm, sum(extent.length for extent in plan.extents))
    if _histogram_mode(comm, spec, plan):
        stats = _reduced_stats(comm, layout, rows, origins, failed_iteration)
    else:
        stats = _exact_stats(comm, layout, rows, origins, hosts)
    if all_messages is not None:
        messages = [text for part in all_messages for text in part]
    # An existing checkpoint's ranks restore different amounts: the row's bytes per rank
    # is the largest share (whose rank the time to last rank most likely belongs to).
    per_rank = max(shares or [0]) if catalogue is not None else bytes_per_rank(spec, nranks)
    return LayoutRun(layout=layout, bytes_per_rank=per_rank,
                     stats=stats, messages=tuple(messages),
                     invalid_reason=invalid_reason, retries=retries,
                     resident_fraction=tuple(resident),
                     bytes_total=sum(shares or [0]) if catalogue is not None else 0,
                     notes=tuple(dict.fromkeys(n for part in all_notes or [] for n in part)),
                     digests=tuple(d for part in all_digests or [] for d in part))


def _retries(comm: Any, backend: Backend, before: dict[str, int]) -> dict[str, int]:
    """Requests the backend's client retried in this layout, per op, summed over ranks
    (object stores: throttling and timeouts show up here before they become errors)."""
    from stampede.results.samples import STORAGE_OPS

    now = getattr(backend, "retries", {})
    mine = np.array([now.get(op, 0) - before.get(op, 0) for op in STORAGE_OPS])
    total = mpi.allreduce_sum(comm, mine)
    if total is None:
        return {}
    return {op: int(count) for op, count in zip(STORAGE_OPS, total, strict=True) if count}


def _histogram_mode(comm: Any, spec: JobSpec, plan: Any) -> bool:
    """run.samples, with auto deciding from the samples this layout will produce on all
    ranks together: collectively, since ranks can plan very different work (an existing
    checkpoint's files) and the two modes gather with different collectives."""
    if spec.samples != "auto":
        return spec.samples == "histogram"
    from stampede.results.histogram import AUTO_SAMPLES
    mine = (sum(plan.op_counts().values()) + 4) * spec.iterations  # + restore, verify, ...
    total = mpi.allreduce_sum(comm, np.array([mine]))
    return total is not None and int(total[0]) > AUTO_SAMPLES


def _exact_stats(comm: Any, layout: str, rows: np.ndarray, origins: dict[int, int],
                 hosts: tuple[str, ...]) -> LayoutStats | None:
    """Every sample to rank 0 (one Gatherv), put on one axis there."""
    gathered = mpi.gather_rows(comm, rows)
    gathered_origins = mpi.gather_rows(comm, origins_array(origins))
    if gathered is None or gathered_origins is None:
        return None
    on_axis = on_one_axis(gathered, gathered_origins, hosts, OP_CODE["restore"])
    ranked = [np.column_stack([part, np.full(len(part), r, dtype=np.int64)])
              for r, part in enumerate(on_axis)]
    from stampede.results.stats import layout_stats  # rank 0 only: workers never import it
    return layout_stats(layout, np.concatenate(ranked), comm.Get_size())


def _reduced_stats(comm: Any, layout: str, rows: np.ndarray, origins: dict[int, int],
                   failed_iteration: int | None) -> LayoutStats | None:
    """Histogram mode (stampede.results.histogram): fixed-size reductions, restores and timelines whole."""
    from stampede.results import histogram as histo
    from stampede.results.stats import layout_stats_reduced, timeline

    restore = OP_CODE["restore"]
    on_axis = histo.to_node_axis(comm, rows, origins, restore)
    iterations = tuple(i for i in sorted(origins) if i >= 0 or i == failed_iteration)
    reduced = histo.reduce(comm, histo.summarize(on_axis, iterations), iterations)
    ranked = np.column_stack([on_axis, np.full(len(on_axis), comm.Get_rank(), dtype=np.int64)])
    restores = mpi.gather_rows(comm, ranked[ranked[:, OP] == restore])
    timelines = mpi.gather(comm, timeline(ranked))
    if reduced is None or restores is None or timelines is None:
        return None
    return layout_stats_reduced(layout, reduced, np.concatenate(restores),
                                tuple(row for part in timelines for row in part), comm.Get_size())


def _prepared_entries(spec: JobSpec, nranks: int) -> dict[str, dict[str, Any]]:
    """Rank 0: the manifest's entry of every layout, checked against the job."""
    backend = open_backend(spec.target_path, spec.storage_options)
    manifest = read_manifest(backend, spec.target_path)
    per_rank = bytes_per_rank(spec, nranks)
    return {layout: prepared_layout(manifest, spec, layout, nranks, per_rank)
            for layout in spec.layouts}


def _check_open_files(spec: JobSpec, catalogue: Catalogue | None, layouts: tuple[str, ...],
                      nranks: int, rank: int) -> None:
    """An open storm keeps open_count handles per file open at once: refuse a job that
    would hit the open-files limit mid-run rather than archive it half done."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return
    files = max(len(plan_for(spec, catalogue, layout, nranks, rank).files) for layout in layouts)
    needed = spec.open_count * files
    # Python, MPI and the launcher hold descriptors of their own; keep a margin for them.
    if needed > soft_limit - 64:
        raise UsageError(f"{spec.source}: pattern.open_count = {spec.open_count} keeps {needed} "
                         f"files open at once, over this process's open-files limit "
                         f"({soft_limit}, less 64 for Python and MPI)",
                         hint="lower open_count, or raise the limit (ulimit -n)")


def _ranges(setup: RankSetup) -> list[tuple[str, int, int]]:
    """(relpath, offset, length) this rank reads from storage in a phase; length 0 = to
    the end of the file. A formatted file is taken whole: its header is read too, and
    where its tensors lie is only known from it."""
    plan = setup.plan
    reads = plan.extents if setup.leads else ()
    ranges = [(e.relpath, e.offset, e.length) if not e.tensor else (e.relpath, 0, 0)
              for e in reads]
    if plan.index_file:
        ranges.append((plan.index_file, 0, 0))
    return list(dict.fromkeys(ranges))


def _residency(setup: RankSetup, notes: list[str]) -> tuple[int, int]:
    """Untimed, after a cold eviction: (bytes in the page cache, bytes this rank will
    read) as mincore sees them; (0, 0) where there is no page cache to ask (object stores)."""
    if setup.backend.name != "posix":
        return 0, 0
    from stampede.run.residency import resident_bytes

    cached = asked = 0
    for relpath, offset, length in _ranges(setup):
        try:
            in_cache, wanted = resident_bytes(setup.paths[relpath], offset, length)
        except OSError as error:
            if len(notes) < MAX_MESSAGES:
                notes.append(f"rank {setup.plan.rank}: cache residency of {relpath} not "
                             f"measured: {os.strerror(error.errno or 0)}")
            continue
        cached, asked = cached + in_cache, asked + wanted
    return cached, asked


DROP_CACHES = "/proc/sys/vm/drop_caches"


def _drop_caches(notes: list[str]) -> None:
    """Untimed, one rank per node: write back, then drop the whole page cache (root only)."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as stream:
            stream.write("3\n")
    except OSError as error:
        note = (f"run.drop_caches: cannot write {DROP_CACHES} ({error.strerror}); "
                "pages were evicted per file only")
        if note not in notes:
            notes.append(note)


def _evict(setup: RankSetup, messages: list[str]) -> None:
    """Untimed: drop the ranges this rank reads from the page cache before the phase
    (a shared index too, but that one is read by every rank: it returns warm for all but
    the first)."""
    plan = setup.plan
    for relpath, offset, length in _ranges(setup):
        try:
            setup.backend.evict(setup.paths[relpath], offset, length)
        except OSError as error:
            if len(messages) < MAX_MESSAGES:
                messages.append(f"rank {plan.rank}: evict {relpath}: "
                                f"{os.strerror(error.errno or 0)}")


def _measured(log: list[tuple[int, int, int, int, int, int]],
              failed_iteration: int | None) -> np.ndarray:
    """Measured iterations with absolute stamps (rank 0 puts them on one axis).

    Warmup is dropped, except a warmup iteration that failed: its samples are the evidence
    the invalid run is archived with.
    """
    rows = np.array(log, dtype=np.int64).reshape(-1, 6)
    rows = rows[(rows[:, ITER] >= 0) | (rows[:, ITER] == failed_iteration)]
    assert rows.shape[1] == RANK  # the rank column is appended on rank 0
    return rows
