"""`stampede rejoin`: a save in tiers, a node lost, hot spares in its place, and the
restore from the tiers measured beside a full restart from storage, in one MPI job.

Who does what is stampede.run.roles'. The steps, each rank's stamps on its own clock from
the barrier that starts the phase (stampede.run.clock puts them on one axis):

1. The save of tiers.versions versions, one after the other, by the working ranks, three
   layouts of phase save (an iteration per version; each version's files named vNNNN-):
   - tier-local: the rank's shard to its node's local tier (tiers.local_dir/HOST/...):
     create, write (blocks), fsync, close; `save` = durable on the node.
   - tier-peer: the shard sent to its tiers.peers holders on other nodes (`peer`), each
     holder writing what it received to its own local tier (create, write, fsync, close)
     and acknowledging; `save` = the rank has every acknowledgement (its shard survives
     the loss of its node).
   - tier-storage: the shard drained to the job's target (the shared storage): create,
     write, fsync, close (or one PUT); `save` = durable on storage. With tiers.drain =
     background a thread of the rank writes it from the moment the local copy is durable,
     while the rank replicates to its peers; inline, the rank writes it after them.
   `blocked` (in each of the three) = the rank could train again: its local and peer
   copies done (inline: its storage copy too); `published` (rank 0, in the layout of the
   tier tiers.publish names) = the manifest written once every rank's shard is on that
   tier and on every tier below it (the publish waits for them: their unprotected_s is 0
   by definition); a tier above it has unprotected_s = how long a published version was
   not yet on that tier on every node (run.tiers.unprotected_by_tier). Then retention: each
   tier removes (`unlink`) the version it no longer keeps (tiers.keep_local, keep_peer,
   keep_storage), only once a newer one is published (so it opens no window).
2. The loss: every rank of a lost node deletes its node's local tier (its memory goes
   with the process's next phase: it takes no part in the restores).
   Then the spares' own start-up (layout spare-start, phase startup): every spare rank
   starts a process of stampede's own at once (stampede.run.spare_start), stamped as
   `stampede startup` stamps its ranks: the T_pod_init of the rejoin path.
3. Two layouts of phase restore of the last version, run.warmup + run.iterations times
   each, by the restored job (survivors and the spares standing in), the same bytes, page
   caches as run.cache:
   - rejoin: a survivor serves first the lost shards it holds a replica of (read from its
     local tier, `peer` to the spare), then reads its own shard from its local tier; a
     spare receives its shard from that peer, or, with no peer (every holder lost) or a
     replica that is missing or fails run.verify, reads it from storage and says so.
   - restart: every rank reads its shard from storage (the full restart it is ranked
     against).
Everything written is removed at the end: the local tiers of every node and the storage
tier (a directory of its own under the target), and the directories the run made
(stampede.run.tier_dirs). A version that fails on any rank (a storage server dead or hung:
each op fails within its timeout) or a signal ends the save there, on every rank alike:
the tiers archived as they went, the restores not measured.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import replace
from functools import partial
from typing import cast

import numpy as np

from stampede import mpi
from stampede.backends import open_backend
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import bytes_per_rank
from stampede.errors import UsageError
from stampede.ops import OP_CODE
from stampede.results.model import LayoutRun, RunContext
from stampede.results.tiers import REJOIN, SPARE_START, TIER_RESTORES, TIERS
from stampede.run.file_system import AfterLayout
from stampede.run.interrupt import Interrupts
from stampede.run.job import new_context
from stampede.run.layout import Tick
from stampede.run.roles import plan_roles
from stampede.run.tier_dirs import (
    clean,
    local_directories,
    nothing_left,
    remove_local,
    storage_directories,
)
from stampede.run.tiers import (
    Rank,
    Row,
    digest_of,
    layout_run,
    local_tier,
    save_in_tiers,
    wait_all,
)
from stampede.spec import VERIFY_MODES, JobSpec
from stampede.units import NS_PER_S

(OPEN, READ, CLOSE, VERIFY, PEER, RESTORE) = (
    OP_CODE[name] for name in ("open", "read", "close", "verify", "peer", "restore"))
DAMAGES = ("none", "missing", "corrupt")   # what happens to the lost shards' replicas
TAG_SHARD = 73   # a lost shard to its spare (tiers' tags: 71, 72)


def rejoin_job(comm: mpi.Comm, spec: JobSpec, after_layout: AfterLayout | None = None,
               interrupts: Interrupts | None = None, tick: Tick | None = None,
               context: RunContext | None = None, damage: str = "none",
               ) -> tuple[RunContext, list[LayoutRun]]:
    """The save in tiers, the loss, the rejoin and the restart (module docstring); each
    layout handed to `after_layout` as it completes. Complete on rank 0 only. `damage`
    (DAMAGES): what the loss does to the lost shards' surviving replicas."""
    hosts: tuple[str, ...] = tuple(mpi.bcast(comm, mpi.gather(comm, mpi.processor_name(comm)) or []))
    roles = mpi.on_root(comm, "placing the tiers", partial(   # the same on every rank:
        plan_roles, hosts, spec.spare_nodes, spec.lost_nodes, spec.tier_peers,   # said once
        spec.tier_placement))
    backend = mpi.collective(comm, "connecting to the target",
                             partial(open_backend, spec.target_path, spec.storage_options))
    context = context or new_context(comm, spec, backend)
    shard_bytes = bytes_per_rank(spec, len(roles.working))
    me = comm.Get_rank()
    held = roles.held_by(me)
    local = local_tier(spec, hosts[me])
    runs: list[LayoutRun] = []
    with AlignedBuffer(shard_bytes, populate=True) as shard, \
            contextlib.ExitStack() as buffers:
        incoming = [buffers.enter_context(AlignedBuffer(shard_bytes, populate=True)) for _ in held]
        state = Rank(comm, spec, roles, backend, shard, incoming, shard_bytes, local, damage)
        if spec.tier_drain == "background":
            state.drain_connection = mpi.collective(comm, "connecting the drain to the target",
                                                    partial(open_backend, spec.target_path,
                                                            spec.storage_options))
        mpi.collective(comm, "checking the tiers", partial(nothing_left, state))
        try:
            mpi.collective(comm, "making the local tiers", partial(local_directories, state))
            mpi.on_root(comm, "making the storage tier", partial(storage_directories, state))
            for run in save_in_tiers(state, hosts, partial(_interrupted, interrupts)):
                runs.append(run)
                _archive(comm, after_layout, context, run, roles.working, hosts)
            if state.stopped:   # no version to lose a node after: not measured, said
                if comm.Get_rank() == 0:
                    print(f"stampede rejoin: the save in tiers ended early ({state.stopped}): "
                          f"{', '.join(TIER_RESTORES)} not measured", file=sys.stderr, flush=True)
                return context, runs
            mpi.collective(comm, "losing the nodes", partial(_lose, state))
            started = _spare_start(state)
            runs.append(started)
            _archive(comm, after_layout, context, started, roles.spares, hosts)
            for layout in TIER_RESTORES:
                run = _restores(state, layout, hosts, tick)
                runs.append(run)
                _archive(comm, after_layout, context, run, roles.active, hosts)
                agreed = mpi.allreduce_sum(comm, np.array([int(_interrupted(interrupts))]))
                if agreed is None or agreed[0]:
                    break
        finally:
            clean(state)
    return context, runs


