"""The timed pattern: what one rank does in one phase, stamp by stamp.

Each op is timed alone, with `perf_counter_ns` read immediately before and after the call;
bookkeeping (appending the sample, hashing for verify, deadline checks) happens outside
those stamps. Errors are counted per op, never raised: a rank that fails keeps its place
in the collectives that follow (an exchange, the end-of-phase reduction), so nothing hangs.

The stat, open and close loops look alike on purpose: a shared helper taking the op as a
function would add a Python call between the stamps of every timed op. A pass of only
stat, open and close runs none of them: it is one compiled call (metadata_loop), where the
interpreter between two ops would be a sixth of an open and close pair. For the same
reason the read loop (_read) stays one function, the longest of the package (~70 lines):
every block's bookkeeping sits between its stamps' neighbours, not behind a call.

pattern.order = "file" runs the same loops once per file (metadata_loop.passes): the calls between
two files' ops are outside every stamp. A restore ends at its last read, as by op: the
closes of the files before the last one then fall inside it (mdtest -E's order).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from stampede import mpi
from stampede.checkpoint.formats import parse_header
from stampede.ops import OP_CODE, STORAGE_OPS
from stampede.run.checks import Check, reread, verify_held
from stampede.run.metadata_loop import passes
from stampede.run.outcome import Log, PhaseOutcome, describe
from stampede.run.setup import RankSetup
from stampede.run.where import NOWHERE
from stampede.units import NS_PER_S, format_plain

(JITTER, LIST, INDEX, STAT, OPEN, HEADER, READ, TTFB, CLOSE, WAIT, BCAST, ALLGATHER, SCATTER,
 VERIFY, RESTORE, H2D, D2H) = (OP_CODE[name] for name in (
     "jitter", "list", "index", "stat", "open", "header", "read", "ttfb", "close", "wait",
     "bcast", "allgather", "scatter", "verify", "restore", "h2d", "d2h"))
STORAGE_CODES = frozenset(OP_CODE[name] for name in STORAGE_OPS)


class DeadlineExceeded(Exception):
    pass


def run_pattern(setup: RankSetup, iteration: int, origin_ns: int, deadline_ns: int,
                jitter_s: float, log: Log) -> PhaseOutcome:
    """Run the plan once; append samples (absolute stamps) to `log`."""
    plan, outcome = setup.plan, PhaseOutcome()
    first_sample = len(log)
    handles: dict[str, list[object]] = {relpath: [] for relpath in plan.files}
    # passes_stop: where the rank's last op of the passes ended, the restore's end where no
    # read or exchange ends it (bookkeeping after it, the untimed closes, are stampede's)
    restore_stop, nbytes, passes_stop = 0, 0, 0
    try:
        if jitter_s > 0:
            start = time.perf_counter_ns()
            time.sleep(jitter_s)
            log.append((iteration, JITTER, start, time.perf_counter_ns(), 0, 1))
        if plan.list_dir:
            _list(setup, iteration, log, outcome)
        if plan.index_file:
            _index(setup, iteration, log, outcome)
        if setup.leads and setup.prefetch is not None:
            setup.prefetch.next_iteration()   # once per iteration, whatever the order
        if setup.program is not None:   # stat, open and close only: one compiled call
            late, passes_stop = setup.program.run(plan.rank, handles, iteration, deadline_ns,
                                                  log, outcome, setup.where)
            if late:
                raise DeadlineExceeded
        # once an iteration, not once a file: by file, a pass is one file's ops
        open_ = setup.backend.opener(setup.direct, setup.follow_links)
        for files, indices in passes(plan) if setup.leads and setup.program is None else ():
            for op in plan.ops:
                if op == "stat":
                    _stat(setup, files, iteration, deadline_ns, log, outcome)
                elif op == "open":
                    _open(setup, open_, files, handles, iteration, deadline_ns, log, outcome)
                elif op == "read":
                    stop, count = _read(setup, indices, handles, iteration, deadline_ns, log,
                                        outcome)
                    restore_stop, nbytes = stop or restore_stop, nbytes + count
                elif op == "close":
                    _close(setup, files, handles, iteration, log, outcome)
    except DeadlineExceeded:
        outcome.timed_out = True
        outcome.fail(f"rank {plan.rank}: deadline reached before the pattern finished")
    finally:
        passes_stop = passes_stop or time.perf_counter_ns()   # before the untimed closes
        for fds in handles.values():  # untimed: ops after the deadline, or no close op
            for handle in fds:
                setup.backend.close(handle)
    # A rank holds all its bytes when it read every planned byte without running out of
    # time; failed ops that did not cost bytes (a stat, a spare open) leave it complete.
    read_all = nbytes == (sum(e.length for e in plan.extents) if setup.leads else 0)
    complete = read_all and not outcome.timed_out if "read" in plan.ops else not outcome.errors
    if plan.exchange:  # collective: every member takes part, even one that failed
        if setup.on_device and setup.leads and read_all and not hasattr(setup.backend,
                                                                         "read_device"):
            _h2d_extents(setup, iteration, log)   # nccl: the readers' bytes on to HBM first
        # What a member holds is what its group read: complete only if every reader was.
        restore_stop, complete = _exchange(setup, iteration, deadline_ns, log, complete)
        if setup.checks and complete:
            if setup.on_device:   # the shard is in HBM only: back to host to check it
                _d2h(setup, iteration, 0, setup.buffer.view[:plan.hold.length], log)
            # Checked inside the restore, as the layouts that hash between reads are: every
            # layout's restore time means "holds its bytes, checked".
            verify_held(setup, iteration, log, outcome)
            restore_stop = time.perf_counter_ns()
        if setup.device is not None and not setup.on_device:
            restore_stop = _h2d(setup, iteration, 0, setup.buffer.view[:plan.hold.length], log)
        nbytes = plan.hold.length if complete else 0
    end = restore_stop or passes_stop
    outcome.incomplete = not complete
    # what it holds, not what it read: a whole-file rank reads every slice, keeps its own
    log.append((iteration, RESTORE, origin_ns, end, min(nbytes, plan.needed_bytes),
                int(complete)))
    outcome.ops = sum(1 for row in log[first_sample:] if row[1] in STORAGE_CODES)
    return outcome


def _list(setup: RankSetup, iteration: int, log: Log, outcome: PhaseOutcome) -> None:
    """List the checkpoint directory (every rank, or rank 0 then a broadcast of the names)
    and check that this rank's files are in the listing."""
    plan, clock = setup.plan, time.perf_counter_ns
    names: list[object] | None = None
    if plan.rank == 0 or not plan.list_on_root:
        start = clock()
        try:
            names = setup.backend.list(setup.paths[plan.list_dir])
        except OSError as error:
            log.append((iteration, LIST, start, clock(), 0, 0))
            _where(setup, log, plan.list_dir, NOWHERE)
            outcome.fail(f"rank {plan.rank}: list {plan.list_dir}: {describe(error, False)}")
        else:
            log.append((iteration, LIST, start, clock(), 0, 1))
            _where(setup, log, plan.list_dir, NOWHERE)
    if plan.list_on_root:
        start = clock()
        mpi.barrier(setup.world)  # politely, for rank 0's listing
        start_bcast = clock()
        log.append((iteration, WAIT, start, start_bcast, 0, 1))
        names = mpi.bcast(setup.world, names)
        log.append((iteration, BCAST, start_bcast, clock(), 0, 1))
    listed = set(names or ())
    for relpath in plan.files:
        if names is not None and os.path.basename(setup.paths[relpath]) not in listed:
            outcome.fail(f"rank {plan.rank}: list {plan.list_dir}: {relpath} is not in the "
                         "listing (a restore would find no checkpoint)")


