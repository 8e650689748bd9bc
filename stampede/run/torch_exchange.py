"""run.exchange = "torch": the broadcast and striped layouts move the shard through
torch.distributed, as trainers move weights, instead of MPI.

Backend: nccl on device tensors when the ranks copy on to a GPU (run.h2d = cuda-*): each
storage reader's bytes go on to its GPU first (op h2d, or cuFile straight to HBM), then
GPU to GPU; gloo on the held host buffer otherwise (zero copy: torch.frombuffer), then
on to the device if any, exactly as the MPI exchange does.

Each iteration is a restart, so the process group is made again before every iteration,
on every rank, outside the restore (before the phase's start barrier; its stamps are
negative on the phase's axis):
  pg_init          the rendezvous (rank 0 serves the store at its host name on a port the
                   kernel chose, the others connect: stampede.run.rendezvous) +
                   init_process_group + new_group of this rank's exchange group. nccl
                   is given the rank's GPU (device_id), so torch creates the communicator
                   here, eagerly: NCCL's initialisation is the recovery model's T_sync.
  bcast_first /    the new group's first collective, at the shard's size: what a fresh
  allgather_first  communicator costs beyond the steady state (lazy connections, buffers).
The restore's exchange (ops bcast, allgather) is then the group's second collective: the
steady state, like the MPI exchange's communicator, made once per layout. An nccl
collective is timed until the GPU finished it (the stream synchronised).

Stripes of unequal length, or a group whose order by stripe is not its ranks' order
(torch orders a group by rank), are gathered as one broadcast per stripe: the same bytes
reach every member; the op is still allgather.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from stampede import mpi
from stampede.errors import RunFailed, UsageError, install_hint
from stampede.ops import OP_CODE
from stampede.run import rendezvous
from stampede.run.outcome import Log

if TYPE_CHECKING:
    from stampede.run.devices import Device

PG_INIT, FIRST = OP_CODE["pg_init"], {"bcast": OP_CODE["bcast_first"],
                                     "allgather": OP_CODE["allgather_first"]}


def backend_for(h2d: str) -> str:
    """nccl where the shard goes on to a GPU, gloo otherwise."""
    return "nccl" if h2d.startswith("cuda") else "gloo"


def require(backend: str) -> None:
    """torch.distributed with this backend can be used here (UsageError, exit 2)."""
    try:
        import torch.distributed as dist
    except ImportError:
        raise UsageError("run.exchange = \"torch\" needs PyTorch, which is not installed",
                         hint=f"{install_hint('gpu')} (or run.exchange = \"mpi\")") from None
    available = dist.is_available() and (dist.is_nccl_available() if backend == "nccl"
                                         else dist.is_gloo_available())
    if not available:
        raise UsageError(f"run.exchange = \"torch\": this PyTorch has no {backend} backend "
                         "(torch.distributed)", hint="install a torch build with it, or "
                                                     "run.exchange = \"mpi\"")


def one_rank_per_gpu(where: list[tuple[str, int]]) -> None:
    """nccl: no two ranks on one GPU of one host (NCCL refuses a communicator with a
    duplicate GPU, hours into a job or at its first collective): UsageError, exit 2."""
    seen: dict[tuple[str, int], int] = {}
    for rank, place in enumerate(where):
        if place in seen:
            raise UsageError(f"run.exchange = \"torch\" over nccl: ranks {seen[place]} and "
                             f"{rank} would share cuda:{place[1]} on {place[0]}, and NCCL "
                             "takes one rank per GPU",
                             hint="launch at most as many ranks per node as it has GPUs")
        seen[place] = rank


class TorchExchange:
    """One rank's torch.distributed exchange for one layout: its group's members (world
    ranks, in the order of the MPI group: member i holds stripe i), the tensor over the
    held shard, and the process group of the current iteration."""

    def __init__(self, world: mpi.Comm, members: list[int], backend: str, tensor: Any,
                 stripes: tuple[tuple[int, int], ...], device: Any, timeout_s: float) -> None:
        import torch.distributed as dist

        self.dist, self.world, self.members = dist, world, members
        self.backend, self.tensor, self.stripes = backend, tensor, stripes
        self.device, self.timeout_s = device, timeout_s
        self.group: object = None
        self.own = members.index(world.Get_rank())
        # In-place all_gather puts chunk j at j * length: member j must be the group's
        # rank j (torch sorts a group by rank) and the stripes of equal length.
        lengths = {length for _, length in stripes}
        self.in_place = members == sorted(members) and len(lengths) == 1 and all(
            offset == index * length for index, (offset, length) in enumerate(stripes))
        self.gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    @property
    def label(self) -> str:
        return f"torch.distributed {self.backend}"

    def renew(self, iteration: int, received_bytes: int, kind: str, log: Log) -> None:
        """Before a phase: the previous process group destroyed (untimed), a new one made
        (op pg_init) and its first collective run (op bcast_first or allgather_first);
        collectively, so that a rank's failure is every rank's (RunFailed)."""
        self.close()
        start = time.perf_counter_ns()
        host: str = mpi.bcast(self.world, socket.gethostname())
        store = rendezvous.store(self.world, host, self.timeout_s)
        stamps = mpi.collective(self.world, f"{self.label}: making the process group",
                                lambda: self._init(store, start))
        log.append((iteration, PG_INIT, *stamps, 0, 1))
        mpi.barrier(self.world)   # the members start their first collective together
        stamps = mpi.collective(self.world, f"{self.label}: the group's first {kind}",
                                lambda: self._timed(kind))
        log.append((iteration, FIRST[kind], *stamps, received_bytes, 1))

    def _init(self, store: object, start: int) -> tuple[int, int]:
        """The process group over the store (the rendezvous began at `start`) and this
        rank's exchange group: pg_init's stamps."""
        dist = self.dist
        options: dict[str, object] = {}
        if self.backend == "nccl":   # eager: the communicator is made here, not lazily
            options["device_id"] = self.device.device
        try:
            dist.init_process_group(self.backend, store=store,
                                    rank=self.world.Get_rank(), world_size=self.world.Get_size(),
                                    timeout=timedelta(seconds=self.timeout_s), **options)
            self.group = dist.new_group(self.members, use_local_synchronization=True)
        except (RuntimeError, ValueError) as error:   # torch's DistError is a RuntimeError
            raise RunFailed(f"init_process_group: {error}") from None
        return start, time.perf_counter_ns()

    def _timed(self, kind: str) -> tuple[int, int]:
        start = time.perf_counter_ns()
        try:
            self.exchange(kind)
        except RuntimeError as error:
            raise RunFailed(str(error)) from None
        return start, time.perf_counter_ns()

    def exchange(self, kind: str) -> None:
        """Move the shard: from member 0 (bcast), or every member's stripe (allgather);
        returns once this rank holds the bytes (nccl: the GPU finished)."""
        dist, group, tensor = self.dist, self.group, self.tensor
        if kind == "bcast":
            dist.broadcast(tensor, src=self.members[0], group=group)
        elif self.in_place:
            offset, length = self.stripes[self.own]
            self.gather(tensor, tensor[offset:offset + length], group=group)
        else:
            for member, (offset, length) in zip(self.members, self.stripes, strict=True):
                if length:
                    dist.broadcast(tensor[offset:offset + length], src=member, group=group)
        if self.backend == "nccl":
            self.device.torch.cuda.synchronize(self.device.device)

    def close(self) -> None:
        """Destroy this iteration's process group (every rank; untimed)."""
        self.group = None
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def open_exchange(world: mpi.Comm, group: mpi.Comm, backend: str, tensor: object,
                  stripes: tuple[tuple[int, int], ...], device: Device | None,
                  timeout_s: float) -> TorchExchange:
    """Collective over the world: the members of this rank's MPI exchange group, in its
    order, and the exchange over them."""
    members: list[int] = mpi.bcast(group, mpi.gather(group, world.Get_rank()) or [])
    return TorchExchange(world, members, backend, tensor, stripes, device, timeout_s)