def _interrupted(interrupts: Interrupts | None) -> bool:
    return interrupts is not None and bool(interrupts.received)


def _archive(comm: mpi.Comm, after_layout: AfterLayout | None, context: RunContext, run: LayoutRun,
             ranks: tuple[int, ...], hosts: tuple[str, ...]) -> None:
    """The layout archived with the ranks that took part in it (rank 0: always one)."""
    if after_layout is None:
        return
    taking_part = replace(context, nranks=len(ranks), hosts=tuple(hosts[r] for r in ranks))
    mpi.on_root(comm, f"archiving {run.layout}", partial(after_layout, taking_part, run))


def check_damage(spec: JobSpec, damage: str) -> None:
    """--damage corrupt is a test of run.verify: without a check, the corrupt replica would
    be restored as good and the rejoin archived valid (UsageError, before MPI)."""
    if damage == "corrupt" and spec.verify == "none":
        raise UsageError(f"{spec.source}: --damage corrupt with run.verify = \"none\": the "
                         "corrupt replica would be restored unchecked; run.verify must be "
                         f"{' or '.join(m for m in VERIFY_MODES if m != 'none')}")


# ---- the loss ---------------------------------------------------------------------------

def _lose(state: Rank) -> None:
    """A lost node's ranks delete its local tier; run with --damage, the surviving holders
    of the lost shards' replicas delete or corrupt them (what a rejoin must survive)."""
    roles = state.roles
    if state.rank in roles.lost:
        remove_local(state.local)
        return
    for position in roles.served_by(state.rank):
        path = state.local_file(position, True)
        if state.damage == "missing":
            os.unlink(path)
        elif state.damage == "corrupt":
            with open(path, "r+b") as file:
                first = file.read(1)
                file.seek(0)
                file.write(bytes([first[0] ^ 0xFF]))


