"""CoreWeave tensorizer: `TensorDeserializer(path, device=...)` per file, its default
eager load (headers, then every tensor read and made, with its own reader threads; op
load: the phases are inside the constructor). Files are whole: under tensor-slices a
rank loads every file it holds a byte slice of."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from stampede.run.loaders.common import Plain, Record, keeps_nothing, tensor_bytes
from stampede.run.loaders.work import RankWork

if TYPE_CHECKING:
    from stampede.mpi import Comm

State = Plain


def prepare(comm: Comm, work: RankWork, device: str) -> State:
    import tensorizer  # noqa: F401 - imported before any timing

    return State(work, device)


def load(state: State, record: Record) -> dict[str, object]:
    from tensorizer import TensorDeserializer

    work = state.work
    start = time.perf_counter_ns()
    held: dict[str, object] = {}
    for relpath in work.files:
        deserializer = TensorDeserializer(work.path(relpath), device=state.device)
        held.update({f"{relpath}:{name}": tensor for name, tensor in deserializer.items()})
        deserializer.close()
    record("load", start, tensor_bytes(held.values()))
    return held


release = finish = keeps_nothing
