"""PyTorch Distributed Checkpoint: `torch.distributed.checkpoint.load(state_dict,
storage_reader=FileSystemReader(path), planner=DefaultLoadPlanner())` on every rank at
once, over a gloo process group of the MPI ranks, as a trainer restarts. The reader is
FileSystemReader itself, its two calls stamped: read_metadata (every rank unpickles
.metadata: op index), the planning collectives around it until read_data starts (op
plan), and read_data (each item read, torch.load-ed and copied into the state_dict's
tensor: op load). The restore ends when load returns, after its closing collective.

The state_dict is what a trainer holds before it loads: for each tensor the rank's
assignment touches, a tensor of the saved global shape and dtype on the device, allocated
and zeroed untimed. Plain tensors: DCP reads every saved chunk of each one (a rank that
is assigned one chunk of a tensor loads the whole tensor, as a trainer without DTensors
does). Non-tensor items (pickled Python values) are not asked for.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from stampede import mpi
from stampede.run import rendezvous
from stampede.run.loaders.common import Record, tensor_bytes
from stampede.run.loaders.work import RankWork

if TYPE_CHECKING:
    from types import ModuleType

PROCESS_GROUP_TIMEOUT_S = 600


@dataclass
class State:
    work: RankWork
    device: str
    state_dict: dict[str, Any]
    created_group: bool
    index_bytes: int


def prepare(comm: mpi.Comm, work: RankWork, device: str) -> State:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemReader

    created = _process_group(comm, dist)
    metadata = FileSystemReader(work.root).read_metadata()   # untimed: to build the model
    wanted = _fqns(work, metadata.storage_data)
    state_dict = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        if fqn in wanted and hasattr(meta, "size") and hasattr(meta, "properties"):
            state_dict[fqn] = torch.zeros(tuple(meta.size), dtype=meta.properties.dtype,
                                          device=device)
    return State(work, device, state_dict, created,
                 os.path.getsize(os.path.join(work.root, work.index_file or ".metadata")))


def _process_group(comm: mpi.Comm, dist: ModuleType) -> bool:
    """The MPI ranks as a gloo group (its store served by rank 0 at its address on a port
    the kernel chose: stampede.run.rendezvous): False when one is already there."""
    if dist.is_initialized():
        return False
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    address = ""
    if comm.Get_rank() == 0:
        address = "127.0.0.1" if len(set(hosts or ())) == 1 else \
            socket.gethostbyname(socket.getfqdn())
    address = mpi.bcast(comm, address)
    if address == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = rendezvous.store(comm, address, PROCESS_GROUP_TIMEOUT_S)
    dist.init_process_group("gloo", store=store, rank=comm.Get_rank(), world_size=comm.Get_size(),
                            timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
    return True


def _fqns(work: RankWork, storage_data: dict[Any, Any]) -> set[str]:
    """The tensors whose saved items overlap a byte range this rank is assigned."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for piece in work.wanted:
        ranges.setdefault(piece.relpath, []).append((piece.offset, piece.offset + piece.length))
    found = set()
    for index, info in storage_data.items():
        begin, end = int(info.offset), int(info.offset) + int(info.length)
        if any(start < end and begin < stop
               for start, stop in ranges.get(info.relative_path, ())):
            found.add(index.fqn)
    return found


def _timed_reader(root: str, record: Record, index_bytes: int, load_bytes: int) -> object:
    """FileSystemReader, its metadata read and its data read stamped (nothing changed)."""
    from torch.distributed.checkpoint import FileSystemReader

    class TimedReader(FileSystemReader):
        planned_from = 0

        def read_metadata(self, *args: object, **kwargs: object) -> Any:
            start = time.perf_counter_ns()
            metadata = super().read_metadata(*args, **kwargs)
            TimedReader.planned_from = record("index", start, index_bytes)
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            start = record("plan", TimedReader.planned_from)
            done = super().read_data(plan, planner)
            done.wait()
            record("load", start, load_bytes)
            return done

    return TimedReader(root)


def load(state: State, record: Record) -> dict[str, object]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    reader = _timed_reader(state.work.root, record, state.index_bytes,
                           tensor_bytes(state.state_dict.values()))
    dcp.load(state.state_dict, storage_reader=reader, planner=DefaultLoadPlanner())
    return dict(state.state_dict)


def release(state: State) -> None:
    return None


def finish(state: State) -> None:
    if state.created_group:
        import torch.distributed as dist
        dist.destroy_process_group()