# ---- the spares' own start-up ----------------------------------------------------------

# what a launcher tells its ranks: a child started without it is a process of its own
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPIR_", "MPI_LOCAL", "OMPI_", "SLURM_")


def _spare_start(state: Rank) -> LayoutRun:
    """Layout spare-start (phase startup): once the nodes are lost, every spare rank
    starts a process of stampede's own at once (stampede.run.spare_start: interpreter,
    the run modules, MPI initialised), stamped as `stampede startup` stamps its ranks:
    the spare node's T_pod_init. Rank 0 gets the LayoutRun (with no stats elsewhere)."""
    import json
    import subprocess

    from stampede.run.startup import LAUNCH_VARIABLE

    comm, spares = state.comm, state.roles.spares
    record = None
    if state.rank in spares:
        environment = {name: value for name, value in os.environ.items()
                       if not name.startswith(LAUNCHER_PREFIXES)}
        environment[LAUNCH_VARIABLE] = str(time.time_ns())
        done = subprocess.run([sys.executable, "-P", "-m", "stampede.run.spare_start"],
                              env=environment, capture_output=True, text=True, check=False)
        lines = done.stdout.strip().splitlines()
        record = json.loads(lines[-1]) if done.returncode == 0 and lines else \
            f"rank {state.rank}: the spare's start-up failed ({done.returncode}): " \
            f"{done.stderr.strip()[-300:]}"
    mpi.barrier(comm)   # polite: the other ranks wait without spinning
    said = mpi.gather(comm, record)
    if said is None:
        return LayoutRun(SPARE_START, 0, None, (), "", phase="startup")
    from stampede.results.stats import layout_stats  # rank 0 only
    from stampede.run.startup import StartupRecord, samples

    # a spare's process is one rank of its own: its barriers time no job's sync
    records = [cast(StartupRecord, {**item, "collectives_ns": []}) for item in said
               if isinstance(item, dict)]
    failed = tuple(item for item in said if isinstance(item, str))
    if not records:
        return LayoutRun(SPARE_START, 0, None, failed, "; ".join(failed) or "no spare",
                         phase="startup")
    stats = layout_stats(SPARE_START, samples(records), len(records), completion_op="startup")
    return LayoutRun(SPARE_START, 0, stats, failed, "; ".join(failed), phase="startup",
                     said=(f"{len(records)} spare rank(s) on "
                           f"{len({record['host'] for record in records})} node(s) started "
                           "at once after the loss: launch -> MPI ready",))


# ---- the restores -----------------------------------------------------------------------

