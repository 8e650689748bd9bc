"""The save in tiers of `stampede rejoin` (stampede.run.rejoin, whose docstring tells the
whole run): each working rank's shard durable on its node's local tier, then on peers on
other nodes, then on the shared storage, timed as three layouts of one save; and what the
restores share with it (a rank's state, a layout's statistics, polite waits).

Publishing at a level (tiers.publish) means the version is durable at that level AND on
every tier below it (local < peer < storage): the publish waits, behind a barrier, for
every rank's copies to all of them, so their unprotected window is 0 by definition
(unprotected_by_tier), whichever thread (the drain, the replication) finished first.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from stampede import mpi
from stampede.backends.base import Backend, object_store
from stampede.backends.posix import PosixBackend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.content import ContentSource
from stampede.ops import OP_CODE
from stampede.results.model import LayoutRun
from stampede.results.tiers import TIER_SAVES, TIERS
from stampede.run.digests import new_digest
from stampede.run.gather import exact_stats
from stampede.run.outcome import MAX_MESSAGES
from stampede.run.roles import Roles
from stampede.spec import JobSpec
from stampede.units import NS_PER_S

(CREATE, WRITE, FSYNC, CLOSE, PEER, SAVE, PUBLISHED, BLOCKED, UNLINK) = (
    OP_CODE[name] for name in ("create", "write", "fsync", "close", "peer", "save", "published",
                               "blocked", "unlink"))
TAG_REPLICA, TAG_ACK = 71, 72
Row = tuple[int, int, int, int, int, int]


@dataclass
class Rank:
    """One rank's part: its roles, its paths, its buffers and what it has seen."""

    comm: mpi.Comm
    spec: JobSpec
    roles: Roles
    backend: Backend
    shard: AlignedBuffer            # this rank's shard (before the loss: the one it saved)
    incoming: list[AlignedBuffer]   # replicas received (one per position it holds)
    shard_bytes: int
    local: Path                     # this node's local tier, this job's directory
    damage: str = "none"            # DAMAGES: what the loss does to the replicas it spares
    digests: list[str] = field(default_factory=list)   # position -> run.verify hash
    used: dict[str, int] = field(default_factory=dict)   # tier -> bytes this rank restored
    tier: str = ""                  # where this rank's shard came from in the rejoin
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)    # what failed in the current layout
    drain_connection: Backend | None = None   # tiers.drain = background: the drain's own
    version: int = 1                # the version saved (after the save: the last, restored)
    made: list[Path] = field(default_factory=list)   # local directories this rank made
    made_root: bool = False         # rank 0 made the target (removed at the end if empty)
    stopped: str = ""               # why the save in tiers ended before its last version
    _local_backend: Backend | None = None

    def failed(self, text: str) -> str:
        """Record what failed (when `text` says anything) under this rank; `text` back."""
        if text and len(self.errors) < MAX_MESSAGES:
            self.errors.append(f"rank {self.rank}: {text}")
        return text

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def local_backend(self) -> Backend:
        """The node-local tier as a POSIX backend rooted at this job's directory there."""
        if self._local_backend is None:
            self._local_backend = PosixBackend(str(self.local))
        return self._local_backend

    @property
    def drain_backend(self) -> Backend:
        """Where the storage copy goes: the target, over the drain's own connection when
        it has one (a thread must not share the rank's: one kept-alive HTTP connection)."""
        return self.drain_connection or self.backend

    def local_file(self, position: int, replica: bool, version: int = 0) -> str | bytes:
        """A shard's file (of `version`, else the current one) on this node's local tier
        (the local backend's path)."""
        name = shard_name(version or self.version, position)
        return self.local_backend.path(f"replica-{name}" if replica else name)

    def storage_file(self, position: int, version: int = 0) -> str | bytes:
        name = shard_name(version or self.version, position)
        return self.backend.path(f"{storage_dir(self.spec)}/{name}")


def shard_name(version: int, position: int) -> str:
    """A shard's file name on every tier (a replica's: with replica- before it)."""
    return f"v{version:04d}-p{position:05d}"



