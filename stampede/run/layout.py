"""One layout of a run: the untimed set-up, its phases, and what reaches rank 0.

Per iteration: the cache state (cold: evict, ask residency, drop) -> Python's garbage
collected, its collector held off -> polite barrier + Barrier -> origin stamp -> the timed
pattern -> the collector back -> polite allreduce of the phase's totals
-> the verdict (stampede.run.verdict). All ranks take the same decisions from the same
reduced values, so a failing rank never leaves the others in a collective. Samples reach
rank 0 once per layout (stampede.run.gather).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from stampede import mpi
from stampede.backends.base import Backend, object_store
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import RankPlan, bytes_per_rank, plan_rank
from stampede.results.amplification import RankNeed, amplification, rank_read_bytes
from stampede.results.model import ClientCounts, LayoutRun
from stampede.results.samples import ITER, RANK
from stampede.run import cache, gather
from stampede.run.interrupt import Interrupts
from stampede.run.outcome import MAX_MESSAGES, Log, PhaseOutcome
from stampede.run.pattern import received_bytes, run_pattern
from stampede.run.setup import RankSetup, build_setup
from stampede.run.verdict import Totals, iteration_name, judge
from stampede.run.where import Where
from stampede.spec import JobSpec
from stampede.units import NS_PER_S

if TYPE_CHECKING:
    from stampede.existing.catalogue import Catalogue
    from stampede.run.devices import Device

# How long past the deadline a rank waits for the others before aborting the whole job:
# a rank stuck inside one syscall (a hung NFS server) cannot check its own deadline.
ABORT_GRACE_S = 10.0


@dataclass
class Phases:
    """What one rank saw over all the phases of one layout."""

    log: Log = field(default_factory=list)
    origins: dict[int, int] = field(default_factory=dict)   # iteration -> barrier exit
    messages: list[str] = field(default_factory=list)       # errors, up to MAX_MESSAGES
    notes: list[str] = field(default_factory=list)          # not errors: what to know
    said: list[str] = field(default_factory=list)           # rank 0's: what was done, not
    #                                                         a warning (the save's stripes)
    digests: list[dict[str, object]] = field(default_factory=list)   # iteration 0's
    resident: list[float] = field(default_factory=list)     # per measured iteration
    invalid_reason: str = ""
    failed_iteration: int | None = None
    interrupted: bool = False
    cache_drops: int = 0                                    # page-cache drops made here

    @property
    def iterations_done(self) -> int:
        """Measured iterations completed before a signal stopped the layout (the one it
        arrived in finished: a stop comes at an iteration's end)."""
        return max((self.failed_iteration or 0) + 1, 0) if self.interrupted else 0


# Called on every rank after each phase: (layout, iteration, seconds it took here).
Tick = Callable[[str, int, float], None]


def plan_for(spec: JobSpec, catalogue: Catalogue | None, layout: str, nranks: int,
             rank: int, root: str = "") -> RankPlan:
    """A rank's plan: a stampede layout (under `root`: a saved version), or a policy over
    an existing checkpoint."""
    if catalogue is not None:
        from stampede.existing.assign import plan_existing
        return plan_existing(catalogue, spec, layout, nranks, rank)
    return plan_rank(spec, layout, nranks, rank, root)


def run_layout(comm: mpi.Comm, spec: JobSpec, layout: str, backend: Backend,
               entry: dict[str, Any], device: Device | None, hosts: tuple[str, ...],
               catalogue: Catalogue | None = None, interrupts: Interrupts | None = None,
               tick: Tick | None = None) -> LayoutRun:
    """One layout, every iteration; the statistics are complete on rank 0, whose `hosts`
    (host of each rank) put the ranks' stamps on one time axis."""
    plan = plan_for(spec, catalogue, layout, comm.Get_size(), comm.Get_rank(),
                    entry.get("root", ""))
    client_before = gather.client_before(backend)
    gather.check_trace(comm, spec, plan)
    # Layouts that exchange hold the whole shard in memory (node-once: the node's whole
    # read); the others reuse one block.
    buffer_bytes = plan.held_bytes if plan.exchange else spec.block_bytes
    if plan.by_node and mpi.node_rank(comm):   # collective: only a node's first rank reads
        buffer_bytes = plan.hold.length         # (build_setup's node group agrees), the
                                                # others hold their slice alone
    with AlignedBuffer(buffer_bytes, populate=True) as buffer:  # no page fault in a timed read
        setup = build_setup(comm, spec, plan, backend, entry, buffer, device, catalogue)
        try:
            phases = run_phases(comm, spec, setup, catalogue, interrupts, tick)
        finally:
            if setup.torch is not None:   # before the buffer its tensor lies on goes
                setup.torch.close()
        if setup.group is not None:
            mpi.free(setup.group, comm)
        if device is not None:
            device.unpin(buffer)
    run = _to_rank_zero(comm, spec, setup.plan, catalogue, hosts, phases,
                        gather.client_counts(comm, backend, client_before), setup.where)
    return replace(run, restored_from=entry.get("root", ""))


def run_phases(comm: mpi.Comm, spec: JobSpec, setup: RankSetup, catalogue: Catalogue | None = None,
               interrupts: Interrupts | None = None, tick: Tick | None = None) -> Phases:
    """Every iteration of one layout on this rank, until the verdict says stop (a signal
    received on any rank among the reasons, at the iteration's end)."""
    phases = Phases(notes=list(setup.notes) if comm.Get_rank() == 0 else [])
    if catalogue is not None and catalogue.format == "dcp" and spec.check_finite \
            and comm.Get_rank() == 0:
        phases.notes.append("run.check_finite: DCP items are torch-serialised blobs, not checked")
    drops_caches = spec.drop_caches and mpi.node_rank(comm) == 0
    for iteration in range(-spec.warmup, spec.iterations):
        cached, asked = _cache_state(comm, spec, setup, phases, drops_caches)
        outcome = _phase(comm, spec, setup, iteration, phases)
        signalled = int(bool(interrupts and interrupts.received))
        totals = phase_totals(comm, spec, setup.plan.layout, outcome, cached, asked, signalled)
        if tick is not None:
            tick(setup.plan.layout, iteration,
                 (time.perf_counter_ns() - phases.origins[iteration]) / NS_PER_S)
        if iteration >= 0 and totals.asked:
            phases.resident.append(totals.cached / totals.asked)
        verdict = judge(totals, iteration, spec.warmup, phases.invalid_reason,
                        spec.max_error_fraction, spec.deadline_s)
        phases.invalid_reason = verdict.invalid_reason
        if verdict.stop:
            phases.failed_iteration = iteration
            phases.interrupted = bool(totals.interrupted)
            break
    return phases


def jitter_s(spec: JobSpec, rank: int, iteration: int) -> float:
    """This rank's start delay in this iteration: reproducible from run.seed."""
    if spec.jitter == "none":
        return 0.0
    distribution, _, scale = spec.jitter.partition(":")
    generator = np.random.default_rng([spec.seed, rank, iteration + 2**20])
    if distribution == "uniform":
        return float(generator.uniform(0.0, float(scale)))
    return float(generator.exponential(float(scale)))


def _cache_state(comm: mpi.Comm, spec: JobSpec, setup: RankSetup, phases: Phases,
                 drops_caches: bool) -> tuple[int, int]:
    """Untimed, before a phase: (cached, asked) bytes after a cold eviction, else (0, 0)."""
    if spec.cache != "cold":
        return 0, 0
    cache.evict(setup, phases.messages)
    # Only where the pages were just evicted: asking opens each file, and on NFS an open
    # revalidates attributes, which would warm a warm run's timed stats.
    cached, asked = cache.residency(setup, phases.notes)
    if spec.drop_caches:
        # Last, once no rank opens a file again before the phase: the drop also takes
        # the dentries and inodes those opens brought back.
        mpi.barrier(comm)
        if drops_caches:
            phases.cache_drops += cache.drop_caches(phases.notes)
    return cached, asked


@contextmanager
def timed_phase(comm: mpi.Comm, spec: JobSpec, backend: Backend, layout: str, iteration: int,
                phases: Phases) -> Iterator[int]:
    """The block of a timed phase, what a restore's and a save's phases share: yields the
    origin stamp, taken as the rank leaves the start barrier (a rank that does not come in
    time aborts the job), recorded in `phases`.

    Each phase is a restart's: an object store's client begins it as a new process's
    would (ObjectStore.new_phase: adaptive retries' rate limiter off), or the 503s of the
    warm-up, or of the layout before, would slow it from its first request.

    Python's cyclic garbage collector is run before the barrier and held off inside the
    block: a collection is a pause of the rank's own (a full one walks every object the
    process holds, numpy's and stampede's modules included), which would be timed
    as the storage's. Measured through libcephfs (one rank, 2,000 files opened and closed
    in turn, 3 runs): the first iteration after the warm-up took 20-21 us a pair against
    11-15 us in the others; 13-15 us with the collector held off. What a phase allocates
    is collected before the next one's barrier. Loaders (stampede loaders) keep theirs: a
    loader's collections are the loader's cost, as in a training job."""
    store = object_store(backend)
    if store is not None:
        store.new_phase()
    gc.collect()
    held = gc.isenabled()
    gc.disable()
    try:
        if not mpi.barrier(comm, timeout_s=spec.deadline_s + ABORT_GRACE_S):
            mpi.abort(comm, f"{layout}: other ranks did not reach the start of "
                            f"{iteration_name(iteration, spec.warmup)} within "
                            f"{spec.deadline_s + ABORT_GRACE_S:g} s")
        origin = time.perf_counter_ns()
        phases.origins[iteration] = origin
        yield origin
    finally:
        if held:
            gc.enable()


def _phase(comm: mpi.Comm, spec: JobSpec, setup: RankSetup, iteration: int,
           phases: Phases) -> PhaseOutcome:
    """The start barrier, the origin stamp and the timed pattern; before them, outside
    the restore, a new torch.distributed process group (run.exchange = torch)."""
    delay_s = jitter_s(spec, setup.plan.rank, iteration)
    if setup.torch is not None:
        setup.torch.renew(iteration, received_bytes(setup), setup.plan.exchange, phases.log)
    with timed_phase(comm, spec, setup.backend, setup.plan.layout, iteration,
                     phases) as origin:
        outcome = run_pattern(setup, iteration, origin,
                              origin + int(spec.deadline_s * NS_PER_S), delay_s, phases.log)
    phases.messages.extend(outcome.messages[:MAX_MESSAGES - len(phases.messages)])
    if iteration == 0:
        phases.digests = outcome.digests
    return outcome


def phase_totals(comm: mpi.Comm, spec: JobSpec, layout: str, outcome: PhaseOutcome, cached: int,
            asked: int, signalled: int) -> Totals:
    """The phase summed over ranks; a rank that does not answer in time aborts the job."""
    mine = np.array([outcome.errors, outcome.ops, outcome.timed_out, outcome.incomplete,
                     outcome.corrupt, cached, asked, signalled])
    total = mpi.allreduce_sum(comm, mine, timeout_s=spec.deadline_s + ABORT_GRACE_S)
    if total is None:
        mpi.abort(comm, f"{layout}: other ranks still busy {ABORT_GRACE_S:g} s past the "
                        f"{spec.deadline_s:g} s deadline")
        raise AssertionError("unreachable")
    return Totals(*(int(value) for value in total))


def _to_rank_zero(comm: mpi.Comm, spec: JobSpec, plan: RankPlan, catalogue: Catalogue | None,
                  hosts: tuple[str, ...], phases: Phases,
                  client: ClientCounts, where: Where | None = None) -> LayoutRun:
    """Gather the layout's samples, messages and notes to rank 0 (collective)."""
    rows = measured_rows(phases.log, phases.failed_iteration)
    all_messages = mpi.gather(comm, phases.messages)
    all_digests = mpi.gather(comm, phases.digests)
    all_notes = mpi.gather(comm, phases.notes)
    shares = mpi.gather(comm, sum(extent.length for extent in plan.extents))
    needs = mpi.gather(comm, RankNeed(rank_read_bytes(rows[rows[:, ITER] >= 0]),
                                      plan.needed_bytes, plan.needed_key))
    drops = mpi.gather(comm, phases.cache_drops)
    stats, trace = gather.gathered_stats(comm, spec, plan, plan.layout, rows, phases.origins,
                                         hosts, phases.failed_iteration,
                                         where=located(where, phases.log,
                                                       phases.failed_iteration))
    messages = [text for part in all_messages for text in part] if all_messages is not None \
        else phases.messages
    # An existing checkpoint's ranks restore different amounts: the row's bytes per rank
    # is the largest share (whose rank the time to last rank most likely belongs to).
    per_rank = max(shares or [0]) if catalogue is not None else \
        bytes_per_rank(spec, comm.Get_size())
    return LayoutRun(layout=plan.layout, bytes_per_rank=per_rank,
                     stats=stats, messages=tuple(messages),
                     invalid_reason=phases.invalid_reason, client=client,
                     resident_fraction=tuple(phases.resident),
                     bytes_total=sum(shares or [0]) if catalogue is not None else 0,
                     notes=tuple(dict.fromkeys(n for part in all_notes or [] for n in part)),
                     digests=tuple(d for part in all_digests or [] for d in part),
                     interrupted=phases.interrupted, iterations_done=phases.iterations_done,
                     cache_drops=tuple(drops or ()), trace=trace,
                     amplification=amplification(needs, hosts) if needs else None)


def measured_rows(log: Log, failed_iteration: int | None) -> np.ndarray:
    """Measured iterations with absolute stamps (rank 0 puts them on one axis).

    Warmup is dropped, except a warmup iteration that failed: its samples are the evidence
    the invalid run is archived with.
    """
    rows = np.array(log, dtype=np.int64).reshape(-1, 6)
    rows = rows[measured(rows, failed_iteration)]
    assert rows.shape[1] == RANK  # the rank column is appended on rank 0
    return rows


def measured(rows: np.ndarray, failed_iteration: int | None) -> np.ndarray:
    """Which of a log's rows measured_rows keeps (a mask)."""
    return (rows[:, ITER] >= 0) | (rows[:, ITER] == failed_iteration)


def located(where: Where | None, log: Log, failed_iteration: int | None,
            ) -> tuple[np.ndarray, list[str]] | None:
    """--trace: the file and offset of each of measured_rows' rows, and the file names
    (None when not tracing)."""
    if where is None:
        return None
    rows = np.array(log, dtype=np.int64).reshape(-1, 6)
    return where.columns(len(rows), measured(rows, failed_iteration)), where.names