def _restores(state: Rank, layout: str, hosts: tuple[str, ...], tick: Tick | None) -> LayoutRun:
    """One restore layout, run.warmup + run.iterations times (module docstring, 3.)."""
    comm, roles, spec = state.comm, state.roles, state.spec
    position = roles.position_of(state.rank, after_loss=True)
    active = mpi.split(comm, int(position < 0), key=state.rank)
    rows: list[Row] = []
    origins: dict[int, int] = {}
    state.notes = []
    for iteration in range(-spec.warmup, spec.iterations):
        _evict(state)
        mpi.barrier(comm)
        origins[iteration] = origin = time.perf_counter_ns()
        if position >= 0:
            state.used, state.tier = {}, ""
            if layout == REJOIN:
                _rejoin(state, position, iteration, rows)
            else:
                _from_storage(state, position, iteration, rows)
            held = bool(state.tier)   # the bytes are here, checked, from some tier
            rows.append((iteration, RESTORE, origin, time.perf_counter_ns(),
                         state.shard_bytes if held else 0, int(held)))
        if tick is not None:
            tick(layout, iteration, (time.perf_counter_ns() - origin) / NS_PER_S)
    run = None
    if position >= 0:
        active_hosts = tuple(hosts[r] for r in roles.active)
        run = layout_run(active, state, layout, rows, origins, active_hosts, "restore")
        said, tier_bytes = _tiers_said(active, state)
        run = replace(run, said=tuple(said), tier_bytes=tier_bytes)
    mpi.free(active, comm)
    return run if run is not None else LayoutRun(layout, 0, None, (), "")


def _evict(state: Rank) -> None:
    """Untimed, before a phase with run.cache = cold: this rank's files out of the page
    cache (a local tier in memory, /dev/shm, stays where it is: that is the tier)."""
    if state.spec.cache != "cold":
        return
    position = state.roles.position_of(state.rank, after_loss=True)
    if position >= 0:
        with contextlib.suppress(OSError):
            state.backend.evict(state.storage_file(position), 0, state.shard_bytes)
    for path in state.local.glob("*"):
        with contextlib.suppress(OSError):
            state.local_backend.evict(path, 0, state.shard_bytes)


def _rejoin(state: Rank, position: int, iteration: int, rows: list[Row]) -> None:
    roles = state.roles
    for lost in roles.served_by(state.rank):     # the spares first: they are the long pole
        _serve(state, lost, iteration, rows)
    if state.rank in roles.spares:
        _receive(state, position, iteration, rows)
        return
    failed = read_file(state.local_backend, state.local_file(position, False), state.shard.view,
                       state.spec.block_bytes, iteration, rows)
    if not failed and _checked(state, position, iteration, rows, "local"):
        return
    why = failed or f"failed run.verify ({state.spec.verify})"
    state.notes.append(f"rank {state.rank}: position {position} on its local tier: {why}: "
                       "read from storage")
    _from_storage(state, position, iteration, rows)


def _serve(state: Rank, position: int, iteration: int, rows: list[Row]) -> None:
    """A lost shard's replica from this rank's local tier to the spare standing in for it
    (a length first: -1 when the replica is missing)."""
    index = state.roles.held_by(state.rank).index(position)
    buffer = state.incoming[index]
    spare = state.roles.restorer[position]
    failed = read_file(state.local_backend, state.local_file(position, True), buffer.view,
                       state.spec.block_bytes, iteration, rows)
    length = -1 if failed else state.shard_bytes
    start = time.perf_counter_ns()
    state.comm.Send(np.array([length], dtype=np.int64), dest=spare, tag=TAG_SHARD)
    if length >= 0:
        state.comm.Send(buffer.view, dest=spare, tag=TAG_SHARD)
    rows.append((iteration, PEER, start, time.perf_counter_ns(), 0, 1))


def _receive(state: Rank, position: int, iteration: int, rows: list[Row]) -> None:
    """A spare's shard: from the peer holding its replica, else from storage."""
    server = state.roles.server(position)
    if server >= 0:
        start = time.perf_counter_ns()
        length = np.zeros(1, dtype=np.int64)
        wait_all([state.comm.Irecv(length, source=server, tag=TAG_SHARD)])
        if length[0] >= 0:
            wait_all([state.comm.Irecv(state.shard.view, source=server, tag=TAG_SHARD)])
        rows.append((iteration, PEER, start, time.perf_counter_ns(),
                     max(int(length[0]), 0), int(length[0] >= 0)))
        if length[0] >= 0 and _checked(state, position, iteration, rows, "peer"):
            return
        why = "missing on its peer" if length[0] < 0 else f"failed run.verify ({state.spec.verify})"
        state.notes.append(f"rank {state.rank}: position {position}'s replica {why} on rank "
                           f"{server}: read from storage")
    else:
        state.notes.append(f"rank {state.rank}: no peer holds position {position}'s replica: "
                           "read from storage")
    _from_storage(state, position, iteration, rows)