def save_in_tiers(state: Rank, hosts: tuple[str, ...],
                  interrupted: Callable[[], bool] = lambda: False) -> list[LayoutRun]:
    """The tiers of tiers.versions saves (stampede.run.rejoin's docstring, 1.), as three
    layouts of an iteration per version; after each, what each tier no longer keeps
    released (op unlink). A version that failed on any rank (a dead or hung storage
    server: each op failed within its timeout, a row with ok 0 and said), or a signal
    (`interrupted`, on any rank), ends the save there, agreed by every rank: the versions
    saved so far and the one cut short are the layouts' iterations (the tiers that
    completed valid, the one that failed invalid), nothing is released (the failed
    version was not published), and state.stopped says why."""
    comm, roles = state.comm, state.roles
    position = roles.position_of(state.rank, after_loss=False)
    working = mpi.split(comm, int(position < 0), key=state.rank)
    rows: dict[str, list[Row]] = {layout: [] for layout in TIER_SAVES}
    origins: dict[int, int] = {}
    reached = []   # per version: each tier's save, then the publish, from its origin (ns)
    for iteration in range(state.spec.tier_versions):
        state.version = iteration + 1
        saved: dict[str, list[Row]] = {layout: [] for layout in TIER_SAVES}
        origins[iteration] = origin = _save_version(state, position, saved)
        reached.append(_reached(saved, origin))
        agreed = mpi.allreduce_sum(comm, np.array([int(bool(state.errors)), int(interrupted())]))
        failed, stopped = (int(agreed[0]), int(agreed[1])) if agreed is not None else (1, 0)
        if not failed:
            _release(state, position, saved)
        for layout in TIER_SAVES:
            rows[layout] += [(iteration, *row[1:]) for row in saved[layout]]
        if failed or stopped:
            state.stopped = (f"version {state.version} failed on {failed} rank(s)" if failed
                             else "stopped by a signal")
            break
    runs = []
    working_hosts = tuple(hosts[r] for r in roles.working)
    for layout in TIER_SAVES:   # a spare took no part: its runs are empty
        runs.append(layout_run(working, state, layout, rows[layout], origins,
                                working_hosts, "save") if position >= 0
                    else LayoutRun(layout, 0, None, (), "", phase="save"))
    mpi.free(working, comm)
    return unprotected_by_tier(runs, mpi.gather(comm, reached), state.spec.tier_publish)


def _save_version(state: Rank, position: int, rows: dict[str, list[Row]]) -> int:
    """One version through the tiers, from the barrier that starts it (its origin, back)
    to the barrier once every tier of every shard is written."""
    comm, roles = state.comm, state.roles
    digest = ""
    if position >= 0:
        digest = _fill(state, position)
    state.digests = list(mpi.bcast(comm, _gathered_digests(comm, roles, digest)))
    mpi.barrier(comm)
    origin = time.perf_counter_ns()
    drain: threading.Thread | None = None
    failure: list[BaseException] = []   # what the drain raised: re-raised after its join
    if position >= 0:
        failed = state.failed(write_file(state.local_backend, state.local_file(position, False),
                                         state.shard.view, state.spec.block_bytes,
                                         rows["tier-local"]))
        rows["tier-local"].append((0, SAVE, origin, time.perf_counter_ns(), state.shard_bytes,
                                   int(not failed)))
        if state.spec.tier_drain == "background":
            drain = threading.Thread(target=_drain, args=(state, position, rows["tier-storage"],
                                                          origin, failure), name="stampede-drain")
            drain.start()
    _publish_at(state, "local", rows, origin)
    _replicate(state, position, rows["tier-peer"], origin)
    _publish_at(state, "peer", rows, origin)
    if position >= 0:
        if drain is None:
            _drain(state, position, rows["tier-storage"], origin, failure)
        blocked = time.perf_counter_ns()   # the rank could train again: what is left drains
        for layout in TIER_SAVES:
            rows[layout].append((0, BLOCKED, origin, blocked, 0, 1))
    if drain is not None:
        drain.join()
    if failure:
        raise failure[0]
    _publish_at(state, "storage", rows, origin)
    mpi.barrier(comm)   # every tier of every shard written: the version's layouts complete
    return origin


