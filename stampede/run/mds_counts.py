"""What a layout cost a CephFS metadata server: the MDS's own per-op request counts and
latencies (its `perf dump`: mds_server's req_<op>_latency, mds's requests and capability
messages), read by rank 0 before and after the layout ran, the deltas kept in the run
(the run's file_system, the sidecar's `mds_requests`, beside what
stampede.run.file_system reads from a POSIX target's mount). A backend that can ask its MDS
(`capabilities.mds_counters`, stampede.backends.base.MdsCounter) reads them over the wire,
as `ceph tell mds.* perf dump` does; untimed, so nothing is added to a timed op. The
counters are the server's: every client's requests while the layout ran, the warmup's too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from stampede.backends.base import mds_counter
from stampede.cephmds import KEY, Counters, deltas
from stampede.results.model import LayoutRun

__all__ = ["KEY", "deltas", "measured"]

if TYPE_CHECKING:
    from stampede.backends.base import Backend, MdsCounter
    from stampede.mpi import Comm

SCOPE = ("the MDS's own counters: every client's requests while the layout ran (its warmup "
         "included), not only this run's")
HOW = "perf dump over the wire (as `ceph tell mds.* perf dump`) by rank 0, before and after"


def measured(comm: Comm, backend: Backend,
             measure: Callable[[str], LayoutRun]) -> Callable[[str], LayoutRun]:
    """`measure` (a layout, on every rank) with the MDS's counters read around it on rank
    0, where the backend asks its MDS (else `measure` itself): the deltas in the run's
    `file_system` under KEY."""
    counter = mds_counter(backend)
    if counter is None or comm.Get_rank() != 0:
        return measure

    def around(layout: str) -> LayoutRun:
        start = _read(counter)
        run = measure(layout)
        end = _read(counter) if start is not None else None
        if start is None or end is None:   # the MDS did not answer: the layout uncounted
            return run
        return replace(run, file_system={**run.file_system,
                                         KEY: {"scope": SCOPE, "how": HOW, **deltas(start, end)}})
    return around


def _read(counter: MdsCounter) -> Counters | None:
    try:
        return counter.mds_perf()
    except (OSError, ValueError):
        return None
