"""The cache state of a phase, set up untimed before it: evicting the bytes a rank will
read (run.cache = cold), asking how many are still cached (mincore), and dropping the
whole page cache (run.drop_caches, one rank per node)."""

from __future__ import annotations

import os

from stampede.run.outcome import MAX_MESSAGES
from stampede.run.setup import RankSetup


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


def residency(setup: RankSetup, notes: list[str]) -> tuple[int, int]:
    """Untimed, after a cold eviction: (bytes in the page cache, bytes this rank will
    read) as mincore sees them; (0, 0) where there is no page cache to ask (object stores)."""
    if not setup.backend.capabilities.local_files:
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


def drop_caches(notes: list[str]) -> bool:
    """Untimed, one rank per node: write back, then drop the whole page cache (root only).
    Whether it was dropped."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as stream:
            stream.write("3\n")
    except OSError as error:
        note = (f"run.drop_caches: cannot write {DROP_CACHES} ({error.strerror}); "
                "pages were evicted per file only")
        if note not in notes:
            notes.append(note)
        return False
    return True


def evict(setup: RankSetup, messages: list[str]) -> None:
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
