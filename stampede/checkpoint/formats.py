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
import math
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from stampede.dtypes import ITEMSIZE, WRITTEN
from stampede.units import ALIGN_BYTES

if TYPE_CHECKING:
    from collections.abc import Callable

    from stampede.backends.base import Backend
    from stampede.spec import JobSpec

Parsed = TypeVar("Parsed")   # what read_safetensors_header's `parse` makes of the header

# A header larger than this is corrupt, not a checkpoint (safetensors refuses > 100 MB).
MAX_HEADER_BYTES = 100_000_000
# name -> (dtype, shape, file offset of the first byte, bytes): one tensor of a header
HeaderEntry = tuple[str, tuple[int, ...], int, int]


class HeaderError(OSError):
    """A header that cannot be read or does not describe the tensors the plan expects:
    an OSError, so the timed loop counts it as a failed op like any I/O error."""


def nonfinite_count(view: memoryview, dtype: str) -> int:
    """Elements of `view` (as `dtype`) that are NaN or +-Inf: all exponent bits set."""
    kind = WRITTEN[dtype]
    words = np.frombuffer(view, dtype=f"<u{kind.itemsize}", count=len(view) // kind.itemsize)
    return int(np.count_nonzero((words & kind.exponent_mask) == kind.exponent_mask))


def require_packages(spec: JobSpec) -> None:
    """What the job's format needs installed: the command's check, before any I/O (a job
    validates the same way on every machine; running it may need more)."""
    import importlib.util

    from stampede.errors import UsageError, install_hint

    if spec.format == "hdf5" and importlib.util.find_spec("h5py") is None:
        raise UsageError(f"{spec.source}: checkpoint.format = \"hdf5\" needs h5py, which "
                         "is not installed", hint=install_hint("hdf5"))


# --- safetensors: one writer, one reader, one parser ------------------------------------

def safetensors_prefix(tensors: Sequence[tuple[str, int]], dtype: str) -> tuple[bytes, dict[str, int]]:
    """The bytes before the data (length + JSON padded so the data starts on a 4 KiB
    boundary) and each tensor's file offset."""
    kind = WRITTEN[dtype]
    header: dict[str, object] = {"__metadata__": {"format": "pt", "written_by": "stampede"}}
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


def read_safetensors_header(backend: Backend, handle: object, scratch: memoryview | None,
                            parse: Callable[[bytes, int], Parsed]) -> Parsed:
    """Read a safetensors header in whole 4 KiB pages from offset 0 (into the page-aligned
    scratch buffer, or an aligned one of its own when the header is larger or there is
    none), so the same reads work on a handle opened with O_DIRECT, and return
    parse(json_bytes, data_start). Raises HeaderError."""
    from stampede.buffers import AlignedBuffer

    page = ALIGN_BYTES
    own = None
    if scratch is None or len(scratch) < page:
        own = AlignedBuffer(page)
        scratch = own.view
    try:
        got = read_fully(backend, handle, scratch[:page], 0)
        if got < 8:
            raise HeaderError(f"the file ends inside its header ({got} bytes): truncated?")
        length = int.from_bytes(scratch[:8], "little")
        if not 0 < length <= MAX_HEADER_BYTES:
            raise HeaderError(f"safetensors header length {length} is not plausible "
                              "(corrupt, or not safetensors)")
        whole = -(-(8 + length) // page) * page
        view = scratch[:page]
        if whole > page:
            if whole <= len(scratch):
                view = scratch[:whole]
            else:
                if own is not None:
                    own.close()
                own = AlignedBuffer(whole)
                view = own.view
            got = read_fully(backend, handle, view, 0)
        if got < 8 + length:
            raise HeaderError(f"the file ends inside its header (at byte {got}, the header "
                              f"needs {8 + length}): truncated?")
        return parse(bytes(view[8:8 + length]), 8 + length)
    finally:
        if own is not None:
            own.close()


def parse_safetensors(text: bytes, data_start: int,
                      file_bytes: int | None = None) -> dict[str, HeaderEntry]:
    """A safetensors header's JSON, checked as loaders check it: every tensor's dtype,
    shape and data_offsets well formed, its size what dtype and shape need, and (when the
    file's size is known) inside the file. Raises HeaderError saying what is wrong."""
    try:
        header = json.loads(text)
        if not isinstance(header, dict):
            raise TypeError("the header is not a JSON object")
    except (ValueError, TypeError, RecursionError) as error:
        raise HeaderError(f"safetensors header is not valid JSON ({error})") from None
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], tuple(entry["shape"])
            begin, end = entry["data_offsets"]
            if not (isinstance(dtype, str) and all(type(d) is int and d >= 0 for d in shape)
                    and type(begin) is int and type(end) is int and 0 <= begin <= end):
                raise TypeError("bad dtype, shape or data_offsets")
        except (KeyError, TypeError, ValueError) as error:
            raise HeaderError(f"tensor {name!r}: not a valid safetensors header entry "
                              f"({error!s}): {entry!r:.200}") from None
        if not name:
            raise HeaderError("a tensor with an empty name")
        if dtype in ITEMSIZE and math.prod(shape) * ITEMSIZE[dtype] != end - begin:
            raise HeaderError(f"tensor {name!r}: {dtype} {list(shape)} needs "
                              f"{math.prod(shape) * ITEMSIZE[dtype]} bytes, the header gives "
                              f"{end - begin} (corrupt header)")
        if file_bytes is not None and data_start + end > file_bytes:
            raise HeaderError(f"tensor {name!r} ends at byte {data_start + end}, the file has "
                              f"{file_bytes}: truncated?")
        tensors[name] = (dtype, shape, data_start + begin, end - begin)
    return tensors


def read_fully(backend: Backend, handle: object, view: memoryview, offset: int) -> int:
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


# --- the timed header op -------------------------------------------------------------------

def parse_header(fmt: str, backend: Backend, path: object, handle: object, scratch: memoryview,
                 wanted: Iterable[str]) -> dict[str, tuple[int, int]]:
    """The timed `header` op: tensor name -> (file offset, bytes) for the wanted tensors.

    safetensors: read the length and the JSON (in whole pages), parse and check it (whole,
    as loaders do). hdf5: open the file through h5py and look each wanted dataset up.
    Raises HeaderError when the header is unreadable or lacks a wanted tensor.
    """
    if fmt == "safetensors":
        entries = read_safetensors_header(backend, handle, scratch, parse_safetensors)
        found = {name: (offset, nbytes) for name, (_, _, offset, nbytes) in entries.items()}
    else:
        found = _hdf5_tensors(path, wanted)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise HeaderError(f"the header has no tensor {missing[0]!r}")
    return found


# --- creating files ----------------------------------------------------------------------

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
            kind = h5py.h5t.py_create(np.dtype(WRITTEN[dtype].hdf5))
            space = h5py.h5s.create_simple((nbytes // WRITTEN[dtype].itemsize,))
            dataset = h5py.h5d.create(file.id, name.encode(), kind, space, dcpl=dcpl)
            offsets[name] = int(dataset.get_offset())
    os.chmod(path, mode)
    return offsets


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
