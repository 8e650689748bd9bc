"""Checkpoints stampede did not write: what one holds, and who reads what of it.

`scan(path)` reads only the headers of an existing checkpoint (a directory, or a single
file) and returns its `Catalogue`: the format, the data files, every tensor (or saved
byte range) with its dtype, shape, size and file offset. `assign(catalogue, policy,
nranks, rank)` says which bytes one rank reads, as `stampede.checkpoint.plan.Extent`s, the way a
real loader splits the work. Both are pure apart from scan's reads: nothing is written
anywhere near the checkpoint (no manifest, no temporary file), and every file is opened
read-only.

Where scan reads: a POSIX path through os (open O_RDONLY, pread), or a URL (s3://bucket/
prefix, or one object's URL) through the target's backend (`stampede.backends`), with
only reading requests: one LIST of the prefix, a HEAD per file (its size), ranged GETs of
the headers, and whole GETs of the small files (DCP's .metadata; a missing
stampede-manifest.json). The same format code serves both (`_PosixReader`,
`_ObjectReader`). HDF5 is read from POSIX paths only: h5py opens the file itself.

Formats:
- safetensors: one `*.safetensors` file, or the shards a `*.safetensors.index.json`
  (Hugging Face's `weight_map`) names. Each file: 8 bytes (little-endian header length
  n), n bytes of JSON, then the data; parsed here with json alone.
- dcp (PyTorch Distributed Checkpoint): `.metadata` (a pickle of
  torch.distributed.checkpoint's `Metadata`) and the `__R_K.distcp` files saving rank R
  wrote. Unpickling needs torch, and only torch's checkpoint classes, sizes and dtypes
  are let out of the pickle. Each saved item (a tensor, one chunk of a sharded tensor, or
  a pickled object) is a byte range of one file, in torch's own serialisation: it is read
  whole or in byte slices, never decoded here.
- hdf5: `*.h5` / `*.hdf5` files written by h5py or libhdf5; every dataset, in groups at
  any depth (named with '/'), must be contiguous and unfiltered: stampede reads a
  dataset's bytes at its file offset, as a loader that maps or preads HDF5 data does.

Extents of safetensors and HDF5 tensors are relative to the tensor's first byte and name
the tensor, so the timed `header` op locates them (stampede.checkpoint.formats.parse_header); DCP
extents are raw file offsets (tensor ""). DCP's `.metadata` is never in an extent:
every rank reads it whole first (`Catalogue.index_file`), which the caller plans as the
shared index read.

Policies (`POLICIES`):
- files: whole files to ranks, balanced by bytes (largest file first to the least loaded
  rank, ties to the lower rank): how per-file loaders (HF's sharded `from_pretrained`
  under data parallelism with one reader per shard) spread a restore.
- tensor-slices: every rank reads 1/N of every tensor, a contiguous range of the
  flattened tensor cut on element boundaries (DCP items: on byte boundaries): the
  tensor-parallel load. A tensor with fewer elements than ranks leaves some ranks out.
- saved (dcp only): rank r reads what saving ranks s with s % N == r wrote; with as many
  ranks as saved it, every rank reads its own files back.
Under files and tensor-slices every tensor byte is read by exactly one rank; no extent is
empty (zero-byte tensors are catalogued but never read).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import io
import json
import math
import os
import pickle
import re
import stat as stat_module
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from stampede.checkpoint.formats import MAX_HEADER_BYTES, open_hdf5, read_fully
from stampede.checkpoint.manifest import MANIFEST_NAME
from stampede.checkpoint.plan import Extent, RankPlan
from stampede.errors import CheckpointError, UsageError
from stampede.spec import JobSpec

FORMATS = ("safetensors", "dcp", "hdf5")
POLICIES = ("files", "tensor-slices", "saved")
DCP_INDEX = ".metadata"
SUPPORTED = ("safetensors (*.safetensors, sharded with *.safetensors.index.json), "
             "PyTorch DCP (.metadata + __R_K.distcp), HDF5 (*.h5, *.hdf5; contiguous datasets)")
_HDF5_SUFFIXES = (".h5", ".hdf5")
_INDEX_SUFFIX = ".safetensors.index.json"
_SAVED_BY = re.compile(r"^__(\d+)_")
# Weight files of formats stampede does not read: named when found, to say why not.
_UNSUPPORTED = (".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".npy", ".msgpack", ".onnx",
                ".pkl", ".h5.gz", ".tflite", ".keras")

# Bytes per element by safetensors' dtype names (the names TensorInfo.dtype uses for every
# format); an unknown or sub-byte dtype is sliced on byte boundaries.
ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "C32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
    "C128": 16,
}
# torch dtype names -> the same names (DCP metadata carries torch dtypes)
_TORCH_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0", "int16": "I16", "uint16": "U16",
    "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32", "float32": "F32",
    "int64": "I64", "uint64": "U64", "float64": "F64", "complex64": "C64",
    "complex128": "C128",
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors or HDF5 file, or one saved item of a DCP checkpoint."""

    name: str                 # HDF5: the dataset's path ('/'-separated); DCP: fqn[#chunk]
    relpath: str              # the data file, relative to Catalogue.root
    dtype: str                # safetensors' names (F32, BF16, I64, ...); "" if unknown
    shape: tuple[int, ...]
    nbytes: int
    file_offset: int          # where its first byte is in the file (from the header)

    @property
    def itemsize(self) -> int:
        """Bytes of one element, where slicing on element boundaries makes sense; else 1."""
        size = itemsize(self.dtype)
        return size if self.nbytes % size == 0 else 1


