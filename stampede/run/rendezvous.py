"""The rendezvous of a torch.distributed process group over the MPI ranks, with no port race.

torch's `init_method="tcp://HOST:PORT"` needs the port before its store binds it. Choosing
one that is free now (bind port 0, read it, close) and handing the number over leaves a
window in which any other socket can take it: gloo's own connections bind ephemeral
ports, and so does a second job on the node. It happened (EADDRINUSE in CI). Here rank 0
makes the store itself on port 0: the kernel binds a free port and the store holds it from
that moment; its number goes to the other ranks over MPI, and they connect to it. Two jobs
on one node never meet. Used by run.exchange = "torch" and by the DCP loader.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from stampede import mpi
from stampede.errors import RunFailed


def _store(host: str, port: int, world_size: int, serve: bool, timeout_s: float) -> object:
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port, world_size, is_master=serve,
                             timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except RuntimeError as error:      # torch's DistNetworkError is a RuntimeError
        raise RunFailed(str(error)) from None


def store(world: mpi.Comm, host: str, timeout_s: float) -> object:
    """Collective: the process group's store, served by rank 0 at `host` on a port the
    kernel chose, and every other rank's connection to it. A failure on any rank raises on
    every rank (RunFailed), naming the rank."""
    rank, size = world.Get_rank(), world.Get_size()
    served: list[Any] = []

    def serve() -> None:
        served.append(_store(host, 0, size, True, timeout_s))

    mpi.collective(world, f"serving the process group's store on {host}",
                   serve if rank == 0 else lambda: None, alone=True)
    port: int = mpi.bcast(world, int(served[0].port) if served else 0)
    return mpi.collective(world, f"connecting to the process group's store at {host}:{port}",
                          (lambda: served[0]) if rank == 0 else
                          (lambda: _store(host, port, size, False, timeout_s)))
