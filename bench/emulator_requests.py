"""The metadata requests a restore really makes, counted in `stampede emulate-mds`'s own log.

A probe (one stat and one open of a checkpoint file) counts 3 + 3 requests; a restore's
rank made 8 per iteration on the same mount (7 GETATTRs and 1 OPEN: the read adds
GETATTRs of its own, the kernel checking the file's size; issue 39 saw 9). The benches
that turn the emulator's service time into the model's therefore count over the restores
themselves: each `stampede run` through a mount is bracketed by two readings of the
monotonic clock (the log's clock), and the requests of one measured iteration per rank
are (a run's requests - a one-iteration run's) / ((iterations - 1) x N): the warmup and
whatever a run does once before its clock (finding its files) cancel.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from common import run_checked

from stampede.emulate.mount import Window
from stampede.emulate.service import Served

# "total"; "file": queued on a file's lock (--serialize-inode); "other"; and one key per op
Counts = dict[str, float]
SPLITS = ("total", "file", "other")


def timed_run(command: list[str]) -> Window:
    """Run a command (exit on failure, as run_checked); its window on the log's clock."""
    start = time.monotonic()
    run_checked(command)
    return start, time.monotonic()


def count_requests(log: Sequence[Served], window: Window) -> Counts:
    """The requests that arrived in a run's window (nothing else may use the mount then),
    split as the model needs them."""
    served = [entry for entry in log if window[0] <= entry.arrived_s <= window[1]]
    counts: Counts = {"total": len(served),
                      "file": sum(any(lock.startswith("file:") for lock in entry.locks)
                                  for entry in served)}
    counts["other"] = counts["total"] - counts["file"]
    for entry in served:
        counts[entry.op] = counts.get(entry.op, 0) + 1
    return counts


def per_iteration(full: Sequence[Counts], single: Counts, iterations: int, nranks: int) -> Counts:
    """Requests per rank in one measured iteration: the median of the full runs (of
    `iterations` measured iterations each) less the one-iteration run, over the extra
    iterations and the ranks."""
    if iterations < 2:
        raise ValueError(f"iterations {iterations}: the difference needs at least 2")
    keys = set(single).union(*full)
    return {key: (statistics.median(run.get(key, 0) for run in full) - single.get(key, 0))
            / ((iterations - 1) * nranks) for key in keys}


def counts_text(counts: Counts) -> str:
    """`9 (getattr 7, open 2); file 6, other 3`."""
    by_op = ", ".join(f"{op} {counts[op]:g}" for op in sorted(counts)
                      if op not in SPLITS and counts[op])
    return f"{counts['total']:g} ({by_op}); file {counts['file']:g}, other {counts['other']:g}"
