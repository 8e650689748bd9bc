"""run.verify and run.check_finite: hashing and the finiteness test over the bytes a rank
read, timed as one op (verify) apart from the reads, and, after a mismatch, the untimed
re-read that says which bytes differ."""

from __future__ import annotations

import time
from typing import Any

from stampede.checkpoint.formats import read_fully
from stampede.checkpoint.plan import Extent
from stampede.ops import OP_CODE
from stampede.run.digests import new_digest
from stampede.run.outcome import Log, PhaseOutcome
from stampede.run.setup import RankSetup

VERIFY = OP_CODE["verify"]
MAX_DIGESTS = 4096   # per rank and phase: what an existing checkpoint's sidecar keeps


class Check:
    """run.verify and run.check_finite over one extent, block by block: hashing and the
    finiteness test are timed together as one verify op (their summed time), apart from
    the reads, so read latencies and GB/s stay the storage's."""

    def __init__(self, setup: RankSetup, extent: Extent, base: int | None = None) -> None:
        self.setup, self.extent, self.base = setup, extent, base   # base: tensor's file offset
        self.digest = new_digest(setup.verify) if setup.verify != "none" else None
        self.dtype = setup.finite_dtype
        if setup.finite_dtype and setup.tensor_dtypes is not None:
            self.dtype = setup.tensor_dtypes.get(extent.tensor, "")   # not a float: unchecked
        self.nonfinite, self.first_ns, self.spent_ns = 0, 0, 0

    def update(self, view: memoryview) -> None:
        start = time.perf_counter_ns()
        if self.digest is not None:
            self.digest.update(view)
        if self.dtype:
            from stampede.checkpoint.formats import nonfinite_count
            self.nonfinite += nonfinite_count(view, self.dtype)
        self.spent_ns += time.perf_counter_ns() - start
        self.first_ns = self.first_ns or start

    def verdict(self, iteration: int, log: Log, outcome: PhaseOutcome,
                fetch: Any) -> None:
        """Log the verify op; on a mismatch say which bytes differ (untimed)."""
        setup, extent = self.setup, self.extent
        rank, where = setup.plan.rank, f"{extent.relpath}" + (
            f" tensor {extent.tensor}" if extent.tensor else "")
        span = f"bytes {extent.offset}..{extent.offset + extent.length}"
        matches = True
        unrecorded = False
        if self.digest is not None and setup.expected is not None:
            wanted = setup.expected.get((extent.relpath, extent.tensor, extent.offset))
            unrecorded = wanted is None
            matches = not unrecorded and self.digest.hexdigest() == wanted
        if self.digest is not None and setup.record_digests and \
                len(outcome.digests) < MAX_DIGESTS:
            outcome.digests.append({
                "rank": rank, "path": extent.relpath, "tensor": extent.tensor,
                "offset": extent.offset, "file_offset": (self.base or 0) + extent.offset,
                "length": extent.length, setup.verify: self.digest.hexdigest()})
        good = matches and not self.nonfinite
        log.append((iteration, VERIFY, self.first_ns, self.first_ns + self.spent_ns,
                    extent.length, int(good)))
        if unrecorded:
            outcome.fail(f"rank {rank}: verify {where} {span}: the manifest records no "
                         f"{setup.verify} for these bytes: not verified")
        elif not matches:
            outcome.corrupt = True
            from stampede.checkpoint.corruption import describe_difference
            outcome.fail(f"rank {rank}: verify {where} {span}: {setup.verify} differs from "
                         f"what prepare wrote; " + describe_difference(
                             setup.plan.hold, extent, setup.content_block_bytes, fetch, self.base))
        if self.nonfinite:
            outcome.corrupt = True
            outcome.fail(f"rank {rank}: verify {where} {span}: {self.nonfinite} element(s) "
                         f"are NaN or Inf as {self.dtype}")


def reread(setup: RankSetup, relpath: str, offset: int, length: int) -> memoryview:
    """Untimed, only after a failed check: the bytes at a file offset, read again through
    a handle of its own (never O_DIRECT, whose alignment rules a bytearray breaks)."""
    view = memoryview(bytearray(length))
    handle = setup.backend.opener(False)(setup.paths[relpath])
    try:
        done = read_fully(setup.backend, handle, view, offset)
    finally:
        setup.backend.close(handle)
    return view[:done]


def verify_held(setup: RankSetup, iteration: int, log: Log, outcome: PhaseOutcome) -> None:
    """After an exchange: the whole held shard, checked in memory (outside restore)."""
    hold = setup.plan.hold
    check = Check(setup, hold)
    check.update(setup.buffer.view[:hold.length])
    check.verdict(iteration, log, outcome,
                  lambda at, length: setup.buffer.view[at - hold.offset:at - hold.offset + length])
