"""A restore on another rank count than the save's (policy `reshard`): pure, no I/O.

DCP and Orbax users restore on M ranks a checkpoint N ranks saved after every resize. Rank
m of M then holds rows [m R // M, (m + 1) R // M) of every tensor's dim 0 (R its rows),
whatever cut the saving ranks made, and reads exactly the bytes of those rows:

- DCP: each saved chunk (its first row and its rows from .metadata's chunk offsets and
  sizes; its elements' place in the file from its torch.save record, found by the scan)
  lies row-major, so the new slice's rows within a chunk are one contiguous byte range.
  A tensor cut by columns (Shard(1)) gives each new rank one range in every chunk; one cut
  by rows gives it the ranges of the chunks its rows overlap.
- safetensors, HDF5: a tensor is one chunk of all its rows (tensor-relative extents).
- What has no rows (a scalar, a pickled object, a torch.save or tensorizer item, a
  transformed DCP item) is read whole by one rank: the largest first, to the least-loaded
  rank, as files are.

Each rank needs exactly what it reads (the ranks' needs are disjoint), so a resharding
restore reads 1.0x the bytes its new shards need; the zip records around DCP's elements
are not read.
"""

from __future__ import annotations

import math

from stampede.checkpoint.plan import Extent
from stampede.dtypes import itemsize
from stampede.existing.catalogue import RAW_FORMATS, Catalogue, TensorInfo, balance


def reshard(catalogue: Catalogue, nranks: int, rank: int) -> tuple[Extent, ...]:
    """Rank `rank` of `nranks`: the byte ranges of its new slice of every tensor (module
    docstring), then the whole items it owns; in file order."""
    raw = catalogue.format in RAW_FORMATS
    extents, whole = [], []
    for tensor in catalogue.tensors:
        if not tensor.nbytes:
            continue
        rows = _rows(tensor, raw)
        if rows is None:
            whole.append(tensor)
            continue
        rows_total, row0, start, row_bytes = rows
        first, last = rows_total * rank // nranks, rows_total * (rank + 1) // nranks
        low, high = max(first, row0), min(last, row0 + tensor.shape[0])
        if high > low:
            extents.append(Extent(tensor.relpath, start + (low - row0) * row_bytes,
                                  (high - low) * row_bytes, "" if raw else tensor.name))
    owners = balance(((tensor.name, tensor.nbytes) for tensor in whole), nranks)
    extents += [Extent(t.relpath, t.file_offset, t.nbytes) if raw else
                Extent(t.relpath, 0, t.nbytes, t.name)
                for t in whole if owners[t.name] == rank]
    return tuple(sorted(extents, key=lambda e: (e.relpath, e.tensor, e.offset)))


def _rows(tensor: TensorInfo, raw: bool) -> tuple[int, int, int, int] | None:
    """(the whole tensor's rows, the item's first row, where its row 0 starts, bytes per
    row) of an item cut by rows; None for one read whole."""
    if not tensor.shape or tensor.shape[0] <= 0:
        return None
    # a DCP item's bytes are its torch.save record (the scan checked its elements' size)
    row_bytes = math.prod(tensor.shape[1:]) * itemsize(tensor.dtype)
    if row_bytes <= 0:
        return None
    if not raw:   # safetensors, HDF5: the tensor is all its rows, from its first byte
        whole = row_bytes * tensor.shape[0] == tensor.nbytes
        return (tensor.shape[0], 0, 0, row_bytes) if whole else None
    if tensor.rows_total <= 0 or tensor.data_offset < 0:
        return None
    return tensor.rows_total, tensor.row0, tensor.data_offset, row_bytes
