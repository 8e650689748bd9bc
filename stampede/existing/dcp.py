"""PyTorch Distributed Checkpoint (DCP): `.metadata` (a pickle of
torch.distributed.checkpoint's `Metadata`) and the `__R_K.distcp` files saving rank R
wrote. Unpickling needs torch, and only torch's checkpoint classes, sizes and dtypes are
let out of the pickle. Each saved item (a tensor, one chunk of a sharded tensor, or a
pickled object) is a byte range of one file, in torch's own serialisation: it is read
whole or in byte slices, never decoded here."""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stampede.dtypes import FROM_TORCH, itemsize
from stampede.errors import CheckpointError
from stampede.existing.catalogue import (
    Catalogue,
    Location,
    TensorInfo,
    inside,
    make_catalogue,
    unique_names,
)
from stampede.existing.torchfiles import record_in

if TYPE_CHECKING:
    from types import ModuleType

DCP_INDEX = ".metadata"
SAVED_BY = re.compile(r"^__(\d+)_")   # __R_K.distcp: saved by rank R


def _import_torch() -> ModuleType:
    try:
        import torch
        import torch.distributed.checkpoint  # noqa: F401 - the classes .metadata pickles
    except ImportError as error:
        raise CheckpointError(
            f"PyTorch DCP checkpoints need torch to read {DCP_INDEX} ({error})",
            hint="pip install torch") from None
    return torch


class _MetadataUnpickler(pickle.Unpickler):
    """Lets out of the pickle only what DCP's Metadata is made of: torch.distributed.
    checkpoint's classes, torch.Size, dtypes, layouts and paths; anything else (a
    foreign checkpoint can hold any pickle) is refused before it can run."""

    _PATHS = frozenset({"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"})
    # By exact name: what torch 2.x writes into .metadata (seen with torch 2.13). Any
    # other class of torch.distributed.checkpoint could do work when built (one starts a
    # process group), so none is let out.
    _DCP_CLASSES = frozenset(
        [("torch.distributed.checkpoint.metadata", name) for name in (
            "Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
            "ChunkStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")]
        + [("torch.distributed.checkpoint.filesystem", "_StorageInfo")])

    def __init__(self, stream: io.BytesIO, torch: ModuleType) -> None:
        super().__init__(stream)
        self.torch = torch

    def find_class(self, module: str, name: str) -> object:
        torch = self.torch
        allowed = (
            (module, name) in self._DCP_CLASSES
            or (module == "torch" and (name == "Size" or isinstance(
                getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format))))
            or (module == "torch.serialization" and name == "_get_layout")
            or (module in ("pathlib", "pathlib._local") and name in self._PATHS)
            or (module == "collections" and name == "OrderedDict")
            or (module == "copyreg" and name == "_reconstructor")
            or (module == "builtins" and name in ("object", "set", "frozenset", "tuple", "list",
                                                  "dict", "slice", "complex"))
        )
        if not allowed or "." in name:   # a dotted name reaches through to any attribute
            raise pickle.UnpicklingError(f"refusing {module}.{name}: not part of DCP metadata")
        return super().find_class(module, name)


