"""Who reads (and writes) what: pure functions, no I/O, no MPI.

`plan_rank(spec, layout, nranks, rank)` is the whole contract between a layout and the
code that moves bytes; prepare and run both follow it, so the bytes written are exactly
the bytes read. Unit tests check that every byte of the checkpoint is read by exactly the
ranks the layout says.

The model: N ranks = S model shards x R data-parallel replicas (`checkpoint.replicas`);
rank r must end up holding model shard r mod S. With R = 1 every rank holds its own shard.

| layout         | files                         | storage reads of rank r               | then        |
|----------------|-------------------------------|----------------------------------------|-------------|
| shared         | one file of S slices          | slice r mod S                          | -           |
| whole-file     | one file of S slices          | every slice (keeps slice r mod S)      | -           |
| node-once      | one file of S slices          | every slice, if it leads its node      | to the node |
| owners         | one file of S slices          | slice r mod S, if it owns that slice   | Bcast       |
| sharded        | one file per shard            | shard file r mod S                     | -           |
| replicated     | one file per shard            | shard file r mod S (R ranks read each) | -           |
| broadcast      | one file per shard            | its shard file, if it leads its group  | Bcast       |
| striped        | one file per shard            | stripe (r div S) of R of its shard     | Allgatherv  |
| metadata-first | shard files + a shared index  | the whole index, then its shard file   | -           |
| list-first     | one file per shard            | list the directory, then its shard     | -           |
| list-bcast     | one file per shard            | rank 0 lists and broadcasts; its shard | -           |
| fan-out        | one file per shard, in fanout/NNN (NNN = shard mod checkpoint.fanout) | its shard | - |

What the job needs is what its ranks must end up holding: the union of their model shards
(`needed_bytes`, S x the shard's bytes for a full restore), whatever the layout reads to
get there. Read amplification (stampede.results.amplification) is the bytes read from
storage over it: whole-file reads N x what it needs, broadcast reads each shard once.

A group is the R ranks that hold the same shard (or, with broadcast_group = "node", those
of them on one node: one storage read per node and shard). Layout node-once's groups are
the nodes: the node's lowest rank reads the whole file into memory, then sends each rank
of its node its slice (one read of the checkpoint per node; leaders known at run time).
Layout owners gives each slice one owner among the ranks that hold it, by bytes (the
largest slice first, to its least-loaded holder, `assign_owners`): the owner reads it
once, then broadcasts it to its group. With `run.rank_shift` = k, rank
r takes the place of rank (r + k) mod N above, so it reads bytes another rank wrote.

On an object store two options spread a restore's requests over the store's partitions
(S3 rates each partitioned prefix on its own, stampede.emulate.throttle):
`checkpoint.copies` = K puts K copies of the checkpoint under copy-0/ ... copy-K-1/, first
in every key, and rank r reads copy r mod K (prepare writes them all; a save writes
one); `checkpoint.key_prefix` = "hash" puts HASH_HEX_DIGITS hex digits of a hash of the
shard's number first in its key (a3f9/sharded/shard-00012-of-00016.raw: entropy first),
so the shards land in different partitions, restore and save alike.

Every path is relative to the target, or to a directory under it (`root`: a saved
version's directory, stampede.checkpoint.versions); what `stampede save` writes is
planned from the same extents (stampede.checkpoint.save_plan).

Formats (stampede.checkpoint.formats): in a safetensors or HDF5 file each shard is a tensor named
`shard-SSSSS`, and an extent's offset counts from the tensor's first byte, which the
file's header locates at run time (the `header` op). Raw extents are file offsets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from stampede.dtypes import WRITTEN
from stampede.errors import UsageError
from stampede.layouts import layout_of
from stampede.spec import JobSpec
from stampede.units import ALIGN_BYTES

EXTENSIONS = {"raw": "raw", "safetensors": "safetensors", "hdf5": "h5"}   # by checkpoint.format
SHARED_FILE = "shared/checkpoint.raw"
SHARD_DIR = "sharded"
FANOUT_DIR = "fanout"
INDEX_FILE = f"{SHARD_DIR}/.metadata"   # where PyTorch DCP keeps its index
COPY_DIR = "copy-{copy}"   # checkpoint.copies > 1: the prefix of each copy
# checkpoint.key_prefix = "hash": 16**4 prefixes, more than any rank count's shards need
# to meet S3's partitions apart (AWS's advice: a few random characters first)
HASH_HEX_DIGITS = 4


@dataclass(frozen=True)
class Extent:
    """One contiguous byte range of one checkpoint file, read (or written) by one rank."""

    relpath: str
    offset: int                     # in the file (raw), or from the tensor's first byte
    length: int
    tensor: str = ""                # formatted files: the tensor the bytes belong to
    place: int = -1                 # where its first byte sits in the holder's bytes in
                                    # memory; -1: at offset - hold.offset (one file)

    def at(self, hold: Extent) -> int:
        """Where this extent's first byte sits in the holder's bytes in memory (`hold`):
        several files of one rank (layout mlperf) lie end to end there."""
        return self.place if self.place >= 0 else self.offset - hold.offset

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length <= 0:
            raise ValueError(f"bad extent {self}")

    def blocks(self, block_bytes: int) -> Iterator[tuple[int, int]]:
        """(offset, length) of each read op; the last block may be shorter."""
        end = self.offset + self.length
        for offset in range(self.offset, end, block_bytes):
            yield offset, min(block_bytes, end - offset)


class RankPlan(NamedTuple):
    """Everything one rank does in one iteration of the pattern, in order."""

    rank: int
    nranks: int
    layout: str
    ops: tuple[str, ...]
    extents: tuple[Extent, ...]     # storage reads (broadcast: only if the rank leads)
    block_bytes: int
    stat_count: int
    open_count: int
    hold: Extent                    # the model shard this rank must end up holding
    group: int = 0                  # ranks with the same group (and node) exchange bytes
    member: int = 0                 # its place in the group: the replica (striped: stripe)
    exchange: str = ""              # "", "bcast" or "allgather" after the storage reads
    leader_reads: bool = False      # broadcast: only the group's first rank reads storage
    index_file: str = ""            # metadata-first: read whole by every rank first
    list_dir: str = ""              # list-first / list-bcast: listed before reading
    list_on_root: bool = False      # list-bcast: rank 0 lists, then broadcasts the names
    copy_dir: str = ""              # checkpoint.copies > 1: the copy it reads (copy-k)
    formatted: bool = False         # files have headers: one header op per file read
    by_node: bool = False           # node-once: the exchange groups are the nodes
    owner: int = -1                 # owners: the rank that reads this rank's shard
    needs: tuple[Extent, ...] | None = None   # the checkpoint's bytes this rank must end up
                                    # holding (None: `hold`); two ranks' needs are the same
                                    # bytes or disjoint ones (shards, an existing
                                    # checkpoint's assignment), never in part the same
    shared_need: bool = False       # every rank needs the same bytes (`needs`): an existing
                                    # checkpoint restored whole on every rank (owners, whole-file)
    parts: tuple[tuple[int, int], ...] = ()   # allgather: (offset in hold, length) of each
                                    # member's part; (): the replicas' stripes (`stripes`)
    order: str = "op"               # pattern.order: each op over every file, or file by file

    @property
    def needed_bytes(self) -> int:
        """Bytes of the checkpoint this rank must end up holding, whatever it reads."""
        return self.hold.length if self.needs is None else sum(e.length for e in self.needs)

    @property
    def needed_key(self) -> tuple[object, ...]:
        """Equal for two ranks that need the same bytes (one shard), else different: the
        bytes a node or the job needs are the sum over its distinct keys."""
        if self.needs is None:   # a shard's bytes are the same in every copy
            hold = self.hold
            relpath = hold.relpath.replace(f"{self.copy_dir}/", "", 1) if self.copy_dir \
                else hold.relpath
            return (relpath, hold.tensor, hold.offset, hold.length)
        if self.shared_need:   # every rank the whole checkpoint: the job needs it once
            return ("all",)
        return ("rank", self.rank)   # an existing checkpoint's assignment: no byte twice

    @property
    def held_bytes(self) -> int:
        """What this rank's memory holds while it exchanges: the node's whole read for a
        node-once rank (any of them may lead its node), its shard for the others."""
        if self.exchange == "scatter":
            return max(self.hold.length, sum(extent.length for extent in self.extents))
        return self.hold.length

    @property
    def files(self) -> tuple[str, ...]:
        """The files this rank stats and opens, each once per pattern pass."""
        return tuple(dict.fromkeys(extent.relpath for extent in self.extents))

    def op_counts(self, leads: bool = True) -> dict[str, int]:
        """Storage ops of one iteration on this rank (broadcast: as leader or not)."""
        reads_storage = leads or not self.leader_reads
        nfiles = len(self.files) if reads_storage else 0
        per_op = {
            "stat": self.stat_count * nfiles,
            "open": self.open_count * nfiles,
            "read": sum(-(-e.length // self.block_bytes) for e in self.extents) if nfiles else 0,
            "close": self.open_count * nfiles,
        }
        counts = {op: per_op[op] for op in self.ops}
        if self.formatted and "read" in self.ops and nfiles:
            counts["header"] = nfiles
        if self.index_file:
            counts["index"] = 1
        if self.list_dir:
            counts["list"] = int(self.rank == 0 or not self.list_on_root)
        return counts


def shard_count(spec: JobSpec, nranks: int) -> int:
    """S = N / R model shards; the rank count must be a multiple of the replica count."""
    if nranks % spec.replicas:
        raise UsageError(f"{spec.source}: checkpoint.replicas = {spec.replicas} does not divide "
                         f"{nranks} ranks", hint="run on a multiple of the replica count")
    return nranks // spec.replicas


def bytes_per_rank(spec: JobSpec, nranks: int) -> int:
    """Bytes each rank must hold: its model shard. A total size is split over the S
    shards, rounded down to 4 KiB so slices and stripes stay aligned for O_DIRECT."""
    shards = shard_count(spec, nranks)
    if spec.workload != "none":   # ranks hold different amounts: the largest share
        return max(sum(extent.length for extent in mlperf_extents(spec, nranks, rank))
                   for rank in range(nranks))
    if spec.size_per_rank_bytes is not None:
        per_rank = spec.size_per_rank_bytes
        if spec.cache == "direct" and per_rank % ALIGN_BYTES:
            raise UsageError(f"{spec.source}: checkpoint.size_per_rank = {per_rank}: run.cache ="
                             f" direct needs a multiple of {ALIGN_BYTES} bytes")
        itemsize = WRITTEN[spec.dtype].itemsize
        if (spec.format != "raw" or spec.check_finite) and per_rank % itemsize:
            raise UsageError(f"{spec.source}: checkpoint.size_per_rank = {per_rank}: a shard "
                             f"of {spec.dtype} elements needs a multiple of {itemsize} bytes")
        return per_rank
    assert spec.size_total_bytes is not None
    per_rank = spec.size_total_bytes // shards // ALIGN_BYTES * ALIGN_BYTES
    if per_rank == 0:
        raise UsageError(f"{spec.source}: checkpoint.size = {spec.size_total_bytes} is too small "
                         f"for {shards} shards: each needs at least {ALIGN_BYTES} bytes")
    return per_rank


def shard_path(shard: int, shards: int, fmt: str = "raw", fanout: int = 0) -> str:
    """A shard's file: in sharded/, or (fanout > 0) in fanout/NNN with NNN = shard mod
    fanout."""
    directory = f"{FANOUT_DIR}/{shard % fanout:03d}" if fanout else SHARD_DIR
    return f"{directory}/shard-{shard:05d}-of-{shards:05d}.{EXTENSIONS[fmt]}"


def copy_dir(spec: JobSpec, copy: int) -> str:
    """The prefix of copy `copy` ("" with one copy: the plain keys)."""
    return COPY_DIR.format(copy=copy) if spec.copies > 1 else ""


def copy_of(spec: JobSpec, rank: int) -> int:
    """The copy rank `rank` reads: round-robin, so each copy has N/K readers."""
    return rank % spec.copies


def key_prefix(spec: JobSpec, shard: int) -> str:
    """What leads shard `shard`'s key (checkpoint.key_prefix): "" or a few hex digits of a
    hash of its number, the same on every rank and every run."""
    if spec.key_prefix != "hash":
        return ""
    return hashlib.sha256(str(shard).encode()).hexdigest()[:HASH_HEX_DIGITS]


def under(root: str, relpath: str) -> str:
    """A path of the layout under `root` (a directory relative to the target; "" = the
    target itself)."""
    return f"{root}/{relpath}" if root else relpath


def shared_path(fmt: str = "raw") -> str:
    return SHARED_FILE.replace(".raw", f".{EXTENSIONS[fmt]}")


def tensor_name(shard: int, fmt: str) -> str:
    """The tensor that holds a shard in a formatted file ("" in a raw one)."""
    return f"shard-{shard:05d}" if fmt != "raw" else ""


def copy_root(spec: JobSpec, root: str, copy: int) -> str:
    """The directory copy `copy` lies in, under `root`."""
    return "/".join(part for part in (root, copy_dir(spec, copy)) if part)


def shard_extent(spec: JobSpec, layout: str, shard: int, shards: int, per_rank: int,
                 root: str = "", copy: int = 0) -> Extent:
    """Where shard `shard` lives, in the layout's files (of copy `copy`)."""
    fmt, tensor = spec.format, tensor_name(shard, spec.format)
    described = layout_of(layout)
    base = copy_root(spec, root, copy)
    if described.one_file:
        return Extent(under(base, shared_path(fmt)), 0 if tensor else shard * per_rank,
                      per_rank, tensor)
    fanout = spec.fanout if described.fanout_dirs else 0
    return Extent(under(base, under(key_prefix(spec, shard), shard_path(shard, shards, fmt, fanout))),
                  0, per_rank, tensor)


