"""`prepare --from PATH`: an existing checkpoint's tensors, laid out as stampede's layouts.

The source's tensors (or DCP's saved byte ranges), in catalogue order, form one byte
stream; shard s of S holds bytes [s * P, (s + 1) * P) of it, P = the stream's length / S
rounded up to 4 KiB (the tail of the last shard is zeros). prepare writes those bytes
instead of synthetic ones, so `run` restores the user's own tensors in every layout and
format, verified against the hashes prepare recorded. The source is only read.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.checkpoint.content import ContentSource
from stampede.checkpoint.plan import INDEX_FILE, shard_count
from stampede.errors import UsageError
from stampede.spec import JobSpec
from stampede.targets import capabilities_for
from stampede.units import ALIGN_BYTES

if TYPE_CHECKING:   # every rank of every run imports this module (resolve); only --from reads
    from stampede.existing.catalogue import Catalogue
    from stampede.mpi import Comm

_SHARD = re.compile(r"shard-(\d+)")


def source_catalogue(spec: JobSpec) -> Catalogue:
    """Rank 0: the source's headers; the copy must go elsewhere."""
    from stampede.existing.scan import scan

    if not capabilities_for(spec.from_path).local_files:
        raise UsageError(f"checkpoint.from = {spec.from_path!r}: prepare --from reads a POSIX "
                         "checkpoint (copy an object store's checkpoint to a file system, "
                         "or run it in place with --checkpoint)")
    catalogue = scan(spec.from_path)
    source, target = Path(catalogue.root).resolve(), Path(spec.target_path).resolve()
    if target == source or source in target.parents or target in source.parents:
        raise UsageError(f"target.path = {spec.target_path!r} overlaps the checkpoint "
                         f"{spec.from_path!r}: prepare --from writes a copy elsewhere")
    return catalogue


def sized(spec: JobSpec, total_bytes: int, nranks: int) -> JobSpec:
    """The job with its size set from the source: P bytes per shard (see above)."""
    shards = shard_count(spec, nranks)
    per_shard = -(-total_bytes // shards // ALIGN_BYTES) * ALIGN_BYTES
    per_shard = max(per_shard, ALIGN_BYTES)
    while per_shard * shards < total_bytes:
        per_shard += ALIGN_BYTES
    return dataclasses.replace(spec, size_per_rank_bytes=per_shard)


class SourceContent:
    """ContentSource's interface over the source's byte stream: fill(view, label, offset)
    with label naming a shard file, a shard's tensor, or the shared file (offsets there
    are stream offsets)."""

    def __init__(self, catalogue: Catalogue, per_shard_bytes: int, block_bytes: int) -> None:
        self.per_shard = per_shard_bytes
        self.pieces: list[tuple[int, str, int, int]] = []   # stream start, file, offset, length
        start = 0
        for tensor in catalogue.tensors:
            if tensor.nbytes:
                self.pieces.append((start, tensor.relpath, tensor.file_offset, tensor.nbytes))
                start += tensor.nbytes
        self.total = start
        self.starts = [piece[0] for piece in self.pieces]
        self.root = catalogue.root
        self.record = {"path": catalogue.root, "format": catalogue.format,
                       "bytes": catalogue.total_bytes}
        self.fds: dict[str, int] = {}
        self.synthetic = ContentSource(block_bytes)   # for the metadata-first index

    def fill(self, view: memoryview, label: str, offset: int) -> None:
        if label == INDEX_FILE:
            self.synthetic.fill(view, label, offset)
            return
        match = _SHARD.search(label.rpartition(":")[2] if ":" in label else label)
        stream = offset if match is None else int(match.group(1)) * self.per_shard + offset
        self._read(view, stream)

    def _read(self, view: memoryview, stream: int) -> None:
        done = 0
        while done < len(view):
            at = stream + done
            if at >= self.total:
                view[done:] = bytes(len(view) - done)
                return
            index = bisect.bisect_right(self.starts, at) - 1
            start, relpath, file_offset, length = self.pieces[index]
            count = min(len(view) - done, start + length - at)
            fd = self.fds.get(relpath)
            if fd is None:
                fd = self.fds[relpath] = os.open(os.path.join(self.root, relpath), os.O_RDONLY)
            got = os.preadv(fd, (view[done:done + count],), file_offset + at - start)
            if got != count:
                raise OSError(f"{relpath}: short read of the source at {file_offset + at - start}")
            done += count

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def resolve(comm: Comm, spec: JobSpec) -> tuple[JobSpec, Catalogue | None]:
    """A job with checkpoint.from, sized from the source (headers read on rank 0 only);
    other jobs unchanged."""
    if not spec.from_path:
        return spec, None
    from functools import partial

    from stampede import mpi

    catalogue = mpi.on_root(comm, "reading the source checkpoint's headers",
                            partial(source_catalogue, spec))
    return sized(spec, catalogue.total_bytes, comm.Get_size()), catalogue
