"""Who reads (and writes) what: pure functions, no I/O, no MPI.

`plan_rank(spec, layout, nranks, rank)` is the whole contract between a layout and the
code that moves bytes; prepare and run both follow it, so the bytes written are exactly
the bytes read. Unit tests check that every byte of the checkpoint belongs to exactly the
ranks the layout says.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from stampede.errors import UsageError
from stampede.spec import DIRECT_ALIGN_BYTES, JobSpec

SHARED_FILE = "shared/checkpoint.raw"


@dataclass(frozen=True)
class Extent:
    """One contiguous byte range of one checkpoint file, read (or written) by one rank."""

    relpath: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"bad extent {self}")

    def blocks(self, block_bytes: int) -> Iterator[tuple[int, int]]:
        """(offset, length) of each read op; the last block may be shorter."""
        end = self.offset + self.length
        for offset in range(self.offset, end, block_bytes):
            yield offset, min(block_bytes, end - offset)


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank does in one iteration of the pattern, in order."""

    rank: int
    nranks: int
    layout: str
    ops: tuple[str, ...]
    extents: tuple[Extent, ...]
    block_bytes: int
    stat_count: int
    open_count: int

    @property
    def bytes(self) -> int:
        return sum(extent.length for extent in self.extents) if "read" in self.ops else 0

    @property
    def files(self) -> tuple[str, ...]:
        """The files this rank stats and opens, each once per pattern pass."""
        return tuple(dict.fromkeys(extent.relpath for extent in self.extents))

    def op_counts(self) -> dict[str, int]:
        """How many samples of each op one iteration produces on this rank."""
        nfiles = len(self.files)
        per_op = {
            "stat": self.stat_count * nfiles,
            "open": self.open_count * nfiles,
            "read": sum(-(-extent.length // self.block_bytes) for extent in self.extents),
            "close": self.open_count * nfiles,
        }
        return {op: per_op[op] for op in self.ops}


def bytes_per_rank(spec: JobSpec, nranks: int) -> int:
    """Bytes each rank restores. A total size is split evenly, rounded down to 4 KiB so
    that slices of a shared file stay aligned for O_DIRECT."""
    if spec.size_per_rank_bytes is not None:
        per_rank = spec.size_per_rank_bytes
        if spec.cache == "direct" and per_rank % DIRECT_ALIGN_BYTES:
            raise UsageError(f"{spec.source}: checkpoint.size_per_rank = {per_rank}: run.cache ="
                             f" direct needs a multiple of {DIRECT_ALIGN_BYTES} bytes")
        return per_rank
    assert spec.size_total_bytes is not None
    per_rank = spec.size_total_bytes // nranks // DIRECT_ALIGN_BYTES * DIRECT_ALIGN_BYTES
    if per_rank == 0:
        raise UsageError(f"{spec.source}: checkpoint.size = {spec.size_total_bytes} is too small "
                         f"for {nranks} ranks: each needs at least {DIRECT_ALIGN_BYTES} bytes")
    return per_rank


def shard_path(rank: int, nranks: int) -> str:
    return f"sharded/rank-{rank:05d}-of-{nranks:05d}.raw"


def checkpoint_files(spec: JobSpec, layout: str, nranks: int) -> tuple[tuple[str, int], ...]:
    """(relative path, size in bytes) of every file the layout consists of."""
    per_rank = bytes_per_rank(spec, nranks)
    if layout == "shared":
        return ((SHARED_FILE, per_rank * nranks),)
    return tuple((shard_path(rank, nranks), per_rank) for rank in range(nranks))


def plan_rank(spec: JobSpec, layout: str, nranks: int, rank: int) -> RankPlan:
    """The plan of one rank. shared: slice `rank` of the one file; sharded: its own file."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside 0..{nranks - 1}")
    per_rank = bytes_per_rank(spec, nranks)
    if layout == "shared":
        extent = Extent(SHARED_FILE, rank * per_rank, per_rank)
    elif layout == "sharded":
        extent = Extent(shard_path(rank, nranks), 0, per_rank)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    return RankPlan(rank=rank, nranks=nranks, layout=layout, ops=spec.ops, extents=(extent,),
                    block_bytes=spec.block_bytes, stat_count=spec.stat_count,
                    open_count=spec.open_count)