def _index(setup: RankSetup, iteration: int, log: Log, outcome: PhaseOutcome) -> None:
    """Open, read whole, close and (for an existing checkpoint) parse the shared index:
    one timed op, as loaders do it (DCP's .metadata is unpickled, a safetensors index
    JSON-parsed)."""
    plan, backend, clock = setup.plan, setup.backend, time.perf_counter_ns
    view = setup.buffer.prefix(min(setup.buffer.nbytes, plan.block_bytes))
    parse = setup.index_parser
    whole = bytearray() if parse is not None else None
    start, nbytes = clock(), 0
    try:
        handle = backend.opener(False, setup.follow_links)(setup.paths[plan.index_file])
        try:
            while count := backend.read_into(handle, view, nbytes):
                nbytes += count
                if whole is not None:
                    whole += view[:count]
        finally:
            backend.close(handle)
        if parse is not None and whole is not None:
            parse(whole)   # json and pickle take the bytearray as it is: no copy
    except (OSError, ValueError) as error:
        log.append((iteration, INDEX, start, clock(), nbytes, 0))
        _where(setup, log, plan.index_file, 0)
        text = describe(error, False, setup.follow_links) if isinstance(error, OSError) \
            else str(error)
        outcome.fail(f"rank {plan.rank}: index {plan.index_file}: {text}")
        return
    log.append((iteration, INDEX, start, clock(), nbytes, 1))
    _where(setup, log, plan.index_file, 0)


