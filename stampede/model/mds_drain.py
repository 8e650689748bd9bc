"""`stampede project` on a CephFS target: the metadata server fitted from its own counters,
not inferred from stampede's latencies.

Each run at N ranks kept, per layout, what the MDS itself counted while the layout ran
(its `perf dump`: requests per op and their mean latency; stampede.run.mds_counts, the
sidecar's `mds_requests`). From the runs at several rank counts:

  requests per op     R_op(N) = a_op N + b_op x clients'  (fitted, least squares, a_op >= 0)
                      a_op: the requests each rank adds; b_op: those that do not grow with
                      the ranks (rank 0's own, e.g. a save's directories made by the root;
                      with ranks sharing a node's mount, the node's client: b_op x nodes)
  service per op      s_op = the MDS's own mean latency of the op (receipt to reply), the
                      least over the runs: a request's latency is its service plus what it
                      waited for inside the MDS (its queue, a capability recalled from
                      another client), and waiting only adds, so the least mean is the
                      closest to the service; the largest is the band's other end
  drain at N          T_MDS(N) = sum_op R_op(N) s_op    (a drain rate of 1 / s_op per op)

One active MDS rank serves its requests one at a time (Ceph's MDS dispatches client
requests under one lock), so the requests of the burst drain in series: the sum, not the
sum over threads. Several active MDS ranks split directory subtrees (a sharded checkpoint's
directories could spread over them), never one file's inode.

What one restore or save is in the counts: a client holding a file's capabilities asks the
MDS once, so a restore's requests are its clients' first pass (measured on the test
cluster: 2 ranks, shared, 6 lookups whether the layout ran 1, 4 or 6 passes): the layout's
whole count is one restore of fresh clients. Each save writes a new version (new
directories and files, the older released), so its count is divided by the passes (warmup
and iterations: 60 mkdirs in 4 saves, 18 in 1). The counts are every client's: another job
on the cluster while a layout ran is in them.

Pure: records in (MdsCount, from a sidecar entry with `counted`), numbers out; `counts_of`
picks them from an Archive's sidecars (it reads no file itself)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stampede.cephmds import KEY
from stampede.errors import UsageError
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from stampede.model.projection import Projection
    from stampede.model.series import Series
    from stampede.results.archived import Archive

# the sidecar's part holding a phase's layouts (stampede.results.rows.sidecar)
PART = {"restore": "layouts", "save": "saves"}
# True: a layout's whole count is one restore's (a client asks once, then holds the caps);
# False: divided by its passes (each pass saves a new version)
ONCE_PER_LAYOUT = {"restore": True, "save": False}


@dataclass(frozen=True)
class OpCount:
    """What the MDS counted of one op while a layout ran."""

    requests: int
    mean_s: float     # its own mean latency of the op (receipt to reply)

    def __post_init__(self) -> None:
        if self.requests < 0 or not (math.isfinite(self.mean_s) and self.mean_s >= 0):
            raise ValueError(f"an MDS count of {self.requests} requests of mean "
                             f"{self.mean_s} s cannot be")


@dataclass(frozen=True)
class MdsCount:
    """One run's MDS counts of one layout: its geometry, the passes the counts span
    (warmup + iterations), its requests per op, the capabilities it revoked."""

    nranks: int
    nnodes: int
    passes: int
    ops: Mapping[str, OpCount]
    caps_revoked: int = 0
    run_id: str = ""

    def __post_init__(self) -> None:
        if self.nranks < 1 or self.nnodes < 1 or self.passes < 1:
            raise ValueError(f"an MDS count at {self.nranks} ranks on {self.nnodes} nodes over "
                             f"{self.passes} passes cannot be")


def counted(entry: object, nranks: int, nnodes: int, passes: int, run_id: str = ""
            ) -> MdsCount | None:
    """A sidecar layout's `mds_requests` as a record; None where it holds none (a string:
    why the MDS was not counted; absent: not a CephFS target)."""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("ops"), Mapping):
        return None
    ops = {str(op): OpCount(int(moved["requests"]), float(moved["mean_ms"]) / 1e3)
           for op, moved in entry["ops"].items()
           if isinstance(moved, Mapping) and int(moved.get("requests", 0)) > 0}
    revoked = entry.get("caps_revoked", 0)
    return MdsCount(nranks, max(nnodes, 1), max(passes, 1), ops,
                    revoked if isinstance(revoked, int) else 0, run_id)


@dataclass(frozen=True)
class Growth:
    """A count fitted over the runs: R(N) = per_rank N + fixed x clients', with what each
    run measured (per restore or per save)."""

    per_rank: float
    fixed: float                                 # per job, or per node (per_node)
    measured: tuple[tuple[int, float], ...]      # (nranks, count per restore or save)
    per_node: bool = False                       # the ranks of a node share one client

    def at(self, nranks: int, nodes: int = 1) -> float:
        return max(0.0, self.per_rank * nranks + self.fixed * (nodes if self.per_node else 1))


@dataclass(frozen=True)
class OpDrain:
    """One op at the target: its requests, the MDS's time for each, their drain."""

    op: str
    growth: Growth
    requests: float                  # at the target
    service_s: float                 # the MDS's least mean of the op over the runs
    service_range_s: tuple[float, float]   # its least and largest mean over the runs
    service_at: int                  # the rank count service_s comes from

    @property
    def drain_s(self) -> float:
        return self.requests * self.service_s

    @property
    def rate_per_s(self) -> float:
        """The MDS's drain rate of this op: 1 / s_op."""
        return 1.0 / self.service_s if self.service_s > 0 else math.inf


