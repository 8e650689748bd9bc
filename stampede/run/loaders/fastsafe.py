"""fastsafetensors (IBM): `SafeTensorsFileLoader` in one rank's group (`SingleGroup`:
every MPI rank loads its own files), `add_filenames` (the headers: op header),
`copy_files_to_device` (the files' tensor bytes read into one buffer on the device by its
own threads: op load), then `get_tensor` per tensor (tensors made over that buffer: op
deserialise). On a CPU it reads with pread into host memory (nogds); on a GPU it uses
GPUDirect Storage where cuFile is there, else its bounce-buffer copier. It loads whole
files: a tensor-parallel rank loads every file it holds a slice of, keeps the slices."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stampede.run.loaders.common import Record, cut
from stampede.run.loaders.work import RankWork

if TYPE_CHECKING:
    from stampede.mpi import Comm


@dataclass
class State:
    work: RankWork
    device: str
    file_bytes: int         # what copy_files_to_device reads: the files, whole
    buffers: list[Any]      # the last load's, released (untimed) by release


def prepare(comm: Comm, work: RankWork, device: str) -> State:
    import os

    import fastsafetensors  # noqa: F401 - imported before any timing

    return State(work, device, sum(os.path.getsize(work.path(relpath)) for relpath in work.files),
                 [])


def load(state: State, record: Record) -> dict[str, object]:
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    work = state.work
    held: dict[str, object] = {}
    if not work.files:
        return held
    start = time.perf_counter_ns()
    loader = SafeTensorsFileLoader(SingleGroup(), state.device, nogds=state.device == "cpu")
    loader.add_filenames({0: [work.path(relpath) for relpath in work.files]})
    start = record("header", start)
    files = loader.copy_files_to_device()
    state.buffers += [files, loader]   # its tensors live in this buffer
    start = record("load", start, state.file_bytes)
    for piece in work.wanted:
        held[piece.name] = cut(files.get_tensor(piece.name), piece)
    record("deserialise", start)
    return held


def release(state: State) -> None:
    """Untimed, after each load: its buffers (the held tensors are dropped by then)."""
    for owner in state.buffers:
        owner.close()
    state.buffers.clear()


def finish(state: State) -> None:
    release(state)