def _stat(setup: RankSetup, files: tuple[str, ...], iteration: int, deadline_ns: int, log: Log,
          outcome: PhaseOutcome) -> None:
    plan = setup.plan
    clock, stat, append = time.perf_counter_ns, setup.backend.stat, log.append
    where = setup.where
    for relpath in files:
        path = setup.paths[relpath]
        file_id = where.file_id(relpath) if where is not None else NOWHERE
        for _ in range(plan.stat_count):
            start = clock()
            try:
                stat(path)
            except OSError as error:
                stop = clock()
                append((iteration, STAT, start, stop, 0, 0))
                if where is not None:
                    where.rows.append((len(log) - 1, file_id, NOWHERE))
                outcome.fail(f"rank {plan.rank}: stat {relpath}: {describe(error, False)}")
                continue
            stop = clock()
            append((iteration, STAT, start, stop, 0, 1))
            if where is not None:
                where.rows.append((len(log) - 1, file_id, NOWHERE))
            if stop > deadline_ns:
                raise DeadlineExceeded


def _open(setup: RankSetup, open_: Callable[..., object], files: tuple[str, ...],
          handles: dict[str, list[object]], iteration: int, deadline_ns: int, log: Log,
          outcome: PhaseOutcome) -> None:
    plan = setup.plan
    clock, append = time.perf_counter_ns, log.append
    where = setup.where
    for relpath in files:
        path, fds = setup.paths[relpath], handles[relpath]
        file_id = where.file_id(relpath) if where is not None else NOWHERE
        for _ in range(plan.open_count):
            start = clock()
            try:
                handle = open_(path)
            except OSError as error:
                stop = clock()
                append((iteration, OPEN, start, stop, 0, 0))
                if where is not None:
                    where.rows.append((len(log) - 1, file_id, NOWHERE))
                outcome.fail(f"rank {plan.rank}: open {relpath}: "
                             f"{describe(error, setup.direct, setup.follow_links)}")
                continue
            stop = clock()
            fds.append(handle)
            append((iteration, OPEN, start, stop, 0, 1))
            if where is not None:
                where.rows.append((len(log) - 1, file_id, NOWHERE))
            if stop > deadline_ns:
                raise DeadlineExceeded