def checkpoint_files(spec: JobSpec, layout: str, nranks: int,
                     root: str = "") -> tuple[tuple[str, int], ...]:
    """(relative path, data bytes) of every file the layout consists of; a formatted file
    is larger by its header."""
    return tuple((relpath, sum(nbytes for _, nbytes in tensors))
                 for relpath, tensors in file_tensors(spec, layout, nranks, root).items())


def file_tensors(spec: JobSpec, layout: str, nranks: int,
                 root: str = "") -> dict[str, tuple[tuple[str, int], ...]]:
    """relpath -> the (tensor, bytes) it holds, in file order (raw: one unnamed tensor)."""
    described = layout_of(layout)
    if described.workload_files:
        return {extent.relpath: (("", extent.length),) for rank in range(nranks)
                for extent in mlperf_extents(spec, nranks, rank, root)}
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    fmt = spec.format
    files: dict[str, tuple[tuple[str, int], ...]] = {}
    for copy in range(spec.copies):
        base = copy_root(spec, root, copy)
        if described.index_file:
            files[under(base, INDEX_FILE)] = (("", spec.index_bytes),)
        if described.one_file:
            files[under(base, shared_path(fmt))] = tuple((tensor_name(shard, fmt), per_rank)
                                                         for shard in range(shards)) \
                if fmt != "raw" else (("", per_rank * shards),)
        else:
            for shard in range(shards):
                extent = shard_extent(spec, layout, shard, shards, per_rank, root, copy)
                files[extent.relpath] = ((extent.tensor, per_rank),)
    return files


