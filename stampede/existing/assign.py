"""Who reads what of an existing checkpoint: a policy (spec.ASSIGN_POLICIES) turns the
catalogue into each rank's extents and RankPlan; pure, no I/O.

- files: whole files to ranks, balanced by bytes (largest file first to the least loaded
  rank, ties to the lower rank): how per-file loaders (HF's sharded `from_pretrained`
  under data parallelism with one reader per shard) spread a restore.
- tensor-slices: every rank reads 1/N of every tensor, a contiguous range of the
  flattened tensor cut on element boundaries (DCP items, torch storages, tensorizer
  files: on byte boundaries): the
  tensor-parallel load. A tensor with fewer elements than ranks leaves some ranks out.
- saved (dcp only): rank r reads what saving ranks s with s % N == r wrote.
- reshard: rank r of N holds rows [r R // N, (r + 1) R // N) of every tensor's dim 0 and
  reads exactly their bytes, whatever rank count saved it (stampede.existing.reshard).
- whole-file and owners: every rank ends up holding the whole checkpoint (a replicated
  restore: data parallelism, or every GPU of a node holding the model). whole-file: each
  rank reads every tensor (the naive load, N-fold reads); owners: each tensor is read
  once, by its owner (largest first, to the least-loaded rank: PyTorch's cooperative
  load), then an Allgatherv completes every rank's copy (1.0x).
"""

from __future__ import annotations

import os
from dataclasses import replace

from stampede.checkpoint.plan import Extent, RankPlan
from stampede.dtypes import FLOATS
from stampede.errors import UsageError
from stampede.existing.catalogue import RAW_FORMATS, Catalogue, TensorInfo, balance
from stampede.existing.dcp import SAVED_BY
from stampede.existing.reshard import reshard
from stampede.spec import ASSIGN_POLICIES, JobSpec


def assign(catalogue: Catalogue, policy: str, nranks: int, rank: int) -> tuple[Extent, ...]:
    """This rank's reads of the checkpoint under a policy (see the module docstring), in
    file order. Safetensors and HDF5 extents are tensor-relative and name their tensor;
    the extents of RAW_FORMATS (DCP, torch, tensorizer) are raw file offsets. DCP's
    .metadata is not among them."""
    if policy not in ASSIGN_POLICIES:
        raise UsageError(f"checkpoint policy {policy!r} is not one of {', '.join(ASSIGN_POLICIES)}")
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside 0..{nranks - 1}")
    raw = catalogue.format in RAW_FORMATS
    if policy == "reshard":
        return reshard(catalogue, nranks, rank)
    if policy == "whole-file":
        return tuple(_whole(tensor, raw) for tensor in catalogue.tensors if tensor.nbytes)
    if policy == "owners":
        return owned(catalogue, nranks)[rank]
    if policy == "tensor-slices":
        return tuple(extent for tensor in catalogue.tensors
                     if (extent := _slice(tensor, raw, nranks, rank)) is not None)
    if policy == "files":
        owners = balance(catalogue.files, nranks)
    else:
        owners = _saved_owners(catalogue, nranks)
    return tuple(_whole(tensor, raw) for tensor in catalogue.tensors
                 if tensor.nbytes and owners[tensor.relpath] == rank)


def owned(catalogue: Catalogue, nranks: int) -> list[tuple[Extent, ...]]:
    """Policy owners: each rank's tensors (items), whole, in file order; every tensor has
    one owner, the largest first to the least-loaded rank (PyTorch's cooperative load)."""
    raw = catalogue.format in RAW_FORMATS
    tensors = [tensor for tensor in catalogue.tensors if tensor.nbytes]
    owners = balance(((tensor.name, tensor.nbytes) for tensor in tensors), nranks)
    return [tuple(_whole(t, raw) for t in tensors if owners[t.name] == rank)
            for rank in range(nranks)]


def _saved_owners(catalogue: Catalogue, nranks: int) -> dict[str, int]:
    if catalogue.format != "dcp":
        raise UsageError(f"checkpoint policy 'saved' reads a PyTorch DCP checkpoint's files by "
                         f"the rank that saved them; {catalogue.root} is {catalogue.format}",
                         hint="use policy files or tensor-slices")
    owners = {}
    for relpath, _ in catalogue.files:
        match = SAVED_BY.match(os.path.basename(relpath))
        if match is None:
            raise UsageError(f"checkpoint policy 'saved': {relpath} does not say which rank saved"
                             " it (DCP names files __R_K.distcp)",
                             hint="use policy files or tensor-slices")
        owners[relpath] = int(match.group(1)) % nranks
    return owners


