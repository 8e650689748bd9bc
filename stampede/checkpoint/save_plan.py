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

Every file is written under a temporary name (`.NAME.partial`, created O_CREAT|O_EXCL)
and renamed into place once its bytes are durable; a version is published by the layout's
pointer, written last (stampede.checkpoint.versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from stampede.checkpoint.plan import (
    INDEX_FILE,
    Extent,
    bytes_per_rank,
    file_tensors,
    shard_count,
    shard_extent,
    stripe_extent,
    under,
)
from stampede.errors import UsageError
from stampede.spec import SAVE_LAYOUTS, JobSpec


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
    others = [layout for layout in spec.layouts if layout not in SAVE_LAYOUTS]
    if others:
        raise UsageError(f"{spec.source}: checkpoint.layout {', '.join(others)}: a way to read, "
                         f"not to write; save writes {', '.join(SAVE_LAYOUTS)}",
                         hint="save the layout they read (sharded), then run them on it")
    if spec.format == "hdf5":
        raise UsageError(f"{spec.source}: checkpoint.format = \"hdf5\": h5py writes through "
                         "its own calls, which save cannot time op by op",
                         hint="save raw or safetensors")


def save_plan(spec: JobSpec, layout: str, nranks: int, rank: int, root: str) -> SavePlan:
    """The plan of one rank in one save (see the module's table), its files under `root`."""
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    shard, replica = rank % shards, rank // shards
    hold = shard_extent(spec, layout, shard, shards, per_rank, root)
    files: tuple[FileWrite, ...] = ()
    if layout == "striped":
        stripe = stripe_extent(hold, replica, spec.replicas)
        files = (FileWrite(hold.relpath, replica == 0, (stripe,) if stripe else (), "group"),)
    elif replica == 0:
        shared = layout == "shared"
        files = (FileWrite(hold.relpath, rank == 0 or not shared, (hold,),
                           "world" if shared else ""),)
    index = None
    if layout == "metadata-first" and rank == 0:
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
    return nranks if layout == "striped" else shard_count(spec, nranks)