def union_bytes(extents: Iterable[Extent]) -> int:
    """Bytes in the union of the extents: a byte several extents cover counts once
    (offsets compared within one file and tensor)."""
    by_place: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for extent in extents:
        by_place.setdefault((extent.relpath, extent.tensor), []).append(
            (extent.offset, extent.offset + extent.length))
    total = 0
    for ranges in by_place.values():
        reached = -1
        for start, end in sorted(ranges):
            total += max(0, end - max(start, reached))
            reached = max(reached, end)
    return total


def needed_extents(spec: JobSpec, layout: str, nranks: int) -> Iterator[Extent]:
    """What each rank of the layout must end up holding (plan_rank's `hold`, or its files
    for layout mlperf), rank by rank: a shard for every rank, never what it reads."""
    described = layout_of(layout)
    if described.workload_files:
        for rank in range(nranks):
            yield from mlperf_extents(spec, nranks, rank)
        return
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    for rank in range(nranks):
        yield shard_extent(spec, layout, ((rank + spec.rank_shift) % nranks) % shards,
                           shards, per_rank)


def needed_bytes(spec: JobSpec, layout: str, nranks: int) -> int:
    """The unique bytes the job needs: the union of what every rank must end up holding
    (the checkpoint's size for a full restore, whatever the layout reads)."""
    return union_bytes(needed_extents(spec, layout, nranks))


