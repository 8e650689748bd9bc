"""safetensors checkpoints: one `*.safetensors` file, or the shards a
`*.safetensors.index.json` (Hugging Face's `weight_map`) names. Each file's header is read
and checked by the one safetensors reader and parser (stampede.checkpoint.formats), the
same code the timed `header` op runs."""

from __future__ import annotations

import json
from collections.abc import Iterable

from stampede.checkpoint.formats import (
    MAX_HEADER_BYTES,
    HeaderError,
    parse_safetensors,
    read_safetensors_header,
)
from stampede.errors import CheckpointError
from stampede.existing.catalogue import Catalogue, Location, TensorInfo, inside, make_catalogue

INDEX_SUFFIX = ".safetensors.index.json"


def scan_safetensors(location: Location, index: str, relpaths: Iterable[str] = ()) -> Catalogue:
    """The files named (no index), or those the index names: loaders read only those."""
    weight_map = _weight_map(location, index) if index else {}
    files, tensors = [], []
    for relpath in sorted(set(weight_map.values())) if index else relpaths:
        size, found = _header(location, relpath)
        files.append((relpath, size))
        tensors.extend(found)
    held = {(t.name, t.relpath) for t in tensors}
    for name, relpath in sorted(weight_map.items()):
        if (name, relpath) not in held:   # loaders look tensors up where the index says
            raise CheckpointError(f"{location.where(index)}: names tensor {name!r} in "
                                  f"{relpath}, whose header does not hold it")
    return make_catalogue(location.root, "safetensors", files, tensors, index, 0)


def _weight_map(location: Location, index: str) -> dict[str, str]:
    """tensor -> shard, from a Hugging Face index; every shard it names must exist."""
    where = location.where(index)
    text = location.read(index, whole_at_most=MAX_HEADER_BYTES)
    try:
        weight_map = json.loads(text)["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a non-empty map of tensor -> file")
    except (ValueError, TypeError, KeyError, RecursionError) as error:
        raise CheckpointError(f"{where}: not a safetensors index ({error!s})") from None
    for relpath in sorted(set(weight_map.values())):
        if not inside(relpath):
            raise CheckpointError(f"{where}: names {relpath!r}, outside the checkpoint directory")
        if not location.has(relpath):
            raise CheckpointError(f"{where}: names {relpath}, which is missing "
                                  f"({location.where(relpath)}: No such file)",
                                  hint="a sharded checkpoint restores only with every shard")
    return weight_map


def _header(location: Location, relpath: str) -> tuple[int, list[TensorInfo]]:
    """(file size, tensors) from one file's header."""
    backend, where = location.backend, location.where(relpath)
    try:
        handle = backend.opener(False)(backend.path(relpath))
        size = backend.handle_size(handle)
    except OSError as error:
        raise CheckpointError(f"{where}: {error.strerror or error}") from None
    try:
        entries = read_safetensors_header(
            backend, handle, None, lambda text, start: parse_safetensors(text, start, size))
    except HeaderError as error:
        raise CheckpointError(f"{where}: {error}") from None
    except OSError as error:
        raise CheckpointError(f"{where}: {error.strerror or error}") from None
    finally:
        backend.close(handle)
    return size, [TensorInfo(name, relpath, dtype, shape, nbytes, offset)
                  for name, (dtype, shape, offset, nbytes) in entries.items()]