def scan_dcp(location: Location) -> Catalogue:
    torch = _import_torch()
    where = location.where(DCP_INDEX)
    data = location.read(DCP_INDEX)
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), torch).load()
    except CheckpointError:
        raise
    except Exception as error:  # a corrupt pickle raises about anything
        raise CheckpointError(f"{where}: not a readable PyTorch DCP metadata file "
                              f"({type(error).__name__}: {error})") from None
    storage = getattr(metadata, "storage_data", None)
    state = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(storage, dict) or not isinstance(state, dict):
        raise CheckpointError(f"{where}: not PyTorch DCP metadata (no storage_data: "
                              f"{type(metadata).__name__})")
    if not storage:
        raise CheckpointError(f"{where}: the checkpoint saved nothing (empty storage_data)")
    sizes: dict[str, int] = {}
    tensors = []
    # one file open at a time (a DCP file holds one rank's items, saved together): its
    # size and every item's zip directory read through one open (an object store: one
    # HEAD per file, not per read)
    with ExitStack() as files:
        opened, read = "", None
        for index, info in storage.items():
            relpath, offset, length = info.relative_path, int(info.offset), int(info.length)
            if not inside(relpath):
                raise CheckpointError(f"{where}: names {relpath!r}, outside the checkpoint "
                                      "directory")
            if relpath != opened or read is None:
                files.close()
                try:
                    read, size = files.enter_context(location.opened(relpath))
                    sizes.setdefault(relpath, size())
                except CheckpointError as error:
                    raise CheckpointError(f"{where}: names {relpath}, which cannot be read "
                                          f"({error})") from None
                opened = relpath
            if offset < 0 or length < 0 or offset + length > sizes[relpath]:
                raise CheckpointError(f"{location.where(relpath)}: {index.fqn} is saved at "
                                      f"bytes {offset}..{offset + length}, the file has "
                                      f"{sizes[relpath]}: truncated?")
            meta = state.get(index.fqn)
            name, dtype, shape = _dcp_item(index, meta)
            tensors.append(_with_rows(read, location.where(relpath),
                                      TensorInfo(name, relpath, dtype, shape, length, offset),
                                      index, meta, info))
    tensors = unique_names(tensors)
    saved_by = {m.group(1) for relpath in sizes if (m := SAVED_BY.match(relpath))}
    return make_catalogue(location.root, "dcp", list(sizes.items()), tensors, DCP_INDEX,
                          len(saved_by))


def _with_rows(read: Callable[[int, int], bytes], where: str, item: TensorInfo,
               index: object, meta: object, info: object) -> TensorInfo:
    """The item as rows of its tensor (dim 0), where the rows' bytes lie in the file (its
    torch.save record's elements, row-major): what a restore that reshards reads. Left
    whole (rows_total 0) where the item is no tensor's chunk, a scalar, transformed
    (compressed) or its record is not exactly its elements."""
    size = tuple(int(d) for d in getattr(meta, "size", ()) or ())
    chunk_offset = tuple(int(d) for d in getattr(index, "offset", None) or ())
    if not size or not item.shape or len(chunk_offset) != len(size) or not item.dtype \
            or getattr(info, "transform_descriptors", None):
        return item
    elements = 1
    for dim in item.shape:
        elements *= dim
    record = record_in(read, where, item.file_offset, item.nbytes)
    if record is None or record[1] != elements * itemsize(item.dtype):
        return item
    return replace(item, fqn=str(getattr(index, "fqn", "")), rows_total=size[0], row0=chunk_offset[0],
                   data_offset=record[0])


def _dcp_item(index: Any, meta: object) -> tuple[str, str, tuple[int, ...]]:
    """(name, dtype, shape) of one saved item: a chunk of a tensor, or a pickled object."""
    chunks = getattr(meta, "chunks", None)
    if not chunks:   # BytesStorageMetadata, or metadata that does not describe the item
        return index.fqn, "", ()
    dtype = str(getattr(getattr(meta, "properties", None), "dtype", "")).removeprefix("torch.")
    dtype = FROM_TORCH.get(dtype, dtype)
    position = index.index if isinstance(index.index, int) and 0 <= index.index < len(chunks) \
        else -1
    if position < 0 or (index.offset is not None
                        and tuple(chunks[position].offsets) != tuple(index.offset)):
        matches = [i for i, chunk in enumerate(chunks)
                   if index.offset is not None and tuple(chunk.offsets) == tuple(index.offset)]
        position = matches[0] if matches else -1
    shape = tuple(int(d) for d in chunks[position].sizes) if position >= 0 else \
        tuple(int(d) for d in getattr(meta, "size", ()))
    name = f"{index.fqn}#{position}" if len(chunks) > 1 and position >= 0 else index.fqn
    return name, dtype, shape


def metadata_parser() -> Callable[[bytes | bytearray], object]:
    """How DCP's loader parses its .metadata, inside the timed `index` op: unpickled
    (with torch, imported here, before any timing). Raises ValueError on what it cannot
    parse."""
    torch = _import_torch()

    def unpickle(data: bytes | bytearray) -> object:
        try:
            return _MetadataUnpickler(io.BytesIO(data), torch).load()
        except Exception as error:  # a corrupt pickle raises about anything
            raise ValueError(f"not readable PyTorch DCP metadata ({error})") from None
    return unpickle
