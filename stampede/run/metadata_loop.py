"""A rank's metadata-only pass as one compiled program (stampede/oploop.c): where
pattern.ops holds only stat, open and close, the steps are built once per layout (untimed)
and each iteration runs them in one C call, each op stamped in C around its call; the
samples, `where` rows and errors are then kept as the pattern's Python loops keep theirs,
in the same order, with the same messages (tests/run/test_metadata_loop.py runs both).

Why: between two ops the interpreter spends 2-3 us (the loop, the stamps, the sample), a
sixth of a pair of an open and a close that takes 6-10 us through libcephfs with its caps
held, and on a busy node more (two processes on two cores: 16 us a pair in Python against
9.6 in C). A metadata storm is timed for the storage's latency, not Python's. Where the
install built no library, or the backend has no compiled calls (NFS through libnfs, the
object stores), the Python loops run (the sidecar's `node.metadata_loop` says whether
the library was there).

The steps replay run_pattern's loops exactly: for each pass (pattern.order), each op of
pattern.ops, each file of the pass: stat_count stats, open_count opens (each into a slot
of its own), or the closes of the file's open handles, last opened first. A close of a
slot whose open failed is skipped in C (no sample, as the Python loop has no handle to
close). A stat or an open that succeeded past the deadline ends the pass after it.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from stampede import oploop
from stampede.backends.base import Backend
from stampede.checkpoint.plan import RankPlan
from stampede.ops import OP_CODE
from stampede.run.outcome import Log, PhaseOutcome, describe
from stampede.run.where import NOWHERE, Where

METADATA_OPS = {"stat": oploop.STAT, "open": oploop.OPEN, "close": oploop.CLOSE}
SAMPLE_CODE = {oploop.STAT: OP_CODE["stat"], oploop.OPEN: OP_CODE["open"],
               oploop.CLOSE: OP_CODE["close"]}
OP_NAME = {code: name for name, code in METADATA_OPS.items()}


@dataclass
class Program:
    """One rank's steps: (op, file index, slot) rows, with what they need to run."""

    compiled: oploop.Compiled
    steps: np.ndarray             # int32, (count, 3)
    relpaths: list[str]           # file index -> relpath
    paths: list[bytes]            # file index -> the backend's path
    path_array: ctypes.Array[ctypes.c_char_p]   # the same, as the C loop reads them
    slot_file: np.ndarray         # slot -> file index
    direct: bool
    follow_links: bool
    names: list[tuple[str, bytes]]   # step -> (op, path): the watchdog's words ([]: no watchdog)

    def run(self, rank: int, handles: dict[str, list[object]], iteration: int,
            deadline_ns: int, log: Log, outcome: PhaseOutcome, where: Where | None
            ) -> tuple[bool, int]:
        """Run the steps once; samples appended to `log`, failures to `outcome`, handles
        left open (no close op, or a pass ended by the deadline) added to `handles` for
        the pattern's untimed closes. Returns whether the deadline ended the pass, and the
        last op's stop stamp (0: none ran): where the rank's pass ended."""
        count = len(self.steps)
        stamps = np.zeros(2 * count, dtype=np.int64)
        results = np.zeros(count, dtype=np.int64)
        slots = np.full(len(self.slot_file), -1, dtype=np.int64)
        cells, late = (ctypes.c_int64 * 2)(-1, 0), ctypes.c_int64(0)
        watched = self.compiled.watched
        if watched is not None:
            watched.calling = oploop.Progress(cells, self.names)
        try:
            assert oploop.run_steps is not None
            ran = oploop.run_steps(ctypes.byref(self.compiled.calls), ctypes.addressof(self.path_array),
                                   self.steps.ctypes.data, count, slots.ctypes.data, deadline_ns,
                                   stamps.ctypes.data, results.ctypes.data,
                                   ctypes.addressof(cells), ctypes.addressof(late))
        finally:
            if watched is not None:
                watched.calling = None
        for slot in np.flatnonzero(slots >= 0).tolist():   # first: closed whatever follows
            handles[self.relpaths[int(self.slot_file[slot])]].append(int(slots[slot]))
        self._keep(rank, ran, stamps, results, iteration, log, outcome, where)
        return bool(late.value), int(stamps[:2 * ran].max(initial=0))

    def _keep(self, rank: int, ran: int, stamps: np.ndarray, results: np.ndarray,
              iteration: int, log: Log, outcome: PhaseOutcome, where: Where | None) -> None:
        """The samples of the steps that ran, as the Python loops append them."""
        append, error = log.append, self.compiled.error
        # the trace's file table: every file of the pass, in order, as the loops name each
        # file they visit; a sample's file id is then its file index's
        file_ids = [where.file_id(relpath) for relpath in self.relpaths] if where is not None else []
        steps = self.steps[:ran].tolist()
        for (op, index, _), start, stop, result in zip(steps, stamps[0:2 * ran:2].tolist(),
                                                       stamps[1:2 * ran:2].tolist(),
                                                       results[:ran].tolist()):
            if result == oploop.SKIPPED:
                continue
            append((iteration, SAMPLE_CODE[op], start, stop, 0, int(result >= 0)))
            if where is not None:
                where.rows.append((len(log) - 1, file_ids[index], NOWHERE))
            if result < 0:
                failure = error(op, int(result), self.paths[index])
                opened = op == oploop.OPEN
                outcome.fail(f"rank {rank}: {OP_NAME[op]} {self.relpaths[index]}: "
                             f"{describe(failure, opened and self.direct, not opened or self.follow_links)}")


