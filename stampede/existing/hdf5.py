"""HDF5 checkpoints: `*.h5` / `*.hdf5` files written by h5py or libhdf5. Every dataset, in
groups at any depth (named with '/'), must be contiguous and unfiltered: stampede reads a
dataset's bytes at its file offset, as a loader that maps or preads HDF5 data does. Read
from POSIX paths only: h5py opens a file by its path."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from stampede.checkpoint.formats import open_hdf5
from stampede.dtypes import from_numpy
from stampede.errors import CheckpointError, UsageError, install_hint
from stampede.existing.catalogue import Catalogue, Location, TensorInfo, make_catalogue

if TYPE_CHECKING:
    from types import ModuleType

SUFFIXES = (".h5", ".hdf5")


def hdf5_on_objects(where: str) -> UsageError:
    return UsageError(f"{where}: HDF5 checkpoints are read from POSIX paths only: h5py reads "
                      "a file through a POSIX path, not from an object store",
                      hint="copy the HDF5 files to a file system and point at them there")


def _h5py() -> ModuleType:
    try:
        import h5py
    except ImportError as error:
        raise CheckpointError(f"HDF5 checkpoints need h5py ({error})",
                              hint=install_hint("hdf5")) from None
    return h5py


def scan_hdf5(location: Location, relpaths: list[str]) -> Catalogue:
    if not location.local:
        raise hdf5_on_objects(location.where(relpaths[0]))
    h5py = _h5py()
    files, tensors = [], []
    for relpath in relpaths:
        where = location.backend.local_path(relpath)
        assert where is not None   # location.local: on a local mount
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
    return make_catalogue(location.root, "hdf5", files, tensors, "", 0)


def _hdf5_datasets(h5py: ModuleType, handle: Any, where: str, relpath: str,
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
        found.append(TensorInfo(name, relpath, from_numpy(dataset.dtype),
                                tuple(int(d) for d in dataset.shape), nbytes, offset))
    return found