def writes_of_rank(spec: JobSpec, layout: str, nranks: int, rank: int,
                   whole_files: bool = False) -> tuple[Extent, ...]:
    """What `prepare` writes on this rank: the first S ranks write one shard (or slice)
    each, rank 0 also the index. whole_files (object stores, written sequentially): the
    shared file is written whole by rank 0. With K copies each is written so: the shard
    writers write theirs in every copy, and copy k's index and whole shared file are
    rank (k mod N)'s, so K uploads of one object go on in parallel."""
    described = layout_of(layout)
    if described.workload_files:
        return mlperf_extents(spec, nranks, rank)
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    writes = []
    for copy in range(spec.copies):
        owner = copy % nranks   # of the copy's whole objects
        if described.index_file and rank == owner:
            writes.append(Extent(under(copy_root(spec, "", copy), INDEX_FILE), 0, spec.index_bytes))
        if described.one_file and whole_files:
            if rank == owner:
                writes.extend(shard_extent(spec, layout, shard, shards, per_rank, copy=copy)
                              for shard in range(shards))
        elif rank < shards:
            writes.append(shard_extent(spec, layout, rank, shards, per_rank, copy=copy))
    return tuple(writes)


def mlperf_extents(spec: JobSpec, nranks: int, rank: int, root: str = "") -> tuple[Extent, ...]:
    """Layout mlperf: the workload's files of one rank, whole, end to end in its memory."""
    # Only layout mlperf needs the workloads (and their statistics): not every rank, every run
    from stampede.checkpoint.mlperf import MODELS, rank_files

    files = rank_files(MODELS[spec.workload], rank, nranks, spec.subset, spec.scale)
    starts = [sum(nbytes for _, nbytes in files[:index]) for index in range(len(files))]
    return tuple(Extent(under(root, name), 0, nbytes, place=start)
                 for (name, nbytes), start in zip(files, starts))


