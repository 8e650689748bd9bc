"""Checkpoint file formats: where each tensor's bytes live in a file, and the header that
says so.

- raw: the bytes alone; a rank's slice sits at a file offset the plan knows.
- safetensors: 8 bytes (little-endian header length n), n bytes of JSON naming every
  tensor (dtype, shape, data_offsets relative to the data), then the data. stampede pads
  the JSON with spaces (the format allows it) so the data starts on a 4 KiB boundary and
  O_DIRECT reads stay aligned.
- hdf5: one contiguous, unfiltered dataset per tensor, allocated when the file is created
  and aligned to 4 KiB; its file offset is found through libhdf5 (h5py), as a loader
  that maps or preads HDF5 data does.

A restore of a formatted file starts with the `header` op: read and parse the header
(safetensors: two reads and a JSON parse; hdf5: open through h5py and look the datasets
up), inside the timed restore, as real loaders do. Tensor extents in a plan are relative
to the tensor's first byte; the header says where that byte is.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EXTENSIONS = {"raw": "raw", "safetensors": "safetensors", "hdf5": "h5"}
ALIGN_BYTES = 4096
# A header larger than this is corrupt, not a checkpoint (safetensors refuses > 100 MB).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class DType:
    safetensors: str       # the dtype's name in a safetensors header
    itemsize: int
    exponent_mask: int     # all exponent bits: set together = Inf or NaN


DTYPES = {
    "float16": DType("F16", 2, 0x7C00),
    "bfloat16": DType("BF16", 2, 0x7F80),
    "float32": DType("F32", 4, 0x7F800000),
}
_H5_TYPES = {"float16": "<f2", "float32": "<f4"}


class HeaderError(OSError):
    """A header that cannot be read or does not describe the tensors the plan expects:
    an OSError, so the timed loop counts it as a failed op like any I/O error."""


def nonfinite_count(view: memoryview, dtype: str) -> int:
    """Elements of `view` (as `dtype`) that are NaN or +-Inf: all exponent bits set."""
    kind = DTYPES[dtype]
    words = np.frombuffer(view, dtype=f"<u{kind.itemsize}", count=len(view) // kind.itemsize)
    return int(np.count_nonzero((words & kind.exponent_mask) == kind.exponent_mask))


def safetensors_prefix(tensors: Sequence[tuple[str, int]], dtype: str) -> tuple[bytes, dict[str, int]]:
    """The bytes before the data (length + padded JSON) and each tensor's file offset."""
    kind = DTYPES[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "written_by": "stampede"}}
    begin = 0
    for name, nbytes in tensors:
        header[name] = {"dtype": kind.safetensors, "shape": [nbytes // kind.itemsize],
                        "data_offsets": [begin, begin + nbytes]}
        begin += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    data_start = -(-(8 + len(text)) // ALIGN_BYTES) * ALIGN_BYTES
    text += b" " * (data_start - 8 - len(text))
    offsets, begin = {}, data_start
    for name, nbytes in tensors:
        offsets[name] = begin
        begin += nbytes
    return struct.pack("<Q", len(text)) + text, offsets


def create_file(fmt: str, path: Path, tensors: Sequence[tuple[str, int]], dtype: str,
                mode: int) -> dict[str, int]:
    """Create `path` at its full size with its header (untimed, by one rank, before the
    ranks write the data in parallel); returns each tensor's file offset."""
    if fmt == "hdf5":
        return _create_hdf5(path, tensors, dtype, mode)
    prefix, offsets = (b"", {"": 0}) if fmt == "raw" else safetensors_prefix(tensors, dtype)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, mode)
    try:
        os.ftruncate(fd, len(prefix) + sum(nbytes for _, nbytes in tensors))
        if prefix:
            os.pwrite(fd, prefix, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return offsets


def _create_hdf5(path: Path, tensors: Sequence[tuple[str, int]], dtype: str,
                 mode: int) -> dict[str, int]:
    import h5py  # only for hdf5 checkpoints

    path.unlink(missing_ok=True)
    offsets = {}
    # Early allocation, never filled: the space exists (and has an offset) before the ranks
    # write into it; alignment keeps every dataset on a 4 KiB boundary for O_DIRECT.
    with h5py.File(path, "w", alignment_threshold=1, alignment_interval=ALIGN_BYTES) as file:
        for name, nbytes in tensors:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.CONTIGUOUS)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            kind = h5py.h5t.py_create(np.dtype(_H5_TYPES[dtype]))
            space = h5py.h5s.create_simple((nbytes // DTYPES[dtype].itemsize,))
            dataset = h5py.h5d.create(file.id, name.encode(), kind, space, dcpl=dcpl)
            offsets[name] = int(dataset.get_offset())
    os.chmod(path, mode)
    return offsets


def parse_header(fmt: str, backend: Any, path: Any, handle: Any, scratch: memoryview,
                 wanted: Iterable[str]) -> dict[str, tuple[int, int]]:
    """The timed `header` op: tensor name -> (file offset, bytes) for the wanted tensors.

    safetensors: read the length and the JSON (in whole pages), parse it (whole, as
    loaders do).
    hdf5: open the file through h5py and look each wanted dataset up.
    Raises HeaderError when the header is unreadable or lacks a wanted tensor.
    """
    if fmt == "safetensors":
        found = _safetensors_tensors(backend, handle, scratch)
    else:
        found = _hdf5_tensors(path, wanted)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise HeaderError(f"the header has no tensor {missing[0]!r}")
    return found


def read_fully(backend: Any, handle: Any, view: memoryview, offset: int) -> int:
    """Fill `view` from `offset`; fewer bytes only at the end of the file. Stops at the
    first short read (the end of a file or object): a read after it would start at an
    unaligned offset, which O_DIRECT may refuse even at the end of the file."""
    done = 0
    while done < len(view):
        wanted = len(view) - done
        count = backend.read_into(handle, view[done:], offset + done)
        done += max(count, 0)
        if count < wanted:
            break
    return done


def _safetensors_tensors(backend: Any, handle: Any, scratch: memoryview) -> dict[str, tuple[int, int]]:
    """Read the header in whole 4 KiB pages from offset 0 into the page-aligned scratch
    buffer (or an aligned one of its own when the header is larger), so the same reads
    work on a handle opened with O_DIRECT."""
    from stampede.buffers import AlignedBuffer

    page = ALIGN_BYTES
    first = scratch[:page] if len(scratch) >= page else None
    own = None
    if first is None:
        own = AlignedBuffer(page)
        first = own.view
    try:
        got = read_fully(backend, handle, first, 0)
        if got < 8:
            raise HeaderError(f"the file ends inside its header ({got} bytes)")
        length = int.from_bytes(first[:8], "little")
        if not 0 < length <= MAX_HEADER_BYTES:
            raise HeaderError(f"safetensors header length {length} is not plausible (corrupt?)")
        whole = -(-(8 + length) // page) * page
        if whole > page:
            if whole <= len(scratch):
                view = scratch[:whole]
            else:
                if own is not None:
                    own.close()
                own = AlignedBuffer(whole)
                view = own.view
            got = read_fully(backend, handle, view, 0)
        else:
            view = first
        if got < 8 + length:
            raise HeaderError(f"the file ends inside its header (at byte {got})")
        try:
            header = json.loads(bytes(view[8:8 + length]))
            start = 8 + length
            return {name: (start + entry["data_offsets"][0],
                           entry["data_offsets"][1] - entry["data_offsets"][0])
                    for name, entry in header.items() if name != "__metadata__"}
        except (ValueError, TypeError, KeyError, IndexError, RecursionError) as error:
            raise HeaderError(f"safetensors header is not valid ({error})") from None
    finally:
        if own is not None:
            own.close()


def open_hdf5(path: str) -> Any:
    """An HDF5 file opened read-only without file locking: a lock is a write of a kind,
    and file systems mounted without flock refuse it."""
    import h5py

    try:
        return h5py.File(path, "r", locking=False)
    except (TypeError, ValueError):   # an HDF5 library without the locking switch
        return h5py.File(path, "r")


def _hdf5_tensors(path: Any, wanted: Iterable[str]) -> dict[str, tuple[int, int]]:
    import h5py

    try:
        with open_hdf5(os.fsdecode(path)) as file:
            found = {}
            for name in wanted:
                dataset = file.get(name)
                if not isinstance(dataset, h5py.Dataset):
                    continue
                offset = dataset.id.get_offset()
                if offset is None or dataset.chunks is not None or dataset.compression:
                    raise HeaderError(f"dataset {name!r} is chunked, filtered or unallocated:"
                                         " stampede reads contiguous datasets")
                found[name] = (int(offset), int(dataset.id.get_storage_size()))
            return found
    except OSError as error:
        if isinstance(error, HeaderError):
            raise
        raise HeaderError(f"HDF5: {error}") from None
