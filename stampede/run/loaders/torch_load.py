"""`torch.load` of torch.save zips (`*.bin`, `*.pt`), as transformers loads a
`pytorch_model.bin`: `torch.load(path, map_location=device, weights_only=True)` per file,
one call that reads, unpickles and rebuilds every storage (op load: its phases are not
exposed). It loads whole files: under tensor-slices a rank loads every file it holds a
slice of, and keeps all of it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from stampede.run.loaders.common import Plain, Record, flat_tensors, keeps_nothing, tensor_bytes
from stampede.run.loaders.work import RankWork

if TYPE_CHECKING:
    from stampede.mpi import Comm

State = Plain


def prepare(comm: Comm, work: RankWork, device: str) -> State:
    import torch  # noqa: F401 - imported before any timing

    return State(work, device)


def load(state: State, record: Record) -> dict[str, object]:
    import torch

    work = state.work
    start = time.perf_counter_ns()
    held: dict[str, object] = {}
    for relpath in work.files:
        loaded = torch.load(work.path(relpath), map_location=state.device, weights_only=True)
        held.update({f"{relpath}:{name}": tensor
                     for name, tensor in flat_tensors(loaded).items()})
    record("load", start, tensor_bytes(held.values()))
    return held


release = finish = keeps_nothing
