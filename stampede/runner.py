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
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import numpy as np

from stampede import mpi
from stampede.backends import backend_name_for, open_backend
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.errors import UsageError
from stampede.manifest import prepared_layout, read_manifest
from stampede.pattern import MAX_MESSAGES, run_pattern
from stampede.plan import bytes_per_rank, plan_rank
from stampede.samples import ITER, RANK, START, STOP
from stampede.spec import JobSpec
from stampede.stats import LayoutStats, layout_stats

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

    @property
    def nnodes(self) -> int:
        return len(set(self.hosts))

    @property
    def ranks_per_node(self) -> int:
        return max(self.hosts.count(host) for host in set(self.hosts))


@dataclass(frozen=True)
class LayoutRun:
    """One layout's outcome on rank 0."""

    layout: str
    bytes_per_rank: int
    stats: LayoutStats | None    # None on ranks other than 0
    messages: tuple[str, ...]
    invalid_reason: str          # empty when valid


def new_context(comm: Any, spec: JobSpec, backend: Backend) -> RunContext:
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    stamp = datetime.now(UTC)
    run_id = mpi.bcast(comm, f"{stamp:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}")
    return RunContext(run_id=run_id, timestamp=stamp.isoformat(timespec="seconds"),
                      nranks=comm.Get_size(), hosts=tuple(hosts or ()),
                      backend=backend_name_for(spec.target_path), fs_type=backend.fs_type(),
                      mpi_library=mpi.library_version(comm))


def run_job(comm: Any, spec: JobSpec) -> tuple[RunContext, list[LayoutRun]]:
    """Every layout of the job in turn; results are complete on rank 0 only."""
    nranks = comm.Get_size()
    backend = open_backend(spec.target_path)
    manifest = mpi.on_root(comm, "reading the manifest", partial(read_manifest, spec.target_path))
    per_rank = bytes_per_rank(spec, nranks)
    mpi.collective(comm, "checking limits", partial(_check_open_files, spec, nranks, comm.Get_rank()))
    # Same manifest on every rank, so every rank reaches the same verdict: no collective.
    entries = {layout: prepared_layout(manifest, spec, layout, nranks, per_rank)
               for layout in spec.layouts}
    context = new_context(comm, spec, backend)
    runs = [run_layout(comm, spec, layout, backend, entries[layout]) for layout in spec.layouts]
    return context, runs


def run_layout(comm: Any, spec: JobSpec, layout: str, backend: Backend,
               entry: dict[str, Any]) -> LayoutRun:
    rank, nranks = comm.Get_rank(), comm.Get_size()
    plan = plan_rank(spec, layout, nranks, rank)
    paths = {relpath: backend.path(relpath) for relpath in plan.files}
    expected = None
    if spec.verify == "sha256":
        wanted = {(extent.relpath, extent.offset) for extent in plan.extents}
        expected = {(s["path"], s["offset"]): s["sha256"] for s in entry["slices"]
                    if (s["path"], s["offset"]) in wanted}
    log: list[tuple[int, int, int, int, int, int]] = []
    origins: dict[int, int] = {}
    messages: list[str] = []
    invalid_reason = ""
    failed_iteration = None
    with AlignedBuffer(spec.block_bytes) as buffer:
        for iteration in range(-spec.warmup, spec.iterations):
            if spec.cache == "cold":
                _evict(plan, backend, paths, messages)
            if not mpi.barrier(comm, timeout_s=spec.deadline_s + ABORT_GRACE_S):
                mpi.abort(comm, f"{layout}: other ranks did not reach the start of iteration "
                                f"{iteration} within {spec.deadline_s + ABORT_GRACE_S:g} s")
            origin = time.perf_counter_ns()
            origins[iteration] = origin
            outcome = run_pattern(plan, backend, paths, buffer, iteration, origin,
                                  origin + int(spec.deadline_s * 1e9), spec.cache == "direct",
                                  expected, log)
            messages.extend(outcome.messages[:MAX_MESSAGES - len(messages)])
            verdict = mpi.allreduce_max(comm, np.array([outcome.errors, outcome.timed_out]),
                                        timeout_s=spec.deadline_s + ABORT_GRACE_S)
            if verdict is None:
                mpi.abort(comm, f"{layout}: other ranks still busy {ABORT_GRACE_S:g} s past "
                                f"the {spec.deadline_s:g} s deadline")
                raise AssertionError("unreachable")
            if verdict.any():
                failed_iteration = iteration
                what = "warmup iteration" if iteration < 0 else "iteration"
                invalid_reason = (f"deadline of {spec.deadline_s:g} s reached in {what} {iteration}"
                                  if verdict[1] else f"ops failed in {what} {iteration}")
                break
    samples = _relative_measured(log, origins, failed_iteration)
    gathered = mpi.gather_rows(comm, samples)
    all_messages = mpi.gather(comm, messages)
    stats = None
    if gathered is not None and all_messages is not None:
        ranked = [np.column_stack([rows, np.full(len(rows), r, dtype=np.int64)])
                  for r, rows in enumerate(gathered)]
        stats = layout_stats(layout, np.concatenate(ranked), nranks)
        messages = [text for part in all_messages for text in part]
    return LayoutRun(layout=layout, bytes_per_rank=bytes_per_rank(spec, nranks),
                     stats=stats, messages=tuple(messages),
                     invalid_reason=invalid_reason)


def _check_open_files(spec: JobSpec, nranks: int, rank: int) -> None:
    """An open storm keeps open_count handles per file open at once: refuse a job that
    would hit the open-files limit mid-run rather than archive it half done."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return
    files = max(len(plan_rank(spec, layout, nranks, rank).files) for layout in spec.layouts)
    needed = spec.open_count * files
    # Python, MPI and the launcher hold descriptors of their own; keep a margin for them.
    if needed > soft_limit - 64:
        raise UsageError(f"{spec.source}: pattern.open_count = {spec.open_count} keeps {needed} "
                         f"files open at once, over this process's open-files limit "
                         f"({soft_limit}, less 64 for Python and MPI)",
                         hint="lower open_count, or raise the limit (ulimit -n)")


def _evict(plan: Any, backend: Backend, paths: dict[str, Any], messages: list[str]) -> None:
    """Untimed: drop this rank's ranges from the page cache before the phase."""
    for extent in plan.extents:
        try:
            backend.evict(paths[extent.relpath], extent.offset, extent.length)
        except OSError as error:
            if len(messages) < MAX_MESSAGES:
                messages.append(f"rank {plan.rank}: evict {extent.relpath}: "
                                f"{os.strerror(error.errno or 0)}")


def _relative_measured(log: list[tuple[int, int, int, int, int, int]], origins: dict[int, int],
                       failed_iteration: int | None) -> np.ndarray:
    """Measured iterations, stamps relative to each iteration's origin.

    Warmup is dropped, except a warmup iteration that failed: its samples are the evidence
    the invalid run is archived with.
    """
    rows = np.array(log, dtype=np.int64).reshape(-1, 6)
    rows = rows[(rows[:, ITER] >= 0) | (rows[:, ITER] == failed_iteration)]
    if rows.size:
        offsets = np.array([origins[i] for i in sorted(origins)], dtype=np.int64)[
            rows[:, ITER] - min(origins)]
        rows[:, START] -= offsets
        rows[:, STOP] -= offsets
    assert rows.shape[1] == RANK  # the rank column is appended on rank 0
    return rows
