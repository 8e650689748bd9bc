"""safetensors' own loader, as transformers uses it: `safe_open(path, framework="pt",
device=...)` per file (the header read and parsed, the file mapped: op header, all the
rank's files first), then `get_tensor` per whole tensor or, for a tensor-parallel slice,
`get_slice(name)[rows]` of the rows that cover it (op load). To a device, load copies the
bytes there. On the host, safetensors returns large tensors over its mapping of the file
(zero-copy): their bytes are read when first touched, so every page the rank holds is
touched once (op touch: one byte per page, the read a mapped load defers) before the
restore ends; without it a cold load would "finish" before reading."""

from __future__ import annotations

import time
from contextlib import ExitStack
from math import prod
from typing import TYPE_CHECKING, Any

from stampede.dtypes import itemsize
from stampede.run.loaders.common import Plain, Record, cut, keeps_nothing, tensor_bytes, touch
from stampede.run.loaders.work import RankWork, Wanted

if TYPE_CHECKING:
    from stampede.mpi import Comm

State = Plain


def prepare(comm: Comm, work: RankWork, device: str) -> State:
    import safetensors  # noqa: F401 - imported before any timing

    return State(work, device)


def load(state: State, record: Record) -> dict[str, object]:
    from safetensors import safe_open

    work, clock = state.work, time.perf_counter_ns
    held: dict[str, object] = {}
    with ExitStack() as stack:
        start = clock()
        handles = {relpath: stack.enter_context(safe_open(work.path(relpath), framework="pt",
                                                          device=state.device))
                   for relpath in work.files}
        start = record("header", start)
        loaded = 0
        for piece in work.wanted:
            tensor, first_byte = _piece(handles[piece.relpath], piece)
            loaded += tensor_bytes((tensor,))
            held[piece.name] = cut(tensor, piece, first_byte)
        start = record("load", start, loaded)
        if state.device == "cpu":
            record("touch", start, touch(held.values()))
    return held


def _piece(handle: Any, piece: Wanted) -> tuple[object, int]:
    """(what was loaded, the tensor byte it starts at): the whole tensor, or the rows
    (along the first dimension, the elements of a vector) that cover a flat slice."""
    view = handle.get_slice(piece.name) if not piece.whole else None
    shape = view.get_shape() if view is not None else []
    if view is None or not shape:
        return handle.get_tensor(piece.name), 0
    row_bytes = prod(shape[1:]) * itemsize(view.get_dtype())
    first, last = piece.offset // row_bytes, -(-(piece.offset + piece.length) // row_bytes)
    return view[first:last], first * row_bytes


release = finish = keeps_nothing
