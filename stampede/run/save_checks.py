"""save.validate: after a save, each written extent evicted, re-read and checked (its
hash against the one computed when the shard was filled, or every element finite), timed
as one validate op; after a mismatch, the untimed comparison with the shard in memory that
says which bytes differ. The timed save (stampede.run.save_pattern) logs what it returns:
nothing here knows the save's steps."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from stampede.checkpoint.plan import Extent
from stampede.checkpoint.save_plan import FileWrite
from stampede.run.digests import new_digest
from stampede.run.outcome import describe
from stampede.run.save_setup import SaveSetup


class Validated(NamedTuple):
    """One extent's validate: its timed op's sample (None: it failed before the first read
    was timed) and, if it failed, what and why (the save's failure message)."""

    sample: tuple[int, int, int, int] | None   # start ns, stop ns, bytes checked, good
    what: str = ""
    failure: str = ""                          # "": the extent is good
    corrupt: bool = False                      # read back whole, and not what was written


def validate_extent(setup: SaveSetup, hold: Extent, file: FileWrite, extent: Extent) -> Validated:
    """Evict, re-read and check one extent (one timed validate op); a mismatch is
    located against the shard in memory (`hold`: the rank's part of it), untimed."""
    backend = setup.backend
    base = setup.bases[file.relpath][extent.tensor]
    path = setup.paths[file.relpath]
    try:
        if not setup.direct:
            backend.evict(path, base + extent.offset, extent.length)
    except OSError as error:
        return Validated(None, file.relpath, f"evicting its pages: {describe(error, False)}")
    digest = new_digest(setup.validate) if setup.validate in ("sha256", "xxh3") else None
    nonfinite = 0
    start = time.perf_counter_ns()
    try:
        handle = backend.opener(setup.direct, False)(path)
        try:
            for offset, length in extent.blocks(setup.block_bytes):
                view = setup.check.prefix(length)
                count = backend.read_into(handle, view, base + offset)
                if count != length:
                    raise OSError(0, f"short read at {base + offset}, {count} of {length} "
                                     "bytes")
                if digest is not None:
                    digest.update(view)
                else:
                    from stampede.checkpoint.formats import nonfinite_count
                    nonfinite += nonfinite_count(view, setup.finite_dtype)
        finally:
            backend.close(handle)
    except OSError as error:
        return Validated((start, time.perf_counter_ns(), 0, 0), file.relpath,
                         error.strerror or str(error))
    stop = time.perf_counter_ns()
    good = (digest.hexdigest() == setup.expected[extent]) if digest is not None \
        else nonfinite == 0
    sample = (start, stop, extent.length, int(good))
    if good:
        return Validated(sample)
    what = f"{setup.validate} differs from what it wrote" if digest is not None \
        else f"{nonfinite} element(s) are NaN or Inf as {setup.finite_dtype}"
    return Validated(sample, f"{file.relpath} bytes {base + extent.offset}.."
                             f"{base + extent.offset + extent.length}",
                     f"{what}; {locate(setup, hold, file, extent, base)}", corrupt=True)


def locate(setup: SaveSetup, hold: Extent, file: FileWrite, extent: Extent, base: int) -> str:
    """Untimed, after a failed check: the bytes that differ from the shard in memory."""
    handle = setup.backend.opener(False, False)(setup.paths[file.relpath])
    first, last, count = -1, -1, 0
    try:
        for offset, length in extent.blocks(setup.block_bytes):
            got = bytearray(length)
            done = setup.backend.read_into(handle, memoryview(got), base + offset)
            place = extent.at(hold) + offset - extent.offset
            wanted = np.frombuffer(setup.model.view[place:place + length], dtype=np.uint8)
            differs = np.flatnonzero(np.frombuffer(got, dtype=np.uint8)[:done]
                                     != wanted[:done])
            if done < length:
                differs = np.concatenate([differs, np.arange(done, length)])
            if differs.size:
                first = base + offset + int(differs[0]) if first < 0 else first
                last, count = base + offset + int(differs[-1]), count + int(differs.size)
    finally:
        setup.backend.close(handle)
    if not count:
        return "yet a second read matches: the bytes changed between reads"
    return f"{count} byte(s) differ, first at file offset {first}, last at {last}"
