"""The Run:ai Model Streamer (`runai-model-streamer`), as vLLM's runai loader drives it:
one `SafetensorsStreamer` session, `stream_files(paths, tensor_names=..., device=...)`
(the headers read and the reads submitted to its C++ threads: op header), then every
tensor taken from `get_tensors()` as its chunk arrives (op load). It streams whole
tensors: a tensor-parallel rank streams each tensor it holds a slice of, then keeps the
slice. Its concurrency and memory limit are its defaults (RUNAI_STREAMER_* variables)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stampede.run.loaders.common import Record, cut, keeps_nothing, tensor_bytes
from stampede.run.loaders.work import RankWork, Wanted

if TYPE_CHECKING:
    from stampede.mpi import Comm


@dataclass(frozen=True)
class State:
    work: RankWork
    device: str
    pieces: dict[str, Wanted]


def prepare(comm: Comm, work: RankWork, device: str) -> State:
    import runai_model_streamer  # noqa: F401 - imported before any timing

    return State(work, device, {piece.name: piece for piece in work.wanted})


def load(state: State, record: Record) -> dict[str, object]:
    from runai_model_streamer import SafetensorsStreamer

    work = state.work
    held: dict[str, object] = {}
    if not work.files:
        return held
    start = time.perf_counter_ns()
    with SafetensorsStreamer() as streamer:
        streamer.stream_files([work.path(relpath) for relpath in work.files],
                              device=state.device, tensor_names=list(state.pieces))
        start = record("header", start)
        loaded = 0
        for name, tensor in streamer.get_tensors():
            loaded += tensor_bytes((tensor,))
            held[name] = cut(tensor, state.pieces[name])
        record("load", start, loaded)
    return held


release = finish = keeps_nothing
