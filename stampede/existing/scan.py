"""Finding an existing checkpoint and its format: `scan(path)` -> Catalogue.

The path is a directory or one file on a file system, or a URL (an object store's
prefix, or one object). Its backend (stampede.backends) lists the root once; the format
is told by the names found at its top (DCP's .metadata, a safetensors index, safetensors
files, HDF5 files; torch.save zips and tensorizer files where none of those is there), and
that format's module reads the headers."""

from __future__ import annotations

import os
import stat as stat_module

from stampede.backends import open_backend
from stampede.checkpoint.manifest import MANIFEST_NAME
from stampede.errors import CheckpointError, UsageError
from stampede.existing.catalogue import Catalogue, Location
from stampede.existing.dcp import DCP_INDEX, metadata_parser, scan_dcp
from stampede.existing.hdf5 import SUFFIXES as HDF5_SUFFIXES
from stampede.existing.hdf5 import hdf5_on_objects, scan_hdf5
from stampede.existing.safetensors import INDEX_SUFFIX, scan_safetensors
from stampede.existing.torchfiles import (
    TENSORIZER_SUFFIX,
    TORCH_SUFFIXES,
    scan_tensorizer,
    scan_torch,
)
from stampede.targets import capabilities_for

SUPPORTED = ("safetensors (*.safetensors, sharded with *.safetensors.index.json), "
             "PyTorch DCP (.metadata + __R_K.distcp), HDF5 (*.h5, *.hdf5; contiguous datasets), "
             "torch.save zips (*.bin, *.pt, *.pth), tensorizer (*.tensors, whole files)")
# Weight files of formats stampede does not read: named when found, to say why not.
UNSUPPORTED = (".ckpt", ".gguf", ".npz", ".npy", ".msgpack", ".onnx", ".pkl", ".h5.gz",
               ".tflite", ".keras")


def scan(path: str, storage_options: dict[str, object] | None = None) -> Catalogue:
    """Catalogue the checkpoint at `path`, reading only headers. `storage_options`
    configure the backend of a URL (its endpoint, ...; credentials come from the
    environment).

    Raises CheckpointError when the path holds no checkpoint stampede can read (saying
    what was found and what is supported), when a header is corrupt or truncated, when a
    file an index names is missing, or when the path is a stampede-prepared target;
    UsageError for HDF5 on an object store (h5py reads through a POSIX path).
    """
    if not capabilities_for(path).local_files and path.rstrip("/").lower().endswith(HDF5_SUFFIXES):
        raise hdf5_on_objects(path.rstrip("/"))
    location, only = _locate(path, storage_options)
    _refuse_prepared(location, storage_options)
    if only:
        return _scan_file(location, only)
    top = location.top()
    if DCP_INDEX in top:
        return scan_dcp(location)
    indexes = [n for n in top if n.endswith(INDEX_SUFFIX) and location.has(n)]
    weights = [n for n in top if n.endswith(".safetensors") and location.has(n)]
    hdf5 = [n for n in top if n.lower().endswith(HDF5_SUFFIXES) and location.has(n)]
    torch_files = [n for n in top if n.lower().endswith(TORCH_SUFFIXES) and location.has(n)]
    tensorizer = [n for n in top if n.endswith(TENSORIZER_SUFFIX) and location.has(n)]
    root = location.root
    _one_format(root, {"safetensors": indexes + weights, "HDF5": hdf5,
                       # Hugging Face repositories ship their weights as pytorch_model*.bin
                       # beside the safetensors too: the same tensors, read as safetensors
                       "torch.save": [n for n in torch_files if not (
                           (indexes or weights) and n.startswith(HF_TORCH_PREFIX))],
                       "tensorizer": tensorizer})
    if len(indexes) > 1:
        raise CheckpointError(f"{root}: {len(indexes)} safetensors index files "
                              f"({', '.join(indexes)}): which is the checkpoint?",
                              hint="point at the index file to restore")
    if indexes:
        return scan_safetensors(location, indexes[0])
    if weights:
        return scan_safetensors(location, "", weights)
    if hdf5:
        return scan_hdf5(location, hdf5)
    if torch_files:
        return scan_torch(location, torch_files)
    if tensorizer:
        return scan_tensorizer(location, tensorizer)
    raise CheckpointError(_nothing_found(location), hint=f"stampede reads {SUPPORTED}")


HF_TORCH_PREFIX = "pytorch_model"


def _one_format(root: str, found: dict[str, list[str]]) -> None:
    """A directory of one checkpoint format: files of two (a.safetensors and b.pt) are
    refused, naming one of each (safetensors once won silently, the .pt half never read)."""
    kinds = [f"{kind} ({names[0]})" for kind, names in found.items() if names]
    if len(kinds) > 1:
        listed = " and ".join(kinds) if len(kinds) == 2 else \
            ", ".join(kinds[:-1]) + f" and {kinds[-1]}"
        raise CheckpointError(f"{root}: holds both {listed} files: which is the checkpoint?"
                              if len(kinds) == 2 else
                              f"{root}: holds {listed} files: which is the checkpoint?",
                              hint="point at the one file (or index) to restore")


def index_parser(catalogue: Catalogue) -> object:
    """How a loader parses the checkpoint's shared index, inside the timed `index` op:
    DCP's .metadata unpickled (torch imported now, before any timing), a safetensors
    index JSON-parsed; None without an index. The parser raises ValueError on what it
    cannot parse."""
    if catalogue.format == "dcp":
        return metadata_parser()
    if catalogue.index_file:
        import json

        def parse_json(data: bytes | bytearray) -> object:
            try:
                return json.loads(data)
            except (ValueError, RecursionError) as error:
                raise ValueError(f"not a valid safetensors index ({error})") from None
        return parse_json
    return None