@dataclass(frozen=True)
class MdsDrain:
    """A layout's MDS at the target, from the MDS's own counters."""

    layout: str
    phase: str
    nranks: int
    nodes: int
    client_per_rank: bool            # each rank its own client (cephfs://), else a node's mount
    ops: tuple[OpDrain, ...]         # busiest first (requests at the target)
    caps_revoked: Growth
    counts: tuple[MdsCount, ...]     # the runs, by rank count

    @property
    def requests(self) -> float:
        return sum(op.requests for op in self.ops)

    @property
    def drain_s(self) -> float:
        return sum(op.drain_s for op in self.ops)

    @property
    def band_s(self) -> tuple[float, float]:
        """The drain with each op's least and largest measured mean."""
        return (sum(op.requests * op.service_range_s[0] for op in self.ops),
                sum(op.requests * op.service_range_s[1] for op in self.ops))

    @property
    def rate_per_s(self) -> float:
        """Requests per second the one MDS drains, all ops together."""
        return self.requests / self.drain_s if self.drain_s > 0 else math.inf


def per_pass(count: MdsCount, requests: float, phase: str) -> float:
    """A layout's count as one restore's or one save's (ONCE_PER_LAYOUT)."""
    return requests if ONCE_PER_LAYOUT.get(phase, False) else requests / count.passes


def fit_growth(points: Sequence[tuple[int, int, float]], client_per_rank: bool) -> Growth:
    """R = a N + b y over (nranks, nnodes, R) points, least squares, a >= 0; y = 1 where
    each rank is its own client (b: per job), else the nodes (b: each node's client). One
    rank count (or N proportional to y) tells nothing apart: all of it per rank."""
    xs = [float(n) for n, _, _ in points]
    ys = [1.0 if client_per_rank else float(nodes) for _, nodes, _ in points]
    rs = [r for _, _, r in points]
    measured = tuple((n, r) for n, _, r in points)
    xx, xy, yy = (sum(a * b for a, b in zip(u, v, strict=True))
                  for u, v in ((xs, xs), (xs, ys), (ys, ys)))
    xr, yr = (sum(a * r for a, r in zip(u, rs, strict=True)) for u in (xs, ys))
    determinant = xx * yy - xy * xy
    if points and determinant > 1e-9 * xx * yy:
        a = (yy * xr - xy * yr) / determinant
        if a >= 0:
            return Growth(a, (xx * yr - xy * xr) / determinant, measured, not client_per_rank)
        # fewer with more ranks: none per rank
        return Growth(0.0, yr / yy, measured, not client_per_rank)
    return Growth(xr / xx if xx > 0 else 0.0, 0.0, measured, not client_per_rank)


def mds_drain(counts: Sequence[MdsCount], layout: str, phase: str, nranks: int, nodes: int,
              client_per_rank: bool) -> MdsDrain | None:
    """The layout's MDS at `nranks` on `nodes` from its runs' counts (None: no run counted)."""
    counts = tuple(sorted(counts, key=lambda count: (count.nranks, count.nnodes)))
    if not counts:
        return None
    names = list(dict.fromkeys(op for count in counts for op in count.ops))
    drains = []
    for op in names:
        growth = fit_growth([(count.nranks, count.nnodes,
                              per_pass(count, count.ops[op].requests if op in count.ops else 0,
                                       phase)) for count in counts], client_per_rank)
        means = [(count.ops[op].mean_s, count.nranks) for count in counts if op in count.ops]
        least = min(means)
        drains.append(OpDrain(op, growth, growth.at(nranks, nodes), least[0],
                              (least[0], max(means)[0]), least[1]))
    revoked = fit_growth([(count.nranks, count.nnodes, per_pass(count, count.caps_revoked, phase))
                          for count in counts], client_per_rank)
    return MdsDrain(layout, phase, nranks, nodes, client_per_rank,
                    tuple(sorted(drains, key=lambda drain: -drain.requests)), revoked, counts)


def counts_of(archive: Archive, series: Series) -> list[MdsCount]:
    """The MDS's counts of a layout's fitted runs (Series.points' run ids), from their
    sidecars; the runs without any are left out."""
    found = []
    for point in series.points:
        done = next((row for row in archive.run_rows(point.run_id)
                     if row["op"] == series.phase and row["layout"] == series.layout), None)
        sidecar = archive.sidecar(point.run_id).value if point.run_id else None
        if done is None or not isinstance(sidecar, Mapping):
            continue
        layouts = sidecar.get(PART.get(series.phase, ""))
        entry = layouts.get(series.layout) if isinstance(layouts, Mapping) else None
        count = counted(entry.get(KEY) if isinstance(entry, Mapping) else None, point.nranks,
                        point.nnodes, int(done["iterations"]) + int(done["warmup"] or 0),
                        point.run_id)
        if count is not None:
            found.append(count)
    return found


def client_per_rank(archive: Archive, series: Series) -> bool:
    """Each rank its own client of the MDS (a backend that asks its MDS itself: cephfs://),
    else the ranks of a node share their mount's client."""
    target = next((row["target"] for point in series.points
                   for row in archive.run_rows(point.run_id) if row.get("target")), "")
    try:
        return capabilities_for(target).mds_counters if target else False
    except UsageError:   # a scheme no backend serves now: no client of its own
        return False


def mds_drains(archive: Archive, projections: Sequence[tuple[Series, Projection, object]],
               nranks: int) -> list[tuple[MdsDrain, Projection]]:
    """`stampede project`'s layouts whose runs the MDS counted, each drained at `nranks`
    (on the nodes its latency projection put them), beside that projection."""
    found = []
    for series, projection, _ in projections:
        drain = mds_drain(counts_of(archive, series), series.layout, series.phase, nranks,
                          projection.prediction.nnodes, client_per_rank(archive, series))
        if drain is not None:
            found.append((drain, projection))
    return found