def mlperf_hold(extents: tuple[Extent, ...]) -> Extent:
    """What a rank of layout mlperf holds: its files' bytes end to end (named by its
    first file; its content is made per file)."""
    return Extent(extents[0].relpath, 0, sum(extent.length for extent in extents))


def stripe_extent(hold: Extent, index: int, count: int) -> Extent | None:
    """Stripe `index` of `count` of a shard, in whole 4 KiB pages (the last takes the rest)."""
    pages = hold.length // ALIGN_BYTES
    first, last = pages * index // count, pages * (index + 1) // count
    length = (last - first) * ALIGN_BYTES
    if index == count - 1:
        length = hold.length - first * ALIGN_BYTES
    if length <= 0:
        return None
    return Extent(hold.relpath, hold.offset + first * ALIGN_BYTES, length, hold.tensor)


def assign_owners(sizes: Sequence[int], holders: Sequence[Sequence[int]]) -> list[int]:
    """The owner of each shard (its bytes `sizes[s]`, held by the ranks `holders[s]`): the
    largest shard first, to the holder that owns the fewest bytes so far (ties: the lowest
    rank), as PyTorch's cooperative load balances its reads. Each byte is read once."""
    owners, load = [-1] * len(sizes), dict.fromkeys((r for ranks in holders for r in ranks), 0)
    for shard in sorted(range(len(sizes)), key=lambda s: (-sizes[s], s)):
        owner = min(holders[shard], key=lambda r: (load[r], r))
        owners[shard], load[owner] = owner, load[owner] + sizes[shard]
    return owners


