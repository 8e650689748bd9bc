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
from stampede.results.model import LayoutRun

if TYPE_CHECKING:
    from stampede.backends.base import Backend, MdsCounter
    from stampede.mpi import Comm

SCOPE = ("the MDS's own counters: every client's requests while the layout ran (its warmup "
         "included), not only this run's")
HOW = "perf dump over the wire (as `ceph tell mds.* perf dump`) by rank 0, before and after"
# the mds section's totals kept beside the per-op requests: a shared-file storm shows in
# the capabilities the MDS had to revoke from one client to grant another
TOTALS = {"request": "requests", "reply": "replies", "ceph_cap_op_revoke": "caps_revoked",
          "ceph_cap_op_grant": "caps_granted", "handle_client_caps": "cap_messages"}
Counters = dict[str, object]
KEY = "mds_requests"   # the sidecar's key, in each layout (beside stampede.run.file_system's)


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


def deltas(start: Counters, end: Counters) -> dict[str, object]:
    """Pure: per op the requests the MDS handled between two perf dumps and their mean
    latency (ms), busiest first; the mds section's TOTALS moved."""
    restarted = _count(_section(end, "mds"), "request") < _count(_section(start, "mds"), "request")
    if restarted:   # a new MDS process: its counters began at zero after `start`
        start = {}
    first, last = _section(start, "mds_server"), _section(end, "mds_server")
    ops: dict[str, dict[str, float]] = {}
    for key, now in last.items():
        if not (key.startswith("req_") and key.endswith("_latency") and isinstance(now, dict)):
            continue
        then = first.get(key)
        then = then if isinstance(then, dict) else {}
        count = int(now.get("avgcount", 0)) - int(then.get("avgcount", 0))
        if count > 0:
            seconds = float(now.get("sum", 0.0)) - float(then.get("sum", 0.0))
            ops[key[len("req_"):-len("_latency")]] = {
                "requests": count, "mean_ms": round(seconds / count * 1e3, 6)}
    before_mds, after_mds = _section(start, "mds"), _section(end, "mds")
    totals = {name: _count(after_mds, key) - _count(before_mds, key)
              for key, name in TOTALS.items()}
    return {"ops": dict(sorted(ops.items(), key=lambda item: -item[1]["requests"])), **totals,
            **({"restarted": "the MDS restarted during the layout: counts since its restart"}
               if restarted else {})}


def _section(dump: Counters, name: str) -> dict[str, object]:
    found = dump.get(name)
    return found if isinstance(found, dict) else {}


def _count(section: dict[str, object], key: str) -> int:
    value = section.get(key, 0)
    return value if isinstance(value, int) else 0