def _reached(rows: dict[str, list[Row]], origin: int) -> tuple[int, ...]:
    """When this rank's shard was on each tier, and (rank 0) the version published, from
    the version's origin in ns (-1: not here)."""
    stops = [max((row[3] - origin for row in rows[layout] if row[1] == SAVE), default=-1)
             for layout in TIER_SAVES]
    return (*stops, max((row[3] - origin for layout in TIER_SAVES for row in rows[layout]
                         if row[1] == PUBLISHED), default=-1))


def _release(state: Rank, position: int, rows: dict[str, list[Row]]) -> None:
    """Retention, once the version is on every tier and published: the version each tier
    no longer keeps (tiers.keep_local, keep_peer, keep_storage) removed, timed (unlink)
    in that tier's layout; what fails is a row with ok 0, and said."""
    spec, version = state.spec, state.version
    peer = version - spec.keep_peer
    released = [("tier-peer", state.local_backend, state.local_file(p, True, peer))
                for p in state.roles.held_by(state.rank) if peer >= 1]
    if position >= 0:
        local, storage = version - spec.keep_local, version - spec.keep_storage
        released += [(layout, backend, path) for layout, backend, path, old in (
            ("tier-local", state.local_backend, state.local_file(position, False, local), local),
            ("tier-storage", state.backend, state.storage_file(position, storage), storage))
            if old >= 1]
    for layout, backend, path in released:
        start = time.perf_counter_ns()
        try:
            backend.unlink(path)
        except OSError as error:
            rows[layout].append((0, UNLINK, start, time.perf_counter_ns(), 0, 0))
            state.failed(f"release {os.fsdecode(path)}: {error.strerror or error}")
            continue
        rows[layout].append((0, UNLINK, start, time.perf_counter_ns(), 0, 1))


def _drain(state: Rank, position: int, rows: list[Row], origin: int,
           failure: list[BaseException]) -> None:
    """The storage copy, timed (a thread of its own with tiers.drain = background: its own
    connection to the target, so the rank's goes on untouched); what it raised (an
    OSError is a row, never raised) in `failure`."""
    try:
        failed = state.failed(_write_storage(state, position, rows))
        rows.append((0, SAVE, origin, time.perf_counter_ns(), state.shard_bytes, int(not failed)))
    except BaseException as error:   # re-raised by the rank after join
        failure.append(error)


def _publish_at(state: Rank, tier: str, rows: dict[str, list[Row]], origin: int) -> None:
    """At the protection level tiers.publish names: once every rank's shard is there and
    on every tier below it (a collective: _save_version calls this for a tier only after
    the rank's copies to the tiers below are done, the drain joined before storage's),
    rank 0 publishes the version (its manifest); `published` a row of that tier's layout.
    Where any of those copies failed on any rank, the version is not published."""
    if tier != state.spec.tier_publish:
        return
    level = TIERS.index(tier)
    broken = any(row[5] == 0 for layout in TIER_SAVES[:level + 1] for row in rows[layout])
    agreed = mpi.allreduce_sum(state.comm, np.array([int(broken)]))   # and the barrier
    if agreed is None or agreed[0]:
        return   # a copy failed on some rank (said there): the version is not published
    if state.rank == 0:
        _publish(state, rows[TIER_SAVES[level]], origin)


def unprotected_by_tier(runs: list[LayoutRun], reached: list[list[tuple[int, ...]]] | None,
                        publish: str) -> list[LayoutRun]:
    """Each tier's unprotected window (rank 0, where the statistics are; `reached`: every
    rank's _reached per version): how long a published version was not yet on that tier
    on every node, the longest over the versions.

    Publishing at a tier (tiers.publish) means the version is durable on that tier AND on
    every tier below it (TIERS' order: local, peer, storage): the publish waits, behind a
    barrier, until every rank's copies to all of them are done (_save_version), so their
    window is 0 by definition, never a difference of stamps. Only a tier above the publish
    level has a window: from the publish to that tier's last rank. (Comparing stamps of
    different ranks for the tiers below would measure only how late each rank left the
    barrier that started the version: on a busy machine, a few ms of nothing.) Retention
    releases a version only once a newer one is published, so it opens no window."""
    if reached is None:
        return runs
    level = TIERS.index(publish)
    windows = {}
    for index, layout in enumerate(TIER_SAVES):
        gaps = []
        for version in range(len(reached[0])):
            published = max(rank[version][-1] for rank in reached)
            if published >= 0:
                done = max(rank[version][index] for rank in reached)
                gaps.append(0.0 if index <= level else max(0, done - published) / NS_PER_S)
        if gaps:
            windows[layout] = max(gaps)
    return [replace(run, stats=replace(run.stats, unprotected_s=windows[run.layout]))
            if run.stats is not None and run.layout in windows else run for run in runs]