def _owner(spec: JobSpec, nranks: int, shards: int, per_rank: int, shard: int) -> int:
    """Layout owners: who reads `shard` (every shard is b bytes: its lowest holder)."""
    holders: list[list[int]] = [[] for _ in range(shards)]
    for rank in range(nranks):
        holders[((rank + spec.rank_shift) % nranks) % shards].append(rank)
    return assign_owners([per_rank] * shards, holders)[shard]


def plan_rank(spec: JobSpec, layout: str, nranks: int, rank: int, root: str = "") -> RankPlan:
    """The plan of one rank in one layout (see the module's table), its files under
    `root`."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside 0..{nranks - 1}")
    place = (rank + spec.rank_shift) % nranks   # the rank whose shard this one restores
    described = layout_of(layout)
    if described.workload_files:
        files = mlperf_extents(spec, nranks, place, root)
        return RankPlan(rank=rank, nranks=nranks, layout=layout, ops=spec.ops,
                        extents=files, block_bytes=spec.block_bytes,
                        stat_count=spec.stat_count, open_count=spec.open_count,
                        hold=mlperf_hold(files), group=place, order=spec.order)
    per_rank, shards = bytes_per_rank(spec, nranks), shard_count(spec, nranks)
    shard, replica = place % shards, place // shards
    copy = copy_of(spec, rank)   # by the rank itself: N/K readers per copy, shifted or not
    base = copy_root(spec, root, copy)
    hold = shard_extent(spec, layout, shard, shards, per_rank, root, copy)
    extents: tuple[Extent, ...] = (hold,)
    if described.whole_file:   # every slice, in file order: the whole file's data
        extents = tuple(shard_extent(spec, layout, other, shards, per_rank, root, copy)
                        for other in range(shards))
        if described.node_reads:   # held by a node's reader: slice s at s x b in memory
            extents = tuple(replace(extent, place=other * per_rank)
                            for other, extent in enumerate(extents))
    elif described.stripes:
        stripe = stripe_extent(hold, replica, spec.replicas)
        extents = (stripe,) if stripe else ()
    group, member, owner = shard, replica, -1
    if described.node_reads:   # one group per node, ordered by world rank: its lowest leads
        group, member = 0, rank
    elif described.owners:     # the owner first in its group: the broadcast's root
        owner = _owner(spec, nranks, shards, per_rank, shard)
        member = 0 if rank == owner else replica + 1
    return RankPlan(
        rank=rank, nranks=nranks, layout=layout, ops=spec.ops, extents=extents,
        block_bytes=spec.block_bytes, stat_count=spec.stat_count, open_count=spec.open_count,
        hold=hold, group=group, member=member, exchange=described.exchange,
        by_node=described.node_reads, owner=owner,
        leader_reads=described.leader_reads,
        index_file=under(base, INDEX_FILE) if described.index_file else "",
        list_dir=under(base, SHARD_DIR) if described.listing else "",
        list_on_root=described.list_on_root, formatted=spec.format != "raw",
        copy_dir=copy_dir(spec, copy), order=spec.order)


def stripes(spec: JobSpec, hold: Extent) -> tuple[tuple[int, int], ...]:
    """(offset within the shard, length) of each replica's stripe: the Allgatherv layout."""
    parts = (stripe_extent(hold, index, spec.replicas) for index in range(spec.replicas))
    return tuple((p.offset - hold.offset, p.length) if p else (0, 0) for p in parts)


def shown_ranks(nranks: int, shown: int = 4) -> list[int]:
    """The ranks `stampede plan` shows: every one, or the first and last `shown` with -1
    standing for those between."""
    ranks = list(range(nranks))
    return ranks if nranks <= 2 * shown else ranks[:shown] + [-1] + ranks[-shown:]


def reads_storage(spec: JobSpec, plan: RankPlan) -> bool:
    """Whether this rank reads storage, as far as its plan knows: a broadcast group's
    leader by replica is its lowest rank (the shard's index); by node, leaders are only
    known at run time and every member is shown as reading (node-once's node leaders too);
    an owners slice's owner is planned."""
    if plan.owner >= 0:
        return plan.rank == plan.owner
    if plan.by_node:
        return True
    return not plan.leader_reads or spec.broadcast_group != "replica" or plan.rank == plan.group