@dataclass(frozen=True)
class Catalogue:
    """What an existing checkpoint holds, from its headers alone."""

    root: str                 # the directory (or the single file's directory), absolute;
                              # a URL: the prefix (or the object's parent), no trailing /
    format: str               # "safetensors" | "dcp" | "hdf5"
    files: tuple[tuple[str, int], ...]     # (relpath, bytes) of every data file, sorted
    tensors: tuple[TensorInfo, ...]        # sorted by (relpath, file_offset)
    index_file: str           # "" | the *.safetensors.index.json | ".metadata"
    saving_ranks: int         # dcp: distinct __R_ prefixes of the data files; else 0

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor (DCP: every saved item): what a whole restore reads."""
        return sum(tensor.nbytes for tensor in self.tensors)


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (ITEMSIZE); 1 when unknown or sub-byte."""
    return ITEMSIZE.get(dtype, 1)


# --------------------------------------------------------------------------------- scan


def scan(path: str, storage_options: dict[str, Any] | None = None) -> Catalogue:
    """Catalogue the checkpoint at `path` (a directory or one file, or a URL: an object
    store's prefix or one object), reading only headers. `storage_options` configure the
    backend of a URL (its endpoint, ...; credentials come from the environment).

    Raises CheckpointError when the path holds no checkpoint stampede can read (saying
    what was found and what is supported), when a header is corrupt or truncated, when a
    file an index names is missing, or when the path is a stampede-prepared target;
    UsageError for HDF5 on an object store (h5py reads through a POSIX path).
    """
    reader: _Reader
    if "://" in path:
        if path.rstrip("/").lower().endswith(_HDF5_SUFFIXES):
            raise _hdf5_on_objects(path.rstrip("/"))
        reader, only = _ObjectReader.at(path, storage_options)
    else:
        reader, only = _PosixReader.at(path)
    reader.refuse_prepared()
    if only:
        return _scan_file(reader, only)
    names = reader.names()
    if DCP_INDEX in names:
        return _scan_dcp(reader)
    indexes = sorted(n for n in names if n.endswith(_INDEX_SUFFIX) and reader.is_file(n))
    weights = sorted(n for n in names if n.endswith(".safetensors") and reader.is_file(n))
    hdf5 = sorted(n for n in names if n.lower().endswith(_HDF5_SUFFIXES) and reader.is_file(n))
    root = reader.root
    if (indexes or weights) and hdf5:
        raise CheckpointError(f"{root}: holds both safetensors ({(indexes + weights)[0]}) and "
                              f"HDF5 ({hdf5[0]}) files: which is the checkpoint?",
                              hint="point at the one file to restore")
    if len(indexes) > 1:
        raise CheckpointError(f"{root}: {len(indexes)} safetensors index files "
                              f"({', '.join(indexes)}): which is the checkpoint?",
                              hint="point at the index file to restore")
    if indexes:
        return _scan_safetensors(reader, indexes[0])
    if weights:
        return _scan_safetensors(reader, "", weights)
    if hdf5:
        return _scan_hdf5(reader, hdf5)
    raise CheckpointError(_nothing_found(reader, names), hint=f"stampede reads {SUPPORTED}")


def _scan_file(reader: _Reader, name: str) -> Catalogue:
    """A single file: a safetensors or HDF5 file, an index, or a DCP .metadata."""
    if name == DCP_INDEX:
        return _scan_dcp(reader)
    if name.endswith(_INDEX_SUFFIX):
        return _scan_safetensors(reader, name)
    if name.endswith(".safetensors"):
        return _scan_safetensors(reader, "", [name])
    if name.lower().endswith(_HDF5_SUFFIXES):
        return _scan_hdf5(reader, [name])
    raise CheckpointError(f"{reader.where(name)}: not a checkpoint file stampede reads",
                          hint=f"stampede reads {SUPPORTED}")