def _gathered_digests(comm: mpi.Comm, roles: Roles, digest: str) -> list[str]:
    found = mpi.gather(comm, digest)
    if found is None:
        return []
    return [found[rank] for rank in roles.working]


def _fill(state: Rank, position: int) -> str:
    """Untimed: this position's content (a pure function of the position, as prepare's
    is of the file) and its run.verify hash."""
    content, block = ContentSource(state.spec.block_bytes), state.spec.block_bytes
    view = state.shard.view
    for offset in range(0, state.shard_bytes, block):
        content.fill(view[offset:offset + block], f"tiers/{shard_name(state.version, position)}",
                     offset)
    return digest_of(state.spec, view)


def digest_of(spec: JobSpec, view: memoryview) -> str:
    if spec.verify == "none":
        return ""
    digest = new_digest(spec.verify)
    digest.update(view)
    return str(digest.hexdigest())


def _replicate(state: Rank, position: int, rows: list[Row], origin: int) -> None:
    """The shard to its holders, the replicas this rank holds from their savers, each
    written to the local tier and acknowledged; `save` once every holder acknowledged."""
    roles, comm, clock = state.roles, state.comm, time.perf_counter_ns
    held = roles.held_by(state.rank)
    start = clock()
    requests = [comm.Irecv(buffer.view, source=roles.working[p], tag=TAG_REPLICA)
                for p, buffer in zip(held, state.incoming)]
    if position >= 0:
        requests += [comm.Isend(state.shard.view, dest=holder, tag=TAG_REPLICA)
                     for holder in roles.holders[position]]
    wait_all(requests)
    rows.append((0, PEER, start, clock(), state.shard_bytes * len(held), 1))
    acks = []   # 0: the replica is durable here; 1: it is not (the saver is told, no hang)
    flags = np.zeros(len(held), dtype=np.int64)   # outlive their sends
    for index, (p, buffer) in enumerate(zip(held, state.incoming)):
        flags[index] = bool(state.failed(write_file(state.local_backend, state.local_file(p, True),
                                                    buffer.view, state.spec.block_bytes, rows)))
        acks.append(comm.Isend(flags[index:index + 1], dest=roles.working[p], tag=TAG_ACK))
    if position >= 0:
        received = [np.zeros(1, dtype=np.int64) for _ in roles.holders[position]]
        wait_all([comm.Irecv(flag, source=holder, tag=TAG_ACK)
                  for flag, holder in zip(received, roles.holders[position])])
        protected = not any(int(flag[0]) for flag in received)
        rows.append((0, SAVE, origin, clock(), state.shard_bytes, int(protected)))
    wait_all(acks)


def wait_all(requests: list[mpi.Request]) -> None:
    """Every request done, waiting politely (MPICH's Waitall spins a core)."""
    for request in requests:
        while not request.Test():
            time.sleep(0.0002)


def _write_storage(state: Rank, position: int, rows: list[Row]) -> str:
    """The shard on the job's target; on an object store one PUT of the whole shard
    (write), durable when it is answered. What failed, or ""."""
    store = object_store(state.drain_backend)
    if store is None:
        return write_file(state.drain_backend, state.storage_file(position), state.shard.view,
                          state.spec.block_bytes, rows)
    start = time.perf_counter_ns()
    try:
        store.put_object(state.storage_file(position), (state.shard.view,))
    except OSError as error:
        rows.append((0, WRITE, start, time.perf_counter_ns(), 0, 0))
        return f"PUT {state.storage_file(position)!s}: {error.strerror or error}"
    rows.append((0, WRITE, start, time.perf_counter_ns(), state.shard.nbytes, 1))
    return ""


