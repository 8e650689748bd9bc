"""The timed pattern: what one rank does in one phase, stamp by stamp.

Each op is timed alone, with `perf_counter_ns` read immediately before and after the call;
bookkeeping (appending the sample, hashing for verify, deadline checks) happens outside
those stamps. Errors are counted per op, never raised: a rank that fails keeps its place
in the collectives that follow, so nothing hangs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.plan import RankPlan
from stampede.samples import OP_CODE

STAT, OPEN, READ, CLOSE, VERIFY, RESTORE = (OP_CODE[name] for name in
                                            ("stat", "open", "read", "close", "verify", "restore"))
MAX_MESSAGES = 10


class DeadlineExceeded(Exception):
    pass


@dataclass
class PhaseOutcome:
    """What one rank saw in one phase, beyond its samples."""

    errors: int = 0
    timed_out: bool = False
    messages: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.errors += 1
        if len(self.messages) < MAX_MESSAGES:
            self.messages.append(text)


def _describe(error: OSError, direct: bool) -> str:
    text = os.strerror(error.errno) if error.errno else str(error)
    if direct and error.errno == errno.EINVAL:
        text += " (O_DIRECT refused: the file system may not support it)"
    return text


def run_pattern(plan: RankPlan, backend: Backend, paths: dict[str, Any], buffer: AlignedBuffer,
                iteration: int, origin_ns: int, deadline_ns: int, direct: bool,
                expected_sha256: dict[tuple[str, int], str] | None,
                log: list[tuple[int, int, int, int, int, int]]) -> PhaseOutcome:
    """Run the plan's ops once; append samples (absolute stamps) to `log`."""
    outcome = PhaseOutcome()
    handles: dict[str, list[Any]] = {relpath: [] for relpath in plan.files}
    restore_stop, nbytes = 0, 0
    try:
        for op in plan.ops:
            if op == "stat":
                _stat(plan, backend, paths, iteration, deadline_ns, log, outcome)
            elif op == "open":
                _open(plan, backend, paths, handles, iteration, deadline_ns, direct, log, outcome)
            elif op == "read":
                restore_stop, nbytes = _read(plan, backend, handles, buffer, iteration, deadline_ns,
                                     expected_sha256, log, outcome)
            elif op == "close":
                _close(plan, backend, handles, iteration, log, outcome)
    except DeadlineExceeded:
        outcome.timed_out = True
        outcome.fail(f"rank {plan.rank}: deadline reached before the pattern finished")
    finally:
        for fds in handles.values():  # untimed: ops after the deadline, or no close op
            for handle in fds:
                backend.close(handle)
    end = restore_stop or time.perf_counter_ns()
    complete = outcome.errors == 0 and not outcome.timed_out
    log.append((iteration, RESTORE, origin_ns, end, nbytes, int(complete)))
    return outcome


def _stat(plan: RankPlan, backend: Backend, paths: dict[str, Any], iteration: int,
          deadline_ns: int, log: list[Any], outcome: PhaseOutcome) -> None:
    clock, stat, append = time.perf_counter_ns, backend.stat, log.append
    for relpath in plan.files:
        path = paths[relpath]
        for _ in range(plan.stat_count):
            start = clock()
            try:
                stat(path)
            except OSError as error:
                stop = clock()
                append((iteration, STAT, start, stop, 0, 0))
                outcome.fail(f"rank {plan.rank}: stat {relpath}: {_describe(error, False)}")
                continue
            stop = clock()
            append((iteration, STAT, start, stop, 0, 1))
            if stop > deadline_ns:
                raise DeadlineExceeded


def _open(plan: RankPlan, backend: Backend, paths: dict[str, Any], handles: dict[str, list[Any]],
          iteration: int, deadline_ns: int, direct: bool, log: list[Any],
          outcome: PhaseOutcome) -> None:
    clock, open_, append = time.perf_counter_ns, backend.opener(direct), log.append
    for relpath in plan.files:
        path, fds = paths[relpath], handles[relpath]
        for _ in range(plan.open_count):
            start = clock()
            try:
                handle = open_(path)
            except OSError as error:
                stop = clock()
                append((iteration, OPEN, start, stop, 0, 0))
                outcome.fail(f"rank {plan.rank}: open {relpath}: {_describe(error, direct)}")
                continue
            stop = clock()
            fds.append(handle)
            append((iteration, OPEN, start, stop, 0, 1))
            if stop > deadline_ns:
                raise DeadlineExceeded


def _read(plan: RankPlan, backend: Backend, handles: dict[str, list[Any]], buffer: AlignedBuffer,
          iteration: int, deadline_ns: int, expected_sha256: dict[tuple[str, int], str] | None,
          log: list[Any], outcome: PhaseOutcome) -> tuple[int, int]:
    """Read every block of every extent; returns (stop stamp of the last read, bytes read)."""
    clock, read_into, append = time.perf_counter_ns, backend.read_into, log.append
    last_stop, nbytes = 0, 0
    for extent in plan.extents:
        fds = handles[extent.relpath]
        if not fds:
            outcome.fail(f"rank {plan.rank}: read {extent.relpath}: not read, its open failed")
            continue
        handle = fds[-1]
        digest = hashlib.sha256() if expected_sha256 is not None else None
        verify_first, verify_ns = 0, 0
        for offset, length in extent.blocks(plan.block_bytes):
            view = buffer.prefix(length)
            start = clock()
            try:
                count = read_into(handle, view, offset)
            except OSError as error:
                stop = clock()
                append((iteration, READ, start, stop, 0, 0))
                outcome.fail(f"rank {plan.rank}: read {extent.relpath} at {offset}: "
                             f"{_describe(error, False)}")
                digest = None
                break
            stop = last_stop = clock()
            if count != length:
                append((iteration, READ, start, stop, count, 0))
                outcome.fail(f"rank {plan.rank}: read {extent.relpath} at {offset}: short read, "
                             f"{count} of {length} bytes (truncated file?)")
                digest = None
                break
            append((iteration, READ, start, stop, count, 1))
            nbytes += count
            if digest is not None:
                hash_start = clock()
                digest.update(view)
                verify_ns += clock() - hash_start
                verify_first = verify_first or hash_start
            if stop > deadline_ns:
                raise DeadlineExceeded
        if digest is not None and expected_sha256 is not None:
            # verify is timed as its own op (hashing time summed over the extent's blocks)
            # so the read latencies and GB/s stay those of the storage.
            matches = digest.hexdigest() == expected_sha256[(extent.relpath, extent.offset)]
            append((iteration, VERIFY, verify_first, verify_first + verify_ns, extent.length,
                    int(matches)))
            if not matches:
                outcome.fail(f"rank {plan.rank}: verify {extent.relpath} bytes {extent.offset}.."
                             f"{extent.offset + extent.length}: sha256 differs from the manifest")
    return last_stop, nbytes


def _close(plan: RankPlan, backend: Backend, handles: dict[str, list[Any]], iteration: int,
           log: list[Any], outcome: PhaseOutcome) -> None:
    clock, close, append = time.perf_counter_ns, backend.close, log.append
    for relpath, fds in handles.items():
        while fds:
            handle = fds.pop()
            start = clock()
            try:
                close(handle)
            except OSError as error:
                stop = clock()
                append((iteration, CLOSE, start, stop, 0, 0))
                outcome.fail(f"rank {plan.rank}: close {relpath}: {_describe(error, False)}")
                continue
            stop = clock()
            append((iteration, CLOSE, start, stop, 0, 1))