def _whole(tensor: TensorInfo, raw: bool) -> Extent:
    if raw:
        return Extent(tensor.relpath, tensor.file_offset, tensor.nbytes)
    return Extent(tensor.relpath, 0, tensor.nbytes, tensor.name)


def _slice(tensor: TensorInfo, raw: bool, nranks: int, rank: int) -> Extent | None:
    """Slice `rank` of `nranks` of one tensor, on element boundaries (DCP items: bytes)."""
    unit = 1 if raw else tensor.itemsize
    count = tensor.nbytes // unit
    first, last = count * rank // nranks, count * (rank + 1) // nranks
    if last <= first:
        return None
    if raw:
        return Extent(tensor.relpath, tensor.file_offset + first * unit, (last - first) * unit)
    return Extent(tensor.relpath, first * unit, (last - first) * unit, tensor.name)


def plan_existing(catalogue: Catalogue, spec: JobSpec, policy: str, nranks: int,
                  rank: int) -> RankPlan:
    """The RankPlan of one rank restoring an existing checkpoint under a policy: its
    extents, the shared index every rank reads first (DCP's .metadata, a safetensors
    index), and header ops for safetensors and HDF5 files. With rank_shift, rank r reads
    what rank (r + shift) mod N would."""
    place = (rank + spec.rank_shift) % nranks
    if policy == "owners":
        return _owners_plan(catalogue, spec, nranks, rank)
    extents = assign(catalogue, policy, nranks, place)
    if policy == "whole-file":   # every rank reads and needs the whole checkpoint
        return _plan(catalogue, spec, policy, nranks, rank, extents, Extent(
            extents[0].relpath, 0, max(catalogue.total_bytes, 1)), needs=extents,
            shared_need=True)
    # `hold` only sizes buffers for layouts that exchange, which existing checkpoints do
    # not; it names the rank's first file (or the index) and the bytes it restores.
    first = extents[0].relpath if extents else (catalogue.index_file or catalogue.files[0][0])
    hold = Extent(first, 0, max(sum(e.length for e in extents), 1))
    return _plan(catalogue, spec, policy, nranks, rank, extents, hold, needs=extents)


def _owners_plan(catalogue: Catalogue, spec: JobSpec, nranks: int, rank: int) -> RankPlan:
    """Policy owners: every rank needs the whole checkpoint (a replicated restore: data
    parallelism, or every GPU of a node holding the model); each tensor is read once, by
    its owner, into its place in memory, then an Allgatherv completes every rank's copy.
    The owners' tensors lie one owner after another in memory, so that each rank's part
    is one range of the buffer (`parts`, in rank order)."""
    per_owner = owned(catalogue, nranks)
    shift = spec.rank_shift
    placed: list[tuple[Extent, ...]] = []
    regions: list[tuple[int, int]] = []
    start = 0
    for extents in per_owner:
        places: list[Extent] = []
        for extent in extents:
            places.append(replace(extent, place=start + sum(e.length for e in places)))
        regions.append((start, sum(e.length for e in extents)))
        start += regions[-1][1]
        placed.append(tuple(places))
    everything = tuple(e for extents in per_owner for e in extents)
    hold = Extent(everything[0].relpath if everything else catalogue.files[0][0], 0,
                  max(start, 1))
    return _plan(catalogue, spec, "owners", nranks, rank, placed[(rank + shift) % nranks], hold,
                 needs=everything, shared_need=True, exchange="allgather", member=rank,
                 parts=tuple(regions[(member + shift) % nranks] for member in range(nranks)))


def _plan(catalogue: Catalogue, spec: JobSpec, policy: str, nranks: int, rank: int,
          extents: tuple[Extent, ...], hold: Extent, needs: tuple[Extent, ...],
          shared_need: bool = False, exchange: str = "", member: int = 0,
          parts: tuple[tuple[int, int], ...] = ()) -> RankPlan:
    return RankPlan(rank=rank, nranks=nranks, layout=policy, ops=spec.ops, extents=extents,
                    block_bytes=spec.block_bytes, stat_count=spec.stat_count,
                    open_count=spec.open_count, hold=hold, needs=needs,
                    shared_need=shared_need, exchange=exchange, member=member, parts=parts,
                    index_file=catalogue.index_file,
                    formatted=catalogue.format in ("safetensors", "hdf5"), order=spec.order)


def finite_dtypes(catalogue: Catalogue) -> dict[str, str]:
    """tensor -> the float dtype run.check_finite checks it as (others are not checked)."""
    return {t.name: FLOATS[t.dtype] for t in catalogue.tensors
            if t.dtype in FLOATS}
