"""What one rank must hold after a loader ran: the existing assignment
(stampede.existing.assign, the same extents stampede's own restore reads) in the words
loaders use: files to open, and the tensors (or slices of them, or raw items) to keep."""

from __future__ import annotations

import os
from dataclasses import dataclass

from stampede.existing.assign import assign
from stampede.existing.catalogue import RAW_FORMATS, Catalogue


@dataclass(frozen=True)
class Wanted:
    """One piece a rank must hold: a tensor, a slice of one, or a raw item's byte range."""

    relpath: str
    name: str            # the tensor (safetensors); "" for a raw format's byte range
    offset: int          # tensor-relative (safetensors), else the file offset
    length: int          # bytes
    whole: bool          # the whole tensor or item, not a slice of it


@dataclass(frozen=True)
class RankWork:
    """One rank's part of the restore under one policy."""

    root: str
    format: str
    policy: str
    rank: int
    nranks: int
    files: tuple[str, ...]      # the data files its pieces lie in, in file order
    wanted: tuple[Wanted, ...]
    index_file: str             # DCP's .metadata; "" when the loader reads no index

    def path(self, relpath: str) -> str:
        return os.path.join(self.root, relpath)

    @property
    def assigned_bytes(self) -> int:
        """What stampede's own restore reads for this rank: the bytes of the restore."""
        return sum(piece.length for piece in self.wanted)

    @property
    def sliced(self) -> bool:
        return not all(piece.whole for piece in self.wanted)

    def names(self) -> tuple[str, ...]:
        """The tensors it holds (a piece of), each once, in file order."""
        return tuple(dict.fromkeys(piece.name for piece in self.wanted if piece.name))


def rank_work(catalogue: Catalogue, policy: str, nranks: int, rank: int) -> RankWork:
    """A rank's work from the assignment itself (UsageError for a policy the format does
    not take, as `stampede run` says it)."""
    sizes = {(t.relpath, t.name): t.nbytes for t in catalogue.tensors}
    starts = {(t.relpath, t.file_offset): t.nbytes for t in catalogue.tensors}
    raw = catalogue.format in RAW_FORMATS
    wanted = []
    for extent in assign(catalogue, policy, nranks, rank):
        if raw:
            whole = starts.get((extent.relpath, extent.offset)) == extent.length
        else:
            whole = extent.offset == 0 and sizes[(extent.relpath, extent.tensor)] == extent.length
        wanted.append(Wanted(extent.relpath, extent.tensor, extent.offset, extent.length, whole))
    files = tuple(dict.fromkeys(piece.relpath for piece in wanted))
    return RankWork(root=catalogue.root, format=catalogue.format, policy=policy, rank=rank,
                    nranks=nranks, files=files, wanted=tuple(wanted),
                    index_file=catalogue.index_file if catalogue.format == "dcp" else "")
