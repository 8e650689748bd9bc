"""What a scan of an existing checkpoint returns (`Catalogue`, `TensorInfo`), and the
reads a scan makes, through the backend contract (stampede.backends.base): read-only,
untimed, each failure a CheckpointError naming the file."""

from __future__ import annotations

import heapq
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stampede.checkpoint.formats import read_fully
from stampede.dtypes import itemsize
from stampede.errors import CheckpointError

if TYPE_CHECKING:
    from stampede.backends.base import Backend

FOUND_FORMATS = ("safetensors", "dcp", "hdf5", "torch", "tensorizer")
# Formats whose items are byte ranges in their own serialisation (DCP items, torch.save
# storages, whole tensorizer files): read whole or in byte slices, never as tensors.
RAW_FORMATS = ("dcp", "torch", "tensorizer")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors or HDF5 file, or one saved item of a DCP checkpoint (a
    torch.save storage record, a whole tensorizer file)."""

    name: str                 # HDF5: the dataset's path ('/'-separated); DCP: fqn[#chunk];
                              # torch: data/<storage key>; tensorizer: the file's relpath
    relpath: str              # the data file, relative to Catalogue.root
    dtype: str                # safetensors' names (F32, BF16, I64, ...); "" if unknown
    shape: tuple[int, ...]
    nbytes: int
    file_offset: int          # where its first byte is in the file (from the header)
    # DCP: the item as a piece of its tensor, for a restore that reshards by rows (policy
    # reshard, stampede.existing.reshard): the whole tensor's fqn and rows (dim 0; 0: not
    # cut by rows, a scalar or a pickled object), the item's first row there, and where
    # its elements start in the file (inside its torch.save record; -1: not known, so
    # the item is only ever read whole)
    fqn: str = ""
    rows_total: int = 0
    row0: int = 0
    data_offset: int = -1

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
    format: str               # one of FOUND_FORMATS
    files: tuple[tuple[str, int], ...]     # (relpath, bytes) of every data file, sorted
    tensors: tuple[TensorInfo, ...]        # sorted by (relpath, file_offset)
    index_file: str           # "" | the *.safetensors.index.json | ".metadata"
    saving_ranks: int         # dcp: distinct __R_ prefixes of the data files; else 0

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor (DCP: every saved item): what a whole restore reads."""
        return sum(tensor.nbytes for tensor in self.tensors)


@dataclass(frozen=True)
class Location:
    """Where a scan reads: the backend of the checkpoint's root and the files under it."""

    backend: Backend
    root: str                         # as shown in messages: a path or a URL
    # every file under the root, relative, listed once recursively; None when the root is
    # only the parent of one file (listing it could walk a whole home directory)
    names: frozenset[str] | None

    def where(self, relpath: str) -> str:
        return f"{self.root}/{relpath}" if "://" in self.root else os.path.join(self.root, relpath)

    @property
    def local(self) -> bool:
        """Whether its files have POSIX paths (h5py opens a file by its path)."""
        return self.backend.local_path("") is not None

    def top(self) -> list[str]:
        """The entries at the top of the root (files and directories), sorted."""
        return sorted({name.partition("/")[0] for name in self.names or ()})

    def is_dir(self, name: str) -> bool:
        return any(listed.startswith(f"{name}/") for listed in self.names or ())

    def has(self, relpath: str) -> bool:
        """Whether the file exists: in the listing, or (unlisted) by asking its size."""
        if self.names is not None:
            return relpath in self.names
        try:
            self.size(relpath)
        except FileNotFoundError:
            return False
        except OSError as error:
            raise CheckpointError(f"{self.where(relpath)}: {error.strerror or error}") from None
        return True

    def size(self, relpath: str) -> int:
        """A file's size; OSError when it cannot be had (the caller words it)."""
        return int(self.backend.size(relpath))

    def read(self, relpath: str, offset: int = 0, length: int | None = None,
             whole_at_most: int = 0) -> bytes:
        """`length` bytes of a file at `offset` (fewer only at its end; None: to the end,
        refused past `whole_at_most` bytes when given), symbolic links followed (a loader's
        cache links its files): one open, then reads."""
        with self.opened(relpath) as (read, size):
            if length is None:
                length = max(size() - offset, 0)
                if whole_at_most and length > whole_at_most:
                    raise CheckpointError(f"{self.where(relpath)}: {length} bytes is not "
                                          "plausible for this file (corrupt?)")
            return read(offset, length)

    @contextmanager
    def opened(self, relpath: str) -> Iterator[tuple[Callable[[int, int], bytes],
                                                     Callable[[], int]]]:
        """One open of a file for many ranged reads: (read(offset, length), size()). On an
        object store the open is the file's one HEAD, not one per read (a DCP scan reads
        each item's zip directory and local header: a few reads per item)."""
        backend, where = self.backend, self.where(relpath)
        try:
            handle = backend.opener(False)(backend.path(relpath))
        except OSError as error:
            raise CheckpointError(f"{where}: {error.strerror or error}") from None

        def read(offset: int, length: int) -> bytes:
            data = bytearray(length)
            try:
                with memoryview(data) as view:
                    done = read_fully(backend, handle, view, offset)
            except OSError as error:
                raise CheckpointError(f"{where}: {error.strerror or error}") from None
            return bytes(data[:done])

        def size() -> int:
            try:
                return int(backend.handle_size(handle))
            except OSError as error:
                raise CheckpointError(f"{where}: {error.strerror or error}") from None

        try:
            yield read, size
        finally:
            try:
                backend.close(handle)
            except OSError as error:
                raise CheckpointError(f"{where}: {error.strerror or error}") from None


def balance(items: Iterable[tuple[str, int]], nranks: int) -> dict[str, int]:
    """name -> rank: the largest item (a file, a tensor) first to the least-loaded rank
    (ties: the lower rank), as per-file loaders and PyTorch's cooperative load spread
    their reads."""
    loads = [(0, rank) for rank in range(nranks)]
    owners = {}
    for name, size in sorted(items, key=lambda item: (-item[1], item[0])):
        load, rank = heapq.heappop(loads)
        owners[name] = rank
        heapq.heappush(loads, (load + size, rank))
    return owners


def inside(relpath: str) -> bool:
    """A path an index may name: relative, and never out of the checkpoint's directory."""
    parts = relpath.replace("\\", "/").split("/")
    return bool(relpath) and not os.path.isabs(relpath) and ".." not in parts


def make_catalogue(root: str, fmt: str, files: Iterable[tuple[str, int]],
                   tensors: Iterable[TensorInfo], index: str, saving_ranks: int) -> Catalogue:
    return Catalogue(root=root, format=fmt, files=tuple(sorted(files)),
                     tensors=tuple(sorted(tensors, key=lambda t: (t.relpath, t.file_offset,
                                                                  t.name))),
                     index_file=index, saving_ranks=saving_ranks)


def unique_names(tensors: list[TensorInfo]) -> list[TensorInfo]:
    """Names made unique with a #k suffix, in file order (DCP can save a name twice)."""
    counts = Counter(t.name for t in tensors)
    seen: Counter[str] = Counter()
    unique = []
    for tensor in sorted(tensors, key=lambda t: (t.relpath, t.file_offset)):
        if counts[tensor.name] > 1:
            seen[tensor.name] += 1
            tensor = replace(tensor, name=f"{tensor.name}#{seen[tensor.name] - 1}")
        unique.append(tensor)
    return unique