def _checked(state: Rank, position: int, iteration: int, rows: list[Row], tier: str) -> bool:
    """run.verify of the shard just restored (op verify); the tier recorded when good."""
    good = True
    if state.spec.verify != "none":
        start = time.perf_counter_ns()
        good = digest_of(state.spec, state.shard.view) == state.digests[position]
        rows.append((iteration, VERIFY, start, time.perf_counter_ns(), state.shard_bytes, int(good)))
    if good:
        state.tier = tier
        state.used[tier] = state.used.get(tier, 0) + state.shard_bytes
    return good


def _from_storage(state: Rank, position: int, iteration: int, rows: list[Row]) -> None:
    """The shard from the job's target, then checked: the last tier, so what fails here
    leaves the rank without its bytes (said, and the layout invalid)."""
    failed = read_file(state.backend, state.storage_file(position), state.shard.view,
                       state.spec.block_bytes, iteration, rows)
    if failed:
        state.failed(f"position {position} from storage: {failed}")
    elif not _checked(state, position, iteration, rows, "storage"):
        state.failed(f"position {position} from storage failed run.verify ({state.spec.verify})")


def read_file(backend: Backend, path: str | bytes, view: memoryview, block: int, iteration: int,
              rows: list[Row]) -> str:
    """open, read (blocks), close of one file, timed op by op; what failed, or "" (a row
    with ok 0, never raised: the caller falls back to the next tier)."""
    clock = time.perf_counter_ns
    start = clock()
    try:
        handle = backend.opener(False)(path)
    except OSError as error:
        rows.append((iteration, OPEN, start, clock(), 0, 0))
        return f"open: {error.strerror or error}"
    rows.append((iteration, OPEN, start, clock(), 0, 1))
    failed = ""
    try:
        for offset in range(0, len(view), block):
            piece = view[offset:offset + block]
            start = clock()
            count = backend.read_into(handle, piece, offset)
            rows.append((iteration, READ, start, clock(), count, int(count == len(piece))))
            if count != len(piece):
                failed = f"read at {offset}: {count} of {len(piece)} bytes (truncated?)"
                break
    except OSError as error:
        rows.append((iteration, READ, start, clock(), 0, 0))
        failed = f"read: {error.strerror or error}"
    finally:
        start = clock()
        with contextlib.suppress(OSError):
            backend.close(handle)
        rows.append((iteration, CLOSE, start, clock(), 0, 1))
    return failed


def _tiers_said(active: mpi.Comm, state: Rank) -> tuple[list[str], dict[str, int]]:
    """What the report notes of a restore (the bytes from each tier, which tier each rank
    used: the last iteration's, the same in every one; the spares apart; each fall-back to
    the next tier and why), and the bytes from each tier (TIERS). Ranks as the restored
    job numbers them (the archive's), with their world rank."""
    said = mpi.gather(active, (state.rank, state.tier, dict(state.used), list(state.notes)))
    if said is None:
        return [], {}
    totals = dict.fromkeys(TIERS, 0)
    for _, _, used, _ in said:
        for tier, nbytes in used.items():
            totals[tier] += nbytes
    roles = state.roles
    lines = ["bytes by tier (last iteration): " + ", ".join(
        f"{tier} {nbytes:,} B" for tier, nbytes in sorted(totals.items()) if nbytes),
        "tier by rank: " + ", ".join(
            f"{index}@{roles.nodes[roles.node_of[world]]}"
            f"{' (spare, world rank ' + str(world) + ')' if world in roles.spares else ''} "
            f"{tier or 'none'}" for index, (world, tier, _, _) in enumerate(said))]
    return lines + sorted({note for *_, notes in said for note in notes}), totals