def _locate(path: str, storage_options: dict[str, object] | None) -> tuple[Location, str]:
    """(the checkpoint's directory or prefix, "") or (the one file's parent, its name)."""
    if "://" not in path:
        path = os.path.abspath(os.fspath(path))
        try:
            mode = os.stat(path).st_mode
        except OSError as error:
            raise CheckpointError(f"{path}: {error.strerror or error}") from None
        if stat_module.S_ISDIR(mode):
            return _listed(path, storage_options), ""
        if not stat_module.S_ISREG(mode):
            raise CheckpointError(f"{path}: neither a directory nor a regular file",
                                  hint=f"point at a checkpoint: {SUPPORTED}")
        parent, name = os.path.split(path)
        return Location(open_backend(parent, storage_options), parent, None), name
    url = path.rstrip("/")
    location = _listed(url, storage_options)
    if location.names:
        return location, ""
    parent_url = _parent_url(url)
    if parent_url is not None:
        try:
            location.backend.size("")   # one HEAD: the URL names an object itself
        except FileNotFoundError:
            pass
        except OSError as error:
            raise CheckpointError(f"{url}: {error.strerror or error}") from None
        else:
            return Location(open_backend(parent_url, storage_options), parent_url, None), \
                url[len(parent_url) + 1:]
    raise CheckpointError(f"{url}: empty, no checkpoint here (no object has this name or "
                          "this prefix)", hint=f"stampede reads {SUPPORTED}")


def _listed(root: str, storage_options: dict[str, object] | None) -> Location:
    """The root with every file under it, listed once (one LIST per 1,000 names)."""
    backend = open_backend(root, storage_options)
    try:
        found = backend.names()
    except (FileNotFoundError, PermissionError):
        # PermissionError: no s3:ListBucket; a single object's URL is still HEAD-able
        found = []
    except OSError as error:
        raise CheckpointError(f"{root}: cannot list it ({error.strerror or error})") from None
    # fsspec's find of a file's own path returns that path: not a name under it
    return Location(backend, root, frozenset(name for name in found
                                             if name and name != backend.path("")))


def _parent_url(url: str) -> str | None:
    """scheme://a/b -> scheme://a; None at the top (a bucket: nothing above it)."""
    scheme, _, rest = url.partition("://")
    head, slash, _ = rest.rstrip("/").rpartition("/")
    return f"{scheme}://{head}" if slash and head.strip("/") else None


def _refuse_prepared(location: Location, storage_options: dict[str, object] | None) -> None:
    """A target stampede prepared (its manifest in the root or the root's parent) is not a
    checkpoint of another tool: restore it with a normal run of its job."""
    root = location.root
    parent = _parent_url(root) if "://" in root else os.path.dirname(root)
    for where in (root, parent):
        if where is None:
            continue
        try:
            backend = location.backend if where == root else open_backend(where, storage_options)
            backend.size(MANIFEST_NAME)
        except (FileNotFoundError, PermissionError):
            # S3 answers 403, not 404, for a missing key to a reader without s3:ListBucket:
            # read-only credentials must still scan
            continue
        except UsageError:
            # the parent is no target of its own (cephfs://mon, nfs://server: the file
            # system's root above a checkpoint in its top directory): nothing prepared there
            continue
        except OSError as error:
            raise CheckpointError(f"{where}/{MANIFEST_NAME}: {error.strerror or error}") from None
        raise CheckpointError(
            f"{where}: a target stampede prepared ({MANIFEST_NAME}), not a checkpoint of "
            "another tool", hint="restore it with a normal `stampede run` of its job")


def _scan_file(location: Location, name: str) -> Catalogue:
    """A single file: a safetensors or HDF5 file, an index, or a DCP .metadata."""
    if name == DCP_INDEX:
        return scan_dcp(location)
    if name.endswith(INDEX_SUFFIX):
        return scan_safetensors(location, name)
    if name.endswith(".safetensors"):
        return scan_safetensors(location, "", [name])
    if name.lower().endswith(HDF5_SUFFIXES):
        return scan_hdf5(location, [name])
    if name.lower().endswith(TORCH_SUFFIXES):
        return scan_torch(location, [name])
    if name.endswith(TENSORIZER_SUFFIX):
        return scan_tensorizer(location, [name])
    raise CheckpointError(f"{location.where(name)}: not a checkpoint file stampede reads",
                          hint=f"stampede reads {SUPPORTED}")


def _nothing_found(location: Location) -> str:
    root, names = location.root, location.top()
    if not names:
        return f"{root}: empty, no checkpoint here"
    unsupported = [n for n in names if n.lower().endswith(UNSUPPORTED)]
    if unsupported:
        return (f"{root}: no checkpoint stampede reads; found {_some(unsupported)} "
                "(a format stampede does not read)")
    dirs = [n for n in names if location.is_dir(n)]
    found = f"{len(names)} entr{'y' if len(names) == 1 else 'ies'}: {_some(names)}"
    if dirs and len(dirs) == len(names):
        found += " (directories only: point at the one that holds the weight files)"
    return f"{root}: no checkpoint stampede reads; found {found}"


def _some(names: list[str], count: int = 5) -> str:
    shown = ", ".join(names[:count])
    return shown + (f" and {len(names) - count} more" if len(names) > count else "")
