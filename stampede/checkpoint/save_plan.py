"""Who writes what in one save: pure functions, no I/O, no MPI.

A save writes one new version of the layout's checkpoint, under its own directory
(stampede.checkpoint.versions), with the same files and extents a restore of that layout
reads (stampede.checkpoint.plan), so what `save` writes `run` can restore and verify.
Rank r holds model shard r mod S in memory, as a trainer does; which ranks write it:

| layout         | files                            | who writes                                |
|----------------|----------------------------------|-------------------------------------------|
| shared         | one file of S slices (N-1)       | replica 0 of each shard its slice; rank 0 |
|                |                                  | creates the file and renames it           |
| sharded        | one file per shard               | replica 0 of each shard (R = 1: all)      |
| replicated     | one file per shard               | replica 0 of each shard (data-parallel    |
|                |                                  | saves below ZeRO-3)                       |
| striped        | one file per shard               | every replica 1/R of it (a fully parallel |
|                |                                  | save); replica 0 creates and renames      |
| fan-out        | one file per shard, fanout/NNN   | replica 0 of each shard                   |
| metadata-first | shard files + a shared index     | replica 0 of each shard; rank 0 the index |
|                |                                  | once every shard is durable               |
| mlperf         | MLPerf's model and optimizer     | every rank its own files, end to end in   |
|                | files per rank (checkpoint.mlperf)| its memory (Extent.place)                |

Every file is written under a temporary name (`.NAME.partial`, created O_CREAT|O_EXCL)
and renamed into place once its bytes are durable; a version is published by the layout's
pointer, written last (stampede.checkpoint.versions). An object store has no temporary
names: each object is written under its final name, in one PUT, or in a multipart upload
(save.part_size) whose part k holds the object's data bytes [(k - 1) P, k P), so that the
writers of one object (shared, striped) number their parts apart; check_object_save
refuses a save whose writers' extents do not start on part boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from stampede.checkpoint.plan import (
    INDEX_FILE,
    Extent,
    bytes_per_rank,
    checkpoint_files,
    file_tensors,
    mlperf_extents,
    mlperf_hold,
    shard_count,
    shard_extent,
    stripe_extent,
    under,
)
from stampede.errors import UsageError
from stampede.layouts import SAVE_LAYOUTS, layout_of
from stampede.spec import JobSpec
from stampede.spec_rules import MIN_PART_BYTES
from stampede.targets import capabilities_for
from stampede.units import format_bytes

MAX_PARTS = 10_000               # S3: the most parts of one multipart upload
MAX_PUT_BYTES = 5 * 2**30        # S3: the largest single PUT, and the largest part


@dataclass(frozen=True)
class FileWrite:
    """One file a rank takes part in writing."""

    relpath: str                    # its final name, relative to the target
    creates: bool                   # this rank creates it (and renames it into place)
    extents: tuple[Extent, ...]     # this rank's bytes in it (plan coordinates)
    shared_by: str = ""             # "" (the rank's own file), "world" or "group"

    @property
    def partial(self) -> str:
        """The temporary name it is written under: hidden, beside its final name."""
        path = PurePosixPath(self.relpath)
        return str(path.with_name(f".{path.name}.partial"))


@dataclass(frozen=True)
class SavePlan:
    """What one rank does in one save of one layout."""

    rank: int
    nranks: int
    layout: str
    root: str                       # the version's directory, relative to the target
    hold: Extent                    # the model shard this rank holds in memory
    files: tuple[FileWrite, ...]    # the files it writes into (none: a replica that rests)
    directories: tuple[str, ...]    # every directory of the version, parents first
    group: int = 0                  # striped: the ranks of one shard write one file
    member: int = 0                 # its place in the group (the replica)
    index: FileWrite | None = None  # metadata-first: rank 0 writes the index last
    block_bytes: int = 1            # one write op per block

    @property
    def writes(self) -> bool:
        return bool(self.files)

    @property
    def bytes_written(self) -> int:
        return sum(extent.length for file in self.files for extent in file.extents)

    def op_counts(self) -> dict[str, int]:
        """About the samples of one save on this rank (to choose run.samples = auto's
        mode; releases are not known here and are left out)."""
        files = len(self.files) + (self.index is not None)
        writes = sum(-(-extent.length // self.block_bytes)
                     for file in self.files for extent in file.extents)
        return {"write": writes + files, "file_ops": 5 * files,
                "mkdir": len(self.directories), "validate": files, "wait": 8}

    def own_directories(self) -> tuple[str, ...]:
        """The directories on the paths of this rank's files, parents first: what it makes
        itself with save.mkdir = every."""
        mine = {str(parent) for file in (*self.files, *filter(None, (self.index,)))
                for parent in PurePosixPath(file.relpath).parents}
        return tuple(directory for directory in self.directories if directory in mine)


def check_save(spec: JobSpec) -> None:
    """What `save` refuses before MPI starts and before any I/O."""
    if spec.checkpoint_source == "existing" or spec.from_path:
        raise UsageError(f"{spec.source}: stampede save writes synthetic checkpoints of the "
                         "job's size; it never writes an existing checkpoint or a copy of one",
                         hint="drop checkpoint.source / checkpoint.from for the save")
    others = [layout for layout in spec.layouts if not layout_of(layout).saves]
    if others:
        raise UsageError(f"{spec.source}: checkpoint.layout {', '.join(others)}: a way to read, "
                         f"not to write; save writes {', '.join(SAVE_LAYOUTS)}",
                         hint="save the layout they read (sharded), then run them on it")
    if spec.copies > 1:
        raise UsageError(f"{spec.source}: checkpoint.copies = {spec.copies}: the copies are a "
                         "restore's (prepare writes them, ranks read one each); a save writes "
                         "the checkpoint once", hint="save with checkpoint.copies = 1 "
                         "(checkpoint.key_prefix = \"hash\" spreads a save's PUTs)")
    if spec.format == "hdf5":
        raise UsageError(f"{spec.source}: checkpoint.format = \"hdf5\": h5py writes through "
                         "its own calls, which save cannot time op by op",
                         hint="save raw or safetensors")
    if capabilities_for(spec.target_path).object_store:
        _check_object_options(spec)


def save_refusal(spec: JobSpec, counts: Sequence[int], object_store: bool) -> str:
    """Why `save` would refuse the job at one of `counts` ("" when it would not): the checks
    it makes before any I/O, for a caller that plans saves ahead (stampede assess)."""
    try:
        check_save(spec)
        if object_store:
            for nranks in counts:
                check_object_save(spec, nranks)
    except UsageError as error:
        return error.message
    return ""


def _check_object_options(spec: JobSpec) -> None:
    # An object store has no buffered write to skip: a PUT or a completed upload is
    # durable when it is answered, so "none" would label durable bytes as buffered.
    if spec.durability == "none":
        raise UsageError(f"{spec.source}: save.durability = \"none\" on {spec.target_path!r}: "
                         "an object store has no buffered write (an object is durable when "
                         "its PUT or its upload's completion is answered)",
                         hint="leave save.durability = \"fsync\" for object stores")
    if spec.mkdir_by == "every":
        raise UsageError(f"{spec.source}: save.mkdir = \"every\" on {spec.target_path!r}: an "
                         "object store has no directories to make", hint="leave save.mkdir unset")


def check_object_save(spec: JobSpec, nranks: int) -> None:
    """What a save to an object store refuses before any request: several writers of one
    object (shared, striped) without save.part_size, or whose extents do not start on
    part boundaries (their part numbers would collide); an object over S3's limits (one
    PUT of 5 GiB, 10,000 parts)."""
    part = spec.part_bytes
    if part is not None and part > MAX_PUT_BYTES:
        raise UsageError(f"{spec.source}: save.part_size = {part}: S3 takes parts of at most "
                         f"5 GiB ({MAX_PUT_BYTES} bytes)")
    for layout in spec.layouts:
        starts = writer_starts(spec, layout, nranks)
        if starts and (part is None or any(start % part for start in starts)):
            what = "slices" if layout_of(layout).one_file else "stripes"
            why = "a multipart upload (save.part_size)" if part is None else \
                f"{what} that start on parts of save.part_size = {part} bytes"
            step = starts[0]   # one part per writer: a part size every start is a multiple of
            fits = MIN_PART_BYTES <= step <= MAX_PUT_BYTES and not any(s % step for s in starts)
            raise UsageError(
                f"{spec.source}: checkpoint.layout {layout!r} on {spec.target_path!r}: several "
                f"ranks write one object, which takes {why}; at {nranks} ranks its {what} start "
                f"every {step} bytes", hint=f'save.part_size = "{step}"' if fits else
                "a checkpoint.size whose slices or stripes are a multiple of a part size of at "
                "least 5 MiB")
        for relpath, nbytes in checkpoint_files(spec, layout, nranks):
            if part is None and nbytes > MAX_PUT_BYTES or \
                    part is not None and -(-nbytes // part) > MAX_PARTS:
                limit = "5 GiB in one PUT" if part is None else f"{MAX_PARTS} parts"
                raise UsageError(f"{spec.source}: {layout} {relpath} would be "
                                 f"{format_bytes(nbytes)}: S3 takes at most {limit}",
                                 hint="a larger save.part_size" if part else
                                 'set save.part_size (e.g. "64MiB") for multipart uploads')


def writer_starts(spec: JobSpec, layout: str, nranks: int) -> list[int]:
    """Where each writer of an object but the first starts in the object's data (none
    where every object has one writer)."""
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    described = layout_of(layout)
    if described.one_file:
        return [shard * per_rank for shard in range(1, shards)]
    if described.stripes:
        hold = Extent("shard", 0, per_rank)
        return [stripe.offset for index in range(1, spec.replicas)
                if (stripe := stripe_extent(hold, index, spec.replicas)) is not None]
    return []


def save_plan(spec: JobSpec, layout: str, nranks: int, rank: int, root: str) -> SavePlan:
    """The plan of one rank in one save (see the module's table), its files under `root`."""
    described = layout_of(layout)
    if described.workload_files:
        extents = mlperf_extents(spec, nranks, rank, root)
        return SavePlan(rank=rank, nranks=nranks, layout=layout, root=root,
                        hold=mlperf_hold(extents),
                        files=tuple(FileWrite(extent.relpath, True, (extent,))
                                    for extent in extents),
                        directories=version_directories(spec, layout, nranks, root),
                        group=rank, block_bytes=spec.block_bytes)
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    shard, replica = rank % shards, rank // shards
    hold = shard_extent(spec, layout, shard, shards, per_rank, root)
    files: tuple[FileWrite, ...] = ()
    if described.stripes:
        stripe = stripe_extent(hold, replica, spec.replicas)
        files = (FileWrite(hold.relpath, replica == 0, (stripe,) if stripe else (), "group"),)
    elif replica == 0:
        shared = described.one_file
        files = (FileWrite(hold.relpath, rank == 0 or not shared, (hold,),
                           "world" if shared else ""),)
    index = None
    if described.index_file and rank == 0:
        index = FileWrite(under(root, INDEX_FILE), True,
                          (Extent(under(root, INDEX_FILE), 0, spec.index_bytes),))
    return SavePlan(rank=rank, nranks=nranks, layout=layout, root=root, hold=hold,
                    files=files, directories=version_directories(spec, layout, nranks, root),
                    group=shard, member=replica, index=index, block_bytes=spec.block_bytes)


def version_directories(spec: JobSpec, layout: str, nranks: int, root: str) -> tuple[str, ...]:
    """The version's directory and every directory under it that holds a file, parents
    first."""
    found = {root}
    for relpath in file_tensors(spec, layout, nranks, root):
        parent = PurePosixPath(relpath).parent
        while str(parent) != root and str(parent) not in found:
            found.add(str(parent))
            parent = parent.parent
    return tuple(sorted(found, key=lambda path: (path.count("/"), path)))


def writing_ranks(spec: JobSpec, layout: str, nranks: int) -> int:
    """How many ranks write in a save of this layout."""
    return nranks if layout_of(layout).stripes else shard_count(spec, nranks)