def _read(setup: RankSetup, indices: tuple[int, ...], handles: dict[str, list[object]],
          iteration: int, deadline_ns: int, log: Log, outcome: PhaseOutcome) -> tuple[int, int]:
    """Read every block of the extents at `indices`; returns (stop stamp of the last read
    or 0, bytes read).

    A formatted file's header is read and parsed first (op header), and locates the
    tensors. Blocks go into the reused block buffer, checked block by block when verifying
    (the returned stop is then the last check's end); or, for layouts that exchange, each
    at its place in the held shard (checked after the exchange, inside the restore too).
    With an object store's backend, each read also yields its time to first byte.
    """
    plan, buffer = setup.plan, setup.buffer
    clock, read_into, append = time.perf_counter_ns, setup.backend.read_into, log.append
    ttfb = setup.backend.capabilities.ttfb
    gds = getattr(setup.backend, "read_device", None)   # run.h2d = cuda-gds: file -> HBM
    to_device = setup.device is not None and not setup.holds and gds is None
    checking = setup.checks and not setup.holds
    where = setup.where
    headers: dict[str, dict[str, tuple[int, int]]] = {}
    last_stop, nbytes = 0, 0
    prefetch = setup.prefetch
    for index in indices:
        extent = plan.extents[index]
        # a block's place in device memory: its offset + shift (see RankSetup.places)
        shift = setup.places[index] - extent.offset if setup.places else -plan.hold.offset
        fds = handles[extent.relpath]
        if not fds:
            outcome.say(f"rank {plan.rank}: read {extent.relpath}: not read, its open failed")
            continue
        handle = fds[-1]
        base = 0
        if extent.tensor:
            if extent.relpath not in headers:
                headers[extent.relpath] = _header(setup, extent.relpath, handle, iteration,
                                                  deadline_ns, log, outcome)
            located = headers[extent.relpath].get(extent.tensor)
            if located is None:
                continue   # the header failed: counted there
            base, size = located
            if extent.offset + extent.length > size:
                outcome.fail(f"rank {plan.rank}: read {extent.relpath}: tensor {extent.tensor} "
                             f"holds {size} bytes, the plan needs {extent.offset + extent.length}")
                continue
        check = Check(setup, extent, base) if checking else None
        file_id = where.file_id(extent.relpath) if where is not None else NOWHERE
        for offset, length in extent.blocks(plan.block_bytes):
            if setup.holds:   # at its place in memory (node-once: the node's whole read)
                place = extent.at(plan.hold) + offset - extent.offset
                view = buffer.view[place:place + length]
            else:
                view = buffer.prefix(length)
            if prefetch is not None:   # the kernel asked for the bytes ahead of this block
                prefetch.ahead(extent.relpath, handle, base + extent.offset,
                               base + extent.offset + extent.length, base + offset)
            start = clock()
            try:
                if gds is None:
                    count = read_into(handle, view, base + offset)
                else:
                    count = gds(handle, setup.device_buffer, shift + offset, length, base + offset)
            except OSError as error:
                stop = clock()
                append((iteration, READ, start, stop, 0, 0))
                if where is not None:
                    where.rows.append((len(log) - 1, file_id, base + offset))
                outcome.fail(f"rank {plan.rank}: read {extent.relpath} at {base + offset}: "
                             f"{describe(error, False)}")
                check = None
                break
            stop = last_stop = clock()
            if count != length:
                append((iteration, READ, start, stop, count, 0))
                if where is not None:
                    where.rows.append((len(log) - 1, file_id, base + offset))
                outcome.fail(f"rank {plan.rank}: read {extent.relpath} at {base + offset}: "
                             f"short read, {count} of {length} bytes (truncated file?)")
                check = None
                break
            append((iteration, READ, start, stop, count, 1))
            if where is not None:
                where.rows.append((len(log) - 1, file_id, base + offset))
            if ttfb:
                append((iteration, TTFB, start, setup.backend.first_byte_ns, 0, 1))
            nbytes += count
            if to_device:  # block by block on to HBM
                last_stop = _h2d(setup, iteration, shift + offset, view, log)
            if check is not None:
                if gds is not None:   # the block is in HBM only: back to host to check it
                    _d2h(setup, iteration, shift + offset, view, log)
                check.update(view)
                last_stop = clock()   # the restore holds checked bytes (run.verify)
            if stop > deadline_ns:
                raise DeadlineExceeded
        if check is not None:
            check.verdict(iteration, log, outcome,
                          lambda at, length, r=extent.relpath, b=base: reread(setup, r, b + at,
                                                                               length))
    return last_stop, nbytes


def _header(setup: RankSetup, relpath: str, handle: object, iteration: int, deadline_ns: int,
            log: Log, outcome: PhaseOutcome) -> dict[str, tuple[int, int]]:
    """The timed header op: where this file's wanted tensors are ({} when it failed)."""
    plan, clock = setup.plan, time.perf_counter_ns
    wanted = setup.tensors_of_file.get(relpath, ())
    start = clock()
    try:
        found = parse_header(setup.format, setup.backend, setup.paths[relpath], handle,
                             setup.buffer.view, wanted)
    except OSError as error:
        log.append((iteration, HEADER, start, clock(), 0, 0))
        _where(setup, log, relpath, 0)
        outcome.fail(f"rank {plan.rank}: header {relpath}: {describe(error, False)}")
        return {}
    stop = clock()
    log.append((iteration, HEADER, start, stop, 0, 1))
    _where(setup, log, relpath, 0)
    if stop > deadline_ns:
        raise DeadlineExceeded
    return found


def _where(setup: RankSetup, log: Log, relpath: str, offset: int) -> None:
    """--trace: the last sample's file and offset (ops timed once per file)."""
    if setup.where is not None:
        setup.where.rows.append((len(log) - 1, setup.where.file_id(relpath), offset))


def _h2d(setup: RankSetup, iteration: int, place: int, view: memoryview, log: Log) -> int:
    """Copy bytes just restored on to the device (op h2d); returns the stop stamp."""
    start, stop = setup.device.copy(setup.device_buffer, place, view)
    log.append((iteration, H2D, start, stop, len(view), 1))
    return int(stop)


