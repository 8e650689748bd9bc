"""One loader on every rank, every iteration: the timed side of `stampede loaders`.

Per iteration: the cache state (cold: each of the rank's files, and DCP's .metadata,
evicted with posix_fadvise DONTNEED, as stampede's restore evicts before its own
phases) -> polite barrier + Barrier -> origin stamp -> the loader's calls, its phases
stamped (stampede.run.loaders.<loader>) -> the restore stamp once `load` returned with
every tensor in memory (on a GPU: after a device synchronisation) -> untimed: the
digests of what the rank holds (iteration 0), the loader's buffers released, and an
allreduce of failures, so every rank stops at the same iteration. restore's bytes are
the rank's assigned bytes, the same bytes stampede's own restore reads: GB/s on both
sides are the same bytes over each side's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from stampede import mpi
from stampede.backends.posix import PosixBackend
from stampede.errors import RunFailed
from stampede.ops import OP_CODE
from stampede.results.amplification import rank_read_bytes
from stampede.results.samples import ITER
from stampede.results.summaries import LayoutStats
from stampede.run.gather import exact_stats
from stampede.run.loaders import LoaderEntry, loader_module
from stampede.run.loaders.common import Log, Record
from stampede.run.loaders.work import RankWork

if TYPE_CHECKING:
    from types import ModuleType

RESTORE = OP_CODE["restore"]
MAX_MESSAGES = 10


@dataclass(frozen=True)
class Target:
    """Where a loader puts the tensors: `device` as the loader takes it, `label` as the
    archive's device column says it (stampede.run.devices' label for a GPU)."""

    device: str
    label: str
    synchronize: Callable[[], None] | None = None   # a GPU's synchronisation, before each stamp


@dataclass(frozen=True)
class Measured:
    """One loader's run, on rank 0: the statistics, and what the ranks said."""

    stats: LayoutStats | None
    messages: tuple[str, ...]
    digests: tuple[dict[str, list[object]], ...]   # per rank, iteration 0: name -> [bytes, xxh3]
    failed: bool
    loaded_bytes: tuple[float, ...] = ()   # per rank: what its loader read per iteration
                                           # (median), for its read amplification


def measure(comm: mpi.Comm, entry: LoaderEntry, work: RankWork, target: Target, iterations: int,
            warmup: int, cold: bool, hosts: tuple[str, ...]) -> Measured | None:
    """The loader's iterations on every rank; the result on rank 0 (None elsewhere)."""
    module = loader_module(entry)
    state = mpi.collective(comm, f"{entry.name}: setting up",
                           partial(_prepare, module, comm, work, target.device))
    log: Log = []
    origins: dict[int, int] = {}
    messages: list[str] = []
    digests: dict[str, list[object]] = {}
    failed = False
    try:
        for iteration in range(-warmup, iterations):
            if cold:
                _evict(work, messages)
            mpi.barrier(comm)
            origins[iteration] = time.perf_counter_ns()
            held, ok = _iteration(module, state, work, target, iteration, origins, log,
                                  messages, entry.name)
            if iteration == 0 and ok:
                digests = _digests(held)
            del held
            module.release(state)
            total = mpi.allreduce_sum(comm, np.array([int(not ok)]))
            if total is None or int(total[0]):
                failed = True
                break
    finally:
        module.finish(state)
    rows = np.array(log, dtype=np.int64).reshape(-1, 6)
    rows = rows[rows[:, ITER] >= 0]
    stats = exact_stats(comm, entry.name, rows, {i: o for i, o in origins.items() if i >= 0},
                        hosts)
    all_messages = mpi.gather(comm, messages)
    all_digests = mpi.gather(comm, digests)
    loaded = mpi.gather(comm, rank_read_bytes(rows, "load"))
    if all_messages is None or all_digests is None or loaded is None:
        return None
    return Measured(stats, tuple(text for part in all_messages for text in part),
                    tuple(all_digests), failed, tuple(loaded))


def _prepare(module: ModuleType, comm: mpi.Comm, work: RankWork, device: str) -> object:
    try:
        return module.prepare(comm, work, device)
    except (RunFailed, OSError):
        raise
    except Exception as error:   # a loader's own errors: any type; said as one line
        raise RunFailed(f"{type(error).__name__}: {error}") from None


def _iteration(module: ModuleType, state: object, work: RankWork, target: Target, iteration: int,
               origins: dict[int, int], log: Log, messages: list[str],
               name: str) -> tuple[dict[str, object], bool]:
    """The timed load; its restore sample (ok = 0 and no bytes when the loader raised)."""
    try:
        held = module.load(state, Record(iteration, log, target.synchronize))
        if target.synchronize is not None:
            target.synchronize()
        ok = True
    except Exception as error:  # noqa: BLE001 - a loader raises what it raises
        held, ok = {}, False
        if len(messages) < MAX_MESSAGES:
            messages.append(f"rank {work.rank}: {name}: {type(error).__name__}: {error}")
    stop = time.perf_counter_ns()
    log.append((iteration, RESTORE, origins[iteration], stop,
                work.assigned_bytes if ok else 0, int(ok)))
    return held, ok


def _evict(work: RankWork, messages: list[str]) -> None:
    """Untimed: every file the rank's loader reads, whole, out of the page cache."""
    for relpath in (*work.files, *filter(None, (work.index_file,))):
        try:
            PosixBackend.evict(work.path(relpath), 0, 0)
        except OSError as error:
            if len(messages) < MAX_MESSAGES:
                messages.append(f"rank {work.rank}: evict {relpath}: {error.strerror}")


def _digests(held: dict[str, Any]) -> dict[str, list[object]]:
    """Untimed: name -> [bytes, xxh3-128 hex] of each tensor held (brought to the host)."""
    import torch
    import xxhash

    found = {}
    for name, tensor in held.items():
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        found[name] = [int(data.nbytes), xxhash.xxh3_128_hexdigest(data)]
    return found