def _nothing_found(reader: _Reader, names: list[str]) -> str:
    root = reader.root
    if not names:
        return f"{root}: empty, no checkpoint here"
    unsupported = [n for n in names if n.lower().endswith(_UNSUPPORTED)]
    if unsupported:
        return (f"{root}: no checkpoint stampede reads; found {_some(unsupported)} "
                "(a format stampede does not read)")
    dirs = [n for n in names if reader.is_dir(n)]
    found = f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {_some(names)}"
    if dirs and len(dirs) == len(names):
        found += " (directories only: point at the one that holds the weight files)"
    return f"{root}: no checkpoint stampede reads; found {found}"


def _some(names: list[str], count: int = 5) -> str:
    shown = ", ".join(names[:count])
    return shown + (f" and {len(names) - count} more" if len(names) > count else "")


def _prepared_error(where: str) -> CheckpointError:
    return CheckpointError(
        f"{where}: a target stampede prepared ({MANIFEST_NAME}), not a checkpoint of "
        "another tool", hint="restore it with a normal `stampede run` of its job")


# ------------------------------------------------------------------------------ readers


class _Reader:
    """Where scan reads a checkpoint's headers: read-only access to the files under
    `root`, by relative path. Every failure leaves as a CheckpointError naming the file
    (or, from `size`, an OSError the caller words)."""

    root: str
    local = True   # a POSIX path (h5py can open its files)

    def where(self, relpath: str) -> str:
        """A file's full name, for messages."""
        return os.path.join(self.root, relpath)

    def refuse_prepared(self) -> None:
        """CheckpointError when the root or its parent holds a stampede manifest."""
        raise NotImplementedError

    def names(self) -> list[str]:
        """The entries at the top of the root (files and directories), sorted."""
        raise NotImplementedError

    def is_file(self, relpath: str) -> bool:
        raise NotImplementedError

    def is_dir(self, name: str) -> bool:
        raise NotImplementedError

    def open(self, relpath: str) -> tuple[Any, int]:
        """(handle opened read-only, file size)."""
        raise NotImplementedError

    def read(self, handle: Any, length: int, offset: int) -> bytes:
        """Up to `length` bytes at `offset` (fewer only at the end of the file)."""
        raise NotImplementedError

    def close(self, handle: Any) -> None:
        raise NotImplementedError

    def size(self, relpath: str) -> int:
        """A file's size; OSError when it cannot be had."""
        raise NotImplementedError

    def stream(self, relpath: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A whole (small) file as a binary stream."""
        raise NotImplementedError


class _PosixReader(_Reader):
    """A directory on a file system: os.open(O_RDONLY) and pread."""

    def __init__(self, root: str) -> None:
        self.root = root

    @classmethod
    def at(cls, path: str) -> tuple[_PosixReader, str]:
        """(the reader of the directory, "") or (of the file's directory, the file)."""
        path = os.path.abspath(os.fspath(path))
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            raise CheckpointError(f"{path}: {error.strerror or error}") from None
        if stat_module.S_ISDIR(mode):
            return cls(path), ""
        if stat_module.S_ISREG(mode):
            return cls(os.path.dirname(path)), os.path.basename(path)
        raise CheckpointError(f"{path}: neither a directory nor a regular file",
                              hint=f"point at a checkpoint: {SUPPORTED}")

    def refuse_prepared(self) -> None:
        for where in (self.root, os.path.dirname(self.root)):
            if os.path.lexists(os.path.join(where, MANIFEST_NAME)):
                raise _prepared_error(where)

    def names(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except OSError as error:
            raise CheckpointError(f"{self.root}: cannot list it "
                                  f"({error.strerror or error})") from None

    def is_file(self, relpath: str) -> bool:
        return os.path.isfile(os.path.join(self.root, relpath))

    def is_dir(self, name: str) -> bool:
        return os.path.isdir(os.path.join(self.root, name))

    def open(self, relpath: str) -> tuple[int, int]:
        where = self.where(relpath)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise CheckpointError(f"{where}: {error.strerror or error}") from None
        try:
            size = os.fstat(fd).st_size
        except OSError as error:
            os.close(fd)
            raise CheckpointError(f"{where}: {error.strerror or error}") from None
        return fd, size

    def read(self, handle: int, length: int, offset: int) -> bytes:
        chunks, done = [], 0
        while done < length:
            chunk = os.pread(handle, length - done, offset + done)
            if not chunk:
                break
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def close(self, handle: int) -> None:
        os.close(handle)

    def size(self, relpath: str) -> int:
        return os.stat(os.path.join(self.root, relpath)).st_size

    def stream(self, relpath: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        fd, _ = self.open(relpath)
        return os.fdopen(fd, "rb", closefd=True)


class _ObjectReader(_Reader):
    """A prefix of an object store (or any fsspec target), through its stampede backend:
    reading requests only. The prefix is listed once (recursively: the names of nested
    files are known without a request); a file's size is one HEAD, a header one ranged
    GET per read, a small file one GET."""

    local = False

    def __init__(self, root: str, backend: Any, storage_options: dict[str, Any] | None,
                 listed: list[str] | None) -> None:
        self.root, self.backend, self.storage_options = root, backend, storage_options
        self.listed = set(listed) if listed is not None else None
        self._open = backend.opener(False)

    @classmethod
    def at(cls, url: str, storage_options: dict[str, Any] | None) -> tuple[_ObjectReader, str]:
        """(the reader of the prefix, "") when objects lie under it, else (of the parent
        prefix, the object's name) when the URL names one object."""
        from stampede.backends import open_backend

        url = url.rstrip("/")
        backend = open_backend(url, storage_options)
        listed = _listing(backend, url)
        if listed:
            return cls(url, backend, storage_options, listed), ""
        parent = _parent_url(url)
        if parent is not None:
            try:
                backend.close(backend.opener(False)(backend.path("")))
            except FileNotFoundError:
                pass
            except OSError as error:
                raise CheckpointError(f"{url}: {error.strerror or error}") from None
            else:
                return cls(parent, open_backend(parent, storage_options), storage_options,
                           None), url[len(parent) + 1:]
        raise CheckpointError(f"{url}: empty, no checkpoint here (no object has this name or "
                              "this prefix)", hint=f"stampede reads {SUPPORTED}")

    def where(self, relpath: str) -> str:
        return f"{self.root}/{relpath}"

    def refuse_prepared(self) -> None:
        from stampede.backends import open_backend

        parent = _parent_url(self.root)
        for where in (self.root, parent):
            if where is None:
                continue
            backend = self.backend if where == self.root else \
                open_backend(where, self.storage_options)
            try:
                found = backend.get_bytes(MANIFEST_NAME) is not None
            except PermissionError:
                # S3 answers 403, not 404, for a missing key to a reader without
                # s3:ListBucket: read-only credentials must still scan
                found = False
            except OSError as error:
                raise CheckpointError(f"{where}/{MANIFEST_NAME}: "
                                      f"{error.strerror or error}") from None
            if found:
                raise _prepared_error(where)

    def names(self) -> list[str]:
        return sorted({name.partition("/")[0] for name in self.listed or ()})

    def is_file(self, relpath: str) -> bool:
        if self.listed is not None:
            return relpath in self.listed
        try:
            self.backend.close(self._head(relpath))
        except FileNotFoundError:
            return False
        except OSError as error:
            raise CheckpointError(f"{self.where(relpath)}: {error.strerror or error}") from None
        return True

    def is_dir(self, name: str) -> bool:
        return any(listed.startswith(f"{name}/") for listed in self.listed or ())

    def _head(self, relpath: str) -> Any:
        return self._open(self.backend.path(relpath))

    def open(self, relpath: str) -> tuple[tuple[Any, str], int]:
        """((the backend's handle, relpath), the size its HEAD told)."""
        try:
            handle = self._head(relpath)
        except OSError as error:
            raise CheckpointError(f"{self.where(relpath)}: {error.strerror or error}") from None
        return (handle, relpath), int(handle.size)

    def read(self, handle: tuple[Any, str], length: int, offset: int) -> bytes:
        data = bytearray(length)
        with memoryview(data) as view:
            try:
                done = read_fully(self.backend, handle[0], view, offset)
            except OSError as error:
                raise CheckpointError(f"{self.where(handle[1])}: "
                                      f"{error.strerror or error}") from None
        return bytes(data[:done])

    def close(self, handle: tuple[Any, str]) -> None:
        self.backend.close(handle[0])

    def size(self, relpath: str) -> int:
        handle = self._head(relpath)
        self.backend.close(handle)
        return int(handle.size)

    @contextlib.contextmanager
    def _whole(self, relpath: str) -> Iterator[IO[bytes]]:
        try:
            data = self.backend.get_bytes(relpath)
        except OSError as error:
            raise CheckpointError(f"{self.where(relpath)}: {error.strerror or error}") from None
        if data is None:
            raise CheckpointError(f"{self.where(relpath)}: {os.strerror(errno.ENOENT)}")
        yield io.BytesIO(data)

    def stream(self, relpath: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self._whole(relpath)


def _listing(backend: Any, url: str) -> list[str]:
    """Every file under the prefix, relative to it (one LIST per 1,000 names)."""
    try:
        found = backend.names()
    except (FileNotFoundError, PermissionError):
        # PermissionError: no s3:ListBucket; a single object's URL is still HEAD-able
        return []
    except OSError as error:
        raise CheckpointError(f"{url}: cannot list it ({error.strerror or error})") from None
    # fsspec's find of a file's own path returns that path: not a name under it
    return [name for name in found if name and name != backend.path("")]


def _parent_url(url: str) -> str | None:
    """scheme://a/b -> scheme://a; None at the top (a bucket: nothing above it)."""
    scheme, _, rest = url.partition("://")
    head, slash, _ = rest.rstrip("/").rpartition("/")
    return f"{scheme}://{head}" if slash and head.strip("/") else None


# ------------------------------------------------------------------------- safetensors


def _weight_map(reader: _Reader, index: str) -> dict[str, str]:
    """tensor -> shard, from a Hugging Face index; every shard it names must exist."""
    where = reader.where(index)
    handle, size = reader.open(index)
    try:
        if size > MAX_HEADER_BYTES:
            raise CheckpointError(f"{where}: {size} bytes is not a plausible index (corrupt?)")
        text = reader.read(handle, size, 0)
    finally:
        reader.close(handle)
    try:
        weight_map = json.loads(text)["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a non-empty map of tensor -> file")
    except (ValueError, TypeError, KeyError, RecursionError) as error:
        raise CheckpointError(f"{where}: not a safetensors index ({error!s})") from None
    for relpath in sorted(set(weight_map.values())):
        if not _inside(relpath):
            raise CheckpointError(f"{where}: names {relpath!r}, outside the checkpoint directory")
        if not reader.is_file(relpath):
            raise CheckpointError(f"{where}: names {relpath}, which is missing "
                                  f"({reader.where(relpath)}: No such file)",
                                  hint="a sharded checkpoint restores only with every shard")
    return weight_map


def _inside(relpath: str) -> bool:
    parts = relpath.replace("\\", "/").split("/")
    return bool(relpath) and not os.path.isabs(relpath) and ".." not in parts


def _scan_safetensors(reader: _Reader, index: str, relpaths: Iterable[str] = ()) -> Catalogue:
    """The files named (no index), or those the index names: loaders read only those."""
    weight_map = _weight_map(reader, index) if index else {}
    files, tensors = [], []
    for relpath in sorted(set(weight_map.values())) if index else relpaths:
        size, found = _safetensors_header(reader, relpath)
        files.append((relpath, size))
        tensors.extend(found)
    held = {(t.name, t.relpath) for t in tensors}
    for name, relpath in sorted(weight_map.items()):
        if (name, relpath) not in held:   # loaders look tensors up where the index says
            raise CheckpointError(f"{reader.where(index)}: names tensor {name!r} in "
                                  f"{relpath}, whose header does not hold it")
    return _catalogue(reader.root, "safetensors", files, tensors, index, 0)


def _safetensors_header(reader: _Reader, relpath: str) -> tuple[int, list[TensorInfo]]:
    """(file size, tensors) from one file's length prefix and JSON header."""
    where = reader.where(relpath)
    handle, size = reader.open(relpath)
    try:
        prefix = reader.read(handle, 8, 0)
        if len(prefix) < 8:
            raise CheckpointError(f"{where}: {size} bytes, too short for a safetensors header "
                                  "(truncated?)")
        length = int.from_bytes(prefix, "little")
        if not 0 < length <= MAX_HEADER_BYTES:
            raise CheckpointError(f"{where}: safetensors header length {length} is not "
                                  "plausible (corrupt, or not safetensors)")
        if 8 + length > size:
            raise CheckpointError(f"{where}: the file ends inside its header ({size} bytes, the "
                                  f"header needs {8 + length}): truncated?")
        text = reader.read(handle, length, 8)
    finally:
        reader.close(handle)
    try:
        header = json.loads(text)
        if not isinstance(header, dict):
            raise TypeError("the header is not a JSON object")
    except (ValueError, TypeError, RecursionError) as error:
        raise CheckpointError(f"{where}: safetensors header is not valid JSON ({error})") from None
    data_start, tensors = 8 + length, []
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
            raise CheckpointError(f"{where}: tensor {name!r}: not a valid safetensors header "
                                  f"entry ({error!s}): {entry!r:.200}") from None
        if not name:
            raise CheckpointError(f"{where}: a tensor with an empty name")
        if dtype in ITEMSIZE and math.prod(shape) * ITEMSIZE[dtype] != end - begin:
            raise CheckpointError(f"{where}: tensor {name!r}: {dtype} {list(shape)} needs "
                                  f"{math.prod(shape) * ITEMSIZE[dtype]} bytes, the header "
                                  f"gives {end - begin} (corrupt header)")
        if data_start + end > size:
            raise CheckpointError(f"{where}: tensor {name!r} ends at byte {data_start + end}, "
                                  f"the file has {size}: truncated?")
        tensors.append(TensorInfo(name, relpath, dtype, shape, end - begin, data_start + begin))
    return size, tensors


# ---------------------------------------------------------------------------------- dcp


def _import_torch() -> Any:
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

    def __init__(self, stream: Any, torch: Any) -> None:
        super().__init__(stream)
        self.torch = torch

    def find_class(self, module: str, name: str) -> Any:
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


def _scan_dcp(reader: _Reader) -> Catalogue:
    torch = _import_torch()
    where = reader.where(DCP_INDEX)
    stream = reader.stream(DCP_INDEX)
    try:
        with stream as opened:
            metadata = _MetadataUnpickler(opened, torch).load()
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
    for index, info in storage.items():
        relpath, offset, length = info.relative_path, int(info.offset), int(info.length)
        if not _inside(relpath):
            raise CheckpointError(f"{where}: names {relpath!r}, outside the checkpoint directory")
        if relpath not in sizes:
            try:
                sizes[relpath] = reader.size(relpath)
            except OSError as error:
                raise CheckpointError(f"{where}: names {relpath}, which cannot be read "
                                      f"({reader.where(relpath)}: "
                                      f"{error.strerror or error})") from None
        if offset < 0 or length < 0 or offset + length > sizes[relpath]:
            raise CheckpointError(f"{reader.where(relpath)}: {index.fqn} is saved at bytes "
                                  f"{offset}..{offset + length}, the file has {sizes[relpath]}:"
                                  " truncated?")
        name, dtype, shape = _dcp_item(index, state.get(index.fqn))
        tensors.append(TensorInfo(name, relpath, dtype, shape, length, offset))
    tensors = _unique_names(tensors)
    saved_by = {m.group(1) for relpath in sizes if (m := _SAVED_BY.match(relpath))}
    return _catalogue(reader.root, "dcp", list(sizes.items()), tensors, DCP_INDEX,
                      len(saved_by))


def _dcp_item(index: Any, meta: Any) -> tuple[str, str, tuple[int, ...]]:
    """(name, dtype, shape) of one saved item: a chunk of a tensor, or a pickled object."""
    chunks = getattr(meta, "chunks", None)
    if not chunks:   # BytesStorageMetadata, or metadata that does not describe the item
        return index.fqn, "", ()
    dtype = str(getattr(getattr(meta, "properties", None), "dtype", "")).removeprefix("torch.")
    dtype = _TORCH_DTYPES.get(dtype, dtype)
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


def _unique_names(tensors: list[TensorInfo]) -> list[TensorInfo]:
    counts = Counter(t.name for t in tensors)
    seen: Counter[str] = Counter()
    unique = []
    for tensor in sorted(tensors, key=lambda t: (t.relpath, t.file_offset)):
        if counts[tensor.name] > 1:
            seen[tensor.name] += 1
            tensor = TensorInfo(f"{tensor.name}#{seen[tensor.name] - 1}", tensor.relpath,
                                tensor.dtype, tensor.shape, tensor.nbytes, tensor.file_offset)
        unique.append(tensor)
    return unique


# --------------------------------------------------------------------------------- hdf5


def _hdf5_on_objects(where: str) -> UsageError:
    return UsageError(f"{where}: HDF5 checkpoints are read from POSIX paths only: h5py reads "
                      "a file through a POSIX path, not from an object store",
                      hint="copy the HDF5 files to a file system and point at them there")


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as error:
        raise CheckpointError(f"HDF5 checkpoints need h5py ({error})",
                              hint="pip install h5py (or stampede's `hdf5` extra)") from None
    return h5py


def _numpy_dtype_name(dtype: Any) -> str:
    """numpy dtype -> safetensors' name (F32, I64, BOOL, ...), else numpy's own string."""
    bits = dtype.itemsize * 8
    names = {"f": f"F{bits}", "i": f"I{bits}", "u": f"U{bits}", "c": f"C{bits}", "b": "BOOL"}
    name = names.get(dtype.kind, "")
    return name if name in ITEMSIZE else str(dtype.str)


def _scan_hdf5(reader: _Reader, relpaths: list[str]) -> Catalogue:
    root = reader.root
    if not reader.local:
        raise _hdf5_on_objects(reader.where(relpaths[0]))
    h5py = _h5py()
    files, tensors = [], []
    for relpath in relpaths:
        where = os.path.join(root, relpath)
        try:
            size = os.stat(where).st_size
            handle = open_hdf5(where)
        except OSError as error:
            raise CheckpointError(f"{where}: not a readable HDF5 file ({error})") from None
        with handle:
            found = _hdf5_datasets(h5py, handle, where, relpath, size)
        if not found:
            raise CheckpointError(f"{where}: an HDF5 file with no dataset")
        files.append((relpath, size))
        tensors.extend(found)
    return _catalogue(root, "hdf5", files, tensors, "", 0)


def _hdf5_datasets(h5py: Any, handle: Any, where: str, relpath: str,
                   size: int) -> list[TensorInfo]:
    datasets: list[Any] = []
    handle.visititems(lambda _name, item: datasets.append(item)
                      if isinstance(item, h5py.Dataset) else None)
    found = []
    for dataset in datasets:
        name = dataset.name.lstrip("/")
        plist = dataset.id.get_create_plist()
        layout = plist.get_layout()
        if layout != h5py.h5d.CONTIGUOUS or dataset.compression or plist.get_nfilters():
            kind = {h5py.h5d.CHUNKED: "chunked", h5py.h5d.COMPACT: "compact"}.get(layout, "")
            kind += f", {dataset.compression}-compressed" if dataset.compression else ""
            raise CheckpointError(f"{where}: dataset {name!r} is {kind or 'not contiguous'}: "
                                  "stampede reads contiguous, unfiltered datasets",
                                  hint="rewrite it contiguous (h5py: no chunks=, compression=,"
                                       " maxshape=) or point at another checkpoint")
        if plist.get_external_count():
            raise CheckpointError(f"{where}: dataset {name!r} keeps its data in external files:"
                                  " stampede reads data inside the HDF5 file")
        if dataset.dtype.kind == "O":
            raise CheckpointError(f"{where}: dataset {name!r} holds variable-length data "
                                  "(kept on the heap, not contiguous)")
        nbytes = int(dataset.size) * dataset.dtype.itemsize
        offset = dataset.id.get_offset()
        if nbytes and offset is None:
            raise CheckpointError(f"{where}: dataset {name!r} has no storage allocated (never "
                                  "written): its bytes are not in the file")
        offset = int(offset or 0)
        if nbytes and offset + nbytes > size:
            raise CheckpointError(f"{where}: dataset {name!r} ends at byte {offset + nbytes}, "
                                  f"the file has {size}: truncated?")
        found.append(TensorInfo(name, relpath, _numpy_dtype_name(dataset.dtype),
                                tuple(int(d) for d in dataset.shape), nbytes, offset))
    return found


def _catalogue(root: str, fmt: str, files: Iterable[tuple[str, int]],
               tensors: Iterable[TensorInfo], index: str, saving_ranks: int) -> Catalogue:
    return Catalogue(root=root, format=fmt, files=tuple(sorted(files)),
                     tensors=tuple(sorted(tensors, key=lambda t: (t.relpath, t.file_offset,
                                                                  t.name))),
                     index_file=index, saving_ranks=saving_ranks)


# ------------------------------------------------------------------------------- assign


def assign(catalogue: Catalogue, policy: str, nranks: int, rank: int) -> tuple[Extent, ...]:
    """This rank's reads of the checkpoint under a policy (see the module docstring), in
    file order. Safetensors and HDF5 extents are tensor-relative and name their tensor;
    DCP extents are raw file offsets. DCP's .metadata is not among them."""
    if policy not in POLICIES:
        raise UsageError(f"checkpoint policy {policy!r} is not one of {', '.join(POLICIES)}")
    if nranks < 1 or not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside 0..{nranks - 1}")
    raw = catalogue.format == "dcp"
    if policy == "tensor-slices":
        return tuple(extent for tensor in catalogue.tensors
                     if (extent := _slice(tensor, raw, nranks, rank)) is not None)
    if policy == "files":
        owners = balance(catalogue.files, nranks)
    else:
        owners = _saved_owners(catalogue, nranks)
    return tuple(_whole(tensor, raw) for tensor in catalogue.tensors
                 if tensor.nbytes and owners[tensor.relpath] == rank)


def balance(files: Iterable[tuple[str, int]], nranks: int) -> dict[str, int]:
    """relpath -> rank: largest file first to the least-loaded rank (ties: lower rank)."""
    loads = [(0, rank) for rank in range(nranks)]
    owners = {}
    for relpath, size in sorted(files, key=lambda item: (-item[1], item[0])):
        load, rank = heapq.heappop(loads)
        owners[relpath] = rank
        heapq.heappush(loads, (load + size, rank))
    return owners


def _saved_owners(catalogue: Catalogue, nranks: int) -> dict[str, int]:
    if catalogue.format != "dcp":
        raise UsageError(f"checkpoint policy 'saved' reads a PyTorch DCP checkpoint's files by "
                         f"the rank that saved them; {catalogue.root} is {catalogue.format}",
                         hint="use policy files or tensor-slices")
    owners = {}
    for relpath, _ in catalogue.files:
        match = _SAVED_BY.match(os.path.basename(relpath))
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


# ----------------------------------------------------------------------------- describe


def describe(catalogue: Catalogue) -> list[str]:
    """Human lines for `stampede plan`: format, files, tensors, bytes, index, savers."""
    from stampede.units import format_bytes

    kinds = {"safetensors": "safetensors", "dcp": "PyTorch DCP", "hdf5": "HDF5"}
    file_bytes = sum(size for _, size in catalogue.files)
    dtypes = Counter(t.dtype or "bytes" for t in catalogue.tensors)
    lines = [
        f"checkpoint: {catalogue.root} ({kinds.get(catalogue.format, catalogue.format)})",
        f"files: {len(catalogue.files)} data file(s), {file_bytes:,} bytes "
        f"({format_bytes(file_bytes)}): {_some([name for name, _ in catalogue.files], 3)}",
        f"{'saved items' if catalogue.format == 'dcp' else 'tensors'}: "
        f"{len(catalogue.tensors)} ("
        + ", ".join(f"{dtype} {count}" for dtype, count in dtypes.most_common()) + ")",
        f"bytes to restore: {catalogue.total_bytes:,} ({catalogue.total_bytes / 2**30:.3f} GiB)",
        f"index file: {catalogue.index_file or 'none'}"
        + (" (read whole by every rank first)" if catalogue.format == "dcp" else ""),
    ]
    if catalogue.format == "dcp":
        lines.append(f"saving ranks: {catalogue.saving_ranks}")
    return lines


# --------------------------------------------------------------------------------- plan

SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}


def plan_existing(catalogue: Catalogue, spec: JobSpec, policy: str, nranks: int,
                  rank: int) -> RankPlan:
    """The RankPlan of one rank restoring an existing checkpoint under a policy: its
    extents, the shared index every rank reads first (DCP's .metadata, a safetensors
    index), and header ops for safetensors and HDF5 files. With rank_shift, rank r reads
    what rank (r + shift) mod N would."""
    place = (rank + spec.rank_shift) % nranks
    extents = assign(catalogue, policy, nranks, place)
    # `hold` only sizes buffers for layouts that exchange, which existing checkpoints do
    # not; it names the rank's first file (or the index) and the bytes it restores.
    first = extents[0].relpath if extents else (catalogue.index_file or catalogue.files[0][0])
    hold = Extent(first, 0, max(sum(e.length for e in extents), 1))
    return RankPlan(rank=rank, nranks=nranks, layout=policy, ops=spec.ops, extents=extents,
                    block_bytes=spec.block_bytes, stat_count=spec.stat_count,
                    open_count=spec.open_count, hold=hold,
                    index_file=catalogue.index_file,
                    formatted=catalogue.format in ("safetensors", "hdf5"))


def index_parser(catalogue: Catalogue) -> Callable[[bytes | bytearray], object] | None:
    """How a loader parses the checkpoint's shared index, inside the timed `index` op:
    DCP's .metadata unpickled (with torch, imported here, before any timing), a
    safetensors index JSON-parsed. Raises ValueError on what it cannot parse."""
    if catalogue.format == "dcp":
        torch = _import_torch()

        def unpickle(data: bytes | bytearray) -> object:
            try:
                return _MetadataUnpickler(io.BytesIO(data), torch).load()
            except Exception as error:  # a corrupt pickle raises about anything
                raise ValueError(f"not readable PyTorch DCP metadata ({error})") from None
        return unpickle
    if catalogue.index_file:
        def parse_json(data: bytes | bytearray) -> object:
            try:
                return json.loads(data)
            except (ValueError, RecursionError) as error:
                raise ValueError(f"not a valid safetensors index ({error})") from None
        return parse_json
    return None


def finite_dtypes(catalogue: Catalogue) -> dict[str, str]:
    """tensor -> the float dtype run.check_finite checks it as (others are not checked)."""
    return {t.name: SAFETENSORS_DTYPES[t.dtype] for t in catalogue.tensors
            if t.dtype in SAFETENSORS_DTYPES}