def write_file(backend: Backend, path: str | bytes, view: memoryview, block: int, rows: list[Row]) -> str:
    """create (O_EXCL), write (blocks), fsync, close of one file, timed op by op; what
    failed ("" when nothing did: an error is a row with ok 0, never raised, so that no
    rank leaves the others waiting in the exchanges that follow)."""
    clock = time.perf_counter_ns
    start = clock()
    try:
        handle = backend.creator(False)(path)
    except OSError as error:
        rows.append((0, CREATE, start, clock(), 0, 0))
        return f"create {os.fsdecode(path)}: {error.strerror or error}"
    rows.append((0, CREATE, start, clock(), 0, 1))
    failed = ""
    try:
        for offset in range(0, len(view), block):
            piece = view[offset:offset + block]
            start = clock()
            count = backend.write_from(handle, piece, offset)
            rows.append((0, WRITE, start, clock(), count, int(count == len(piece))))
            if count != len(piece):
                return f"write {os.fsdecode(path)} at {offset}: {count} of {len(piece)} bytes"
        start = clock()
        backend.sync(handle)
        rows.append((0, FSYNC, start, clock(), 0, 1))
    except OSError as error:
        rows.append((0, WRITE, start, clock(), 0, 0))
        failed = f"write {os.fsdecode(path)}: {error.strerror or error}"
    finally:
        start = clock()
        with contextlib.suppress(OSError):
            backend.close(handle)
        rows.append((0, CLOSE, start, clock(), 0, 1))
    return failed


def _publish(state: Rank, rows: list[Row], origin: int) -> None:
    """Rank 0: the version's manifest on storage (what a restart reads to find its shards)."""
    manifest = {"version": state.version, "positions": len(state.roles.working),
                "shard_bytes": state.shard_bytes,
                "verify": state.spec.verify, "digests": state.digests,
                "holders": [list(h) for h in state.roles.holders]}
    try:
        state.backend.put_bytes(f"{storage_dir(state.spec)}/manifest.json",
                                json.dumps(manifest).encode())
    except OSError as error:   # a row with ok 0, said: never raised on rank 0 alone
        rows.append((0, PUBLISHED, origin, time.perf_counter_ns(), 0, 0))
        state.failed(f"publish v{state.version:04d} (its manifest): {error.strerror or error}")
        return
    rows.append((0, PUBLISHED, origin, time.perf_counter_ns(), 0, 1))


def local_tier(spec: JobSpec, host: str) -> Path:
    """This job's directory on a node's local tier (its host's, under tiers.local_dir)."""
    return Path(spec.tier_dir) / host / f"stampede-{spec.name}"


def storage_dir(spec: JobSpec) -> str:
    """The storage tier's directory under the target (its own: removed whole after)."""
    return f"tiers-{spec.name}"


def layout_run(comm: mpi.Comm, state: Rank, layout: str, rows: list[Row], origins: dict[int, int],
                hosts: tuple[str, ...], phase: str) -> LayoutRun:
    """The layout's statistics over the ranks that took part (`comm`), on its rank 0."""
    array = np.array(rows, dtype=np.int64).reshape(-1, 6)
    measured = array[array[:, 0] >= 0]
    completion = "save" if phase == "save" else "restore"
    stats = exact_stats(comm, layout, measured, origins, hosts, completion)
    said = mpi.gather(comm, list(state.errors))
    state.errors = []
    messages = tuple(text for part in said or [] for text in part)
    done = measured[measured[:, 1] == OP_CODE[completion]]
    total = mpi.allreduce_sum(comm, np.array([int((done[:, 5] == 0).sum())]))
    short = int(total[0]) if total is not None else 0
    invalid = f"{short} of the {completion}s did not complete: {messages[0]}" \
        if short and messages else (f"{short} of the {completion}s did not complete" if short else "")
    return LayoutRun(layout=layout, bytes_per_rank=state.shard_bytes, stats=stats,
                     messages=messages, invalid_reason=invalid, phase=phase)