def passes(plan: RankPlan) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """pattern.order: the (files, indices of their extents) each pass of the ops covers.
    op: one pass over every file; file: one pass per file, its extents in plan order (a
    file's blocks keep their places in memory: the places go by extent index)."""
    if plan.order != "file":
        return [(plan.files, tuple(range(len(plan.extents))))]
    by_file: dict[str, list[int]] = {relpath: [] for relpath in plan.files}
    for index, extent in enumerate(plan.extents):
        by_file[extent.relpath].append(index)
    return [((relpath,), tuple(indices)) for relpath, indices in by_file.items()]


def build(plan: RankPlan, paths: dict[str, str | bytes], backend: Backend, direct: bool,
          follow_links: bool) -> Program | None:
    """The program of a rank's passes, or None where the Python loops run: the library not
    built, an op other than stat, open and close, or a backend with no compiled calls."""
    if oploop.run_steps is None or not set(plan.ops) <= set(METADATA_OPS):
        return None
    compiled = backend.compiled_calls(direct, follow_links)
    if compiled is None:
        return None
    stat_count, open_count, rank_passes = plan.stat_count, plan.open_count, passes(plan)
    relpaths = list(dict.fromkeys(relpath for files, _ in rank_passes for relpath in files))
    index = {relpath: number for number, relpath in enumerate(relpaths)}
    steps: list[tuple[int, int, int]] = []
    slot_file: list[int] = []
    open_slots: dict[str, list[int]] = {relpath: [] for relpath in relpaths}
    for files, _ in rank_passes:
        for name in plan.ops:
            for relpath in files:
                if name == "stat":
                    steps += [(oploop.STAT, index[relpath], 0)] * stat_count
                elif name == "open":
                    for _ in range(open_count):
                        open_slots[relpath].append(len(slot_file))
                        steps.append((oploop.OPEN, index[relpath], len(slot_file)))
                        slot_file.append(index[relpath])
                else:   # close: the file's handles, last opened first (the loop's fds.pop())
                    while open_slots[relpath]:
                        steps.append((oploop.CLOSE, index[relpath], open_slots[relpath].pop()))
    encoded = [path if isinstance(path, bytes) else os.fsencode(path)
               for path in (paths[relpath] for relpath in relpaths)]
    names = [] if compiled.watched is None else [
        (OP_NAME[op], encoded[number]) for op, number, _ in steps]
    return Program(compiled, np.array(steps, dtype=np.int32).reshape(-1, 3), relpaths, encoded,
                   (ctypes.c_char_p * len(encoded))(*encoded),
                   np.array(slot_file, dtype=np.int64), direct, follow_links, names)