def _h2d_extents(setup: RankSetup, iteration: int, log: Log) -> None:
    """nccl: what this reader read, each extent at its place, on to the device."""
    for extent, place in zip(setup.plan.extents, setup.places, strict=True):
        view = setup.buffer.view[place:place + extent.length]
        _h2d(setup, iteration, place, view, log)


def _d2h(setup: RankSetup, iteration: int, place: int, view: memoryview, log: Log) -> None:
    """Device -> host (op d2h): bytes that reached HBM without a host copy, for checking."""
    start, stop = setup.device.copy_back(view, setup.device_buffer, place)
    log.append((iteration, D2H, start, stop, len(view), 1))


def _close(setup: RankSetup, files: tuple[str, ...], handles: dict[str, list[object]],
           iteration: int, log: Log, outcome: PhaseOutcome) -> None:
    clock, close, append = time.perf_counter_ns, setup.backend.close, log.append
    where = setup.where
    for relpath in files:
        fds = handles[relpath]
        file_id = where.file_id(relpath) if where is not None else NOWHERE
        while fds:
            handle = fds.pop()
            start = clock()
            try:
                close(handle)
            except OSError as error:
                stop = clock()
                append((iteration, CLOSE, start, stop, 0, 0))
                if where is not None:
                    where.rows.append((len(log) - 1, file_id, NOWHERE))
                outcome.fail(f"rank {setup.plan.rank}: close {relpath}: {describe(error, False)}")
                continue
            stop = clock()
            append((iteration, CLOSE, start, stop, 0, 1))
            if where is not None:
                where.rows.append((len(log) - 1, file_id, NOWHERE))


def _exchange(setup: RankSetup, iteration: int, deadline_ns: int, log: Log,
              complete: bool) -> tuple[int, bool]:
    """Wait (politely, timed as `wait`) for the group's storage readers, learning whether
    every one of them holds its bytes, then move the shard over MPI (timed as `bcast` or
    `allgather`). Returns (the stop stamp, whether the group's bytes are complete)."""
    plan, clock, group = setup.plan, time.perf_counter_ns, setup.group
    assert group is not None   # build_setup split it: the layout exchanges
    start = clock()
    timeout_s = max(deadline_ns - start, 0) / NS_PER_S + 10.0
    missing = mpi.allreduce_sum(group, np.array([int(not complete)]), timeout_s=timeout_s)
    if missing is None or not mpi.barrier(group, timeout_s=timeout_s):
        mpi.abort(group, f"rank {plan.rank}: its {plan.exchange} group did not gather "
                         f"within {format_plain(timeout_s)} s")
        raise AssertionError("unreachable")
    start_exchange = clock()   # the barrier aligned the members' exits: they start together
    log.append((iteration, WAIT, start, start_exchange, 0, 1))
    view = setup.buffer.view[:plan.hold.length]
    # bytes = what reached this rank over the network: nothing for the root of a Bcast,
    # the others' stripes for an Allgatherv (so agg GB/s is the network's, not N/(N-1) x)
    if setup.torch is not None:   # run.exchange = torch: the group's steady-state collective
        setup.torch.exchange(plan.exchange)
        stop = clock()
        log.append((iteration, BCAST if plan.exchange == "bcast" else ALLGATHER, start_exchange,
                    stop, received_bytes(setup), 1))
    elif plan.exchange == "bcast":
        mpi.bcast_bytes(group, view)
        stop = clock()
        received = 0 if setup.leads else plan.hold.length
        log.append((iteration, BCAST, start_exchange, stop, received, 1))
    elif plan.exchange == "scatter":
        mpi.scatter_bytes(group, setup.buffer.view, setup.scatter, plan.hold.length)
        stop = clock()
        received = 0 if setup.leads else plan.hold.length
        log.append((iteration, SCATTER, start_exchange, stop, received, 1))
    else:
        mpi.allgather_bytes(group, view, setup.stripes)
        stop = clock()
        own = sum(extent.length for extent in plan.extents)
        log.append((iteration, ALLGATHER, start_exchange, stop, plan.hold.length - own, 1))
    return stop, int(missing[0]) == 0


def received_bytes(setup: RankSetup) -> int:
    """What reaches this rank in its group's exchange: nothing for a broadcast's root, the
    others' stripes for an allgather (so agg GB/s is the network's, not N/(N-1) x)."""
    plan = setup.plan
    if plan.exchange in ("bcast", "scatter"):
        return 0 if setup.leads else plan.hold.length
    return plan.hold.length - sum(extent.length for extent in plan.extents)
