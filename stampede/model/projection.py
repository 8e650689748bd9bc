"""Projecting the fitted contention model (stampede.model.fit) to a rank count that cannot
be run: the ops and bytes per rank there, the geometry (nodes, replicas), and the band.

The band is the envelope of the projection from:
- refits on each run's fastest and slowest iteration (time_to_last_rank_min_s / _max_s):
  run-to-run noise carried to N;
- leave-one-out refits, with four or more rank counts: how much it leans on one run;
- the metadata fits the runs cannot tell from the best (each run missed by no more than its
  own iteration spread): the fastest and the slowest drain s/c among them, so a drain that
  rests on one saturated rank count widens the band as it should;
- where a run saturated the server, the fit on the runs read as their slowest rank's
  (each op's count x its lat_max: Point.meta_max_s, and the reads', read_max_s, for q):
  the model's T_meta is the last rank's stall, the drain, while the central fit reads the
  median rank's (lat_p50), which in a saturated FIFO burst sits below it (k = 1: about
  half; k = 2 at the emulator: s/c 3.8-4.3 ms read against its 4.5 ms); each op's slowest
  latency reads it from above. A bias of the measure, not noise: no spread of the runs
  covers it;
- each limit the runs only bounded (B_agg, B_node, B_client, s/c) at its other extreme,
  never reached: the central value takes it as reached right past the largest run (the
  pessimistic reading), the band's other end as never reached;
- the runs' smallest and largest F (the last rank's time outside its timed ops): measured
  per run, not modelled in N, so the central value takes the run nearest the target's.
It is not a confidence interval of the model: no band from a few small runs bounds an
extrapolation thousands of times beyond them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from stampede.errors import UsageError
from stampede.model.contention import Params, Prediction, effective_threads, predict
from stampede.model.fit import (
    MIN_RANK_COUNTS,
    Fit,
    Known,
    Point,
    fit_points,
    metadata_alternatives,
)


def ops_per_rank_at(points: Sequence[Point], nranks: int) -> float:
    """k at `nranks`: each op's count per iteration fitted as a N + b over the points."""
    import numpy as np

    ops = sorted({op for point in points for op, _ in point.op_counts})
    total = 0.0
    for op in ops:
        xs = [float(p.nranks) for p in points]
        ys = [dict(p.op_counts).get(op, 0.0) for p in points]
        if len(set(xs)) < 2:
            total += ys[-1] / xs[-1] * nranks
            continue
        slope, intercept = np.polyfit(xs, ys, 1)
        total += max(float(slope) * nranks + float(intercept), 0.0)
    return total / nranks


def nearest_run(points: Sequence[Point], nranks: int) -> Point:
    """The run nearest `nranks` in rank count (ties: the larger), the largest beyond them:
    whose F (Point.outside_s) the projection carries. F is not modelled in N: what grows
    it (ranks outnumbering cores, a barrier's exit across more nodes) differs per machine."""
    return min(points, key=lambda p: (abs(p.nranks - nranks), -p.nranks, -p.nnodes))


def bytes_per_rank_at(points: Sequence[Point], nranks: int, per_rank_size: bool,
                      replicas: int | None = None) -> float:
    """A per-rank size stays; a total size is split over the shards N / R (as the largest
    run, whose replicas hold unless given)."""
    largest = max(points, key=lambda p: p.key)
    if per_rank_size:
        return largest.bytes_per_rank
    shards = largest.nranks / max(largest.replicas, 1)
    return largest.bytes_per_rank * shards / (nranks / max(replicas or largest.replicas, 1))


@dataclass(frozen=True)
class Projection:
    fit: Fit
    params: Params                      # the fit's, with k and bytes at the projected count
    prediction: Prediction
    band: tuple[float, float]
    band_from: str
    meta_band: tuple[float, float]

    @property
    def band_spread(self) -> float:
        """How many times the band's high end is its low end."""
        low, high = self.band
        return high / low if low > 0 else math.inf

    @property
    def too_wide(self) -> bool:
        """The band spans more than WIDE_BAND: its ends, never one time, are the answer."""
        return self.band_spread > WIDE_BAND

    @property
    def serialised(self) -> bool:
        """Every rank's metadata ops wait on one lock (c_eff = 1): the restore's shared
        inode, the save's one directory."""
        return self.fit.serialised

    @property
    def drain_ops_per_s(self) -> float:
        """How fast the server drains a saturated burst: c_eff / s."""
        threads = effective_threads(self.fit.layout, self.params.threads, self.fit.locks)
        return threads / self.params.service_s if self.params.service_s > 0 else math.inf


WIDE_BAND = 10.0   # a band whose ends differ more than this: no single time is the answer
_BOUND_NAMES = {"agg_bps": "B_agg", "node_bps": "B_node", "client_bps": "B_client",
                "threads": "s/c"}


def _unreached(fit: Fit) -> dict[str, Any]:
    """The parameters the runs only bounded, at their other extreme: a limit no run reached
    may never be reached (the central value takes it as reached right past the runs). So
    is one that limits a single run: one point past a knee is as likely noise."""
    once = {name for name in ("B_agg", "B_node", "B_client") if fit.limits.count(name) == 1}
    if fit.exchange_measured:
        once.discard("B_node")
    flags = (("agg_bps", fit.agg_bound or "B_agg" in once),
             ("node_bps", fit.node_bound or "B_node" in once),
             ("client_bps", fit.client_bound or "B_client" in once),
             ("threads", fit.stall_bound))
    return {name: math.inf for name, flag in flags if flag}


def _slowest_rank(points: Sequence[Point], layout: str, known: Known, locks: float,
                  central: Fit) -> Fit | None:
    """The fit on each run read as its slowest rank's: the stall (meta_max_s) and the reads'
    time (read_max_s, from which q is fitted), where the central fit saturated the server
    and every run has them; else None."""
    if not central.saturated or not all(math.isfinite(p.meta_max_s) and p.meta_max_s > 0
                                        for p in points if p.meta_s > 0):
        return None
    slowest = [replace(p, meta_s=p.meta_max_s, read_s=p.read_max_s) if p.meta_s > 0 else p
               for p in points]
    return fit_points(slowest, layout, locks, known)


def _measured(column: str) -> Callable[[Point], float]:
    def value(point: Point) -> float:
        return float(getattr(point, column))
    return value


@dataclass(frozen=True)
class Scaling:
    """How the runs grew, to carry on to the projected rank count."""

    per_rank_bytes: bool            # bytes per rank stay (else the total is split)
    replicas_per_node: bool         # one replica per node (else replicas as the largest run)
    ranks_per_node: int             # the largest run's (0: every run on one node)
    replicas: int                   # the largest run's


class Grown(Protocol):
    """A layout's runs as scale_for reads them: stampede.model.series.Series, which is
    built from archive rows above this module (series imports projection, never back)."""

    @property
    def layout(self) -> str: ...

    @property
    def scaling(self) -> Scaling: ...


@dataclass(frozen=True)
class Scale:
    """Where the projection goes: the rank count, and (None: as the largest run) the ranks
    per node, the replicas and the bytes per rank there."""

    nranks: int
    ranks_per_node: int | None = None
    replicas: int | None = None
    bytes_per_rank: float | None = None


def scale_for(series: Grown, nranks: int, ranks_per_node: int | None = None,
              replicas: int | None = None, bytes_per_rank: float | None = None) -> Scale:
    """Where `stampede project --target-ranks N` projects a layout's series: the ranks per
    node and the replicas given, else as its runs grew (replicas per node kept per node)."""
    scaling = series.scaling
    # None (0: the runs were on one node): project() takes the largest run's rank count
    per_node = ranks_per_node if ranks_per_node is not None else scaling.ranks_per_node or None
    if replicas is None and scaling.replicas_per_node and per_node:
        replicas = -(-nranks // per_node)
    if replicas is None:
        replicas = scaling.replicas
    if nranks % replicas:
        raise UsageError(f"layout {series.layout}: {replicas} replicas (as the runs had) do not "
                         f"divide --target-ranks {nranks}", hint="give --replicas R")
    return Scale(nranks, per_node, replicas, bytes_per_rank)


def project(points: Sequence[Point], layout: str, nranks: int | Scale, known: Known | None = None,
            per_rank_size: bool = False, bytes_per_rank: float | None = None, *,
            locks: float, phase: str = "restore") -> Projection:
    """Fit, predict at `nranks` (or a Scale), and the band (the module's list); `locks` as
    fit_metadata's (the runs' Series.locks), `phase` names the runs in a refusal."""
    known = known or Known()
    scale = nranks if isinstance(nranks, Scale) else Scale(nranks, bytes_per_rank=bytes_per_rank)
    nranks = scale.nranks
    keys = sorted({p.key for p in points})
    if len(keys) < MIN_RANK_COUNTS:
        counts = sorted({p.nranks for p in points})
        raise UsageError(f"layout {layout}: {phase} runs at {len(counts)} distinct rank count(s) "
                         f"({', '.join(map(str, counts))}); projecting needs at least "
                         f"{MIN_RANK_COUNTS} (sweep more, e.g. stampede sweep JOB --ranks 1,2,4,8, "
                         f"or choose layouts with --layout)")
    k = ops_per_rank_at(points, nranks)
    largest = max(points, key=lambda p: p.key)
    # as the largest run: its ranks per node, or (0: it ran on one node) all its ranks,
    # never the whole target on one node
    per_node = (largest.ranks_per_node or largest.nranks) if scale.ranks_per_node is None \
        else scale.ranks_per_node
    replicas = largest.replicas if scale.replicas is None else scale.replicas
    size = scale.bytes_per_rank if scale.bytes_per_rank is not None else \
        bytes_per_rank_at(points, nranks, per_rank_size, replicas)
    fixed = nearest_run(points, nranks).outside_s

    def at_n(fit: Fit) -> Params:
        return replace(fit.params, ops_per_rank=k, bytes_per_rank=size, net_bps=known.net_bps,
                       ranks_per_node=per_node, replicas=replicas, fixed_s=fixed)

    def at(fit: Fit) -> Prediction:
        return predict(at_n(fit), nranks, layout)

    central = fit_points(points, layout, locks, known)
    prediction = at(central)
    meta = (central.params.rtt_s, central.params.service_s, central.params.threads)
    others: list[Prediction] = []
    sources = []
    spread = [fit_points(points, layout, locks, known, last=_measured(column), meta=meta)
              for column in ("last_min_s", "last_max_s")
              if all(math.isfinite(getattr(p, column)) for p in points)]
    if spread:
        others += [at(fit) for fit in spread]
        sources.append("refit on the min/max iteration")
    if len(keys) > MIN_RANK_COUNTS:
        others += [at(fit_points([p for p in points if p.key != dropped], layout, locks, known))
                   for dropped in keys]
        sources.append("leave-one-out")
    halves = [(p.last_max_s - p.last_min_s) / (2 * p.last_s) for p in points
              if math.isfinite(p.last_max_s - p.last_min_s) and p.last_s > 0]
    # fits of the stalls that miss no run by more than its own iteration spread
    alternatives = metadata_alternatives(points, layout, known, sum(d * d for d in halves), locks)
    if alternatives:
        others += [at(fit_points(points, layout, locks, known, meta=meta))
                   for meta in alternatives]
        sources.append("the metadata fits within the runs' spread")
    slowest = _slowest_rank(points, layout, known, locks, central)
    if slowest is not None:
        others.append(at(slowest))
        sources.append("the stall read as the slowest rank's")
    unreached = _unreached(central)
    if unreached:
        others.append(predict(replace(at_n(central), **unreached), nranks, layout))
        sources.append("the bounded " + ", ".join(_BOUND_NAMES[name] for name in unreached)
                       + " never reached")
    outside = sorted({p.outside_s for p in points})
    if len(outside) > 1:
        others += [predict(replace(at_n(central), fixed_s=value), nranks, layout)
                   for value in (outside[0], outside[-1])]
        sources.append("the runs' smallest and largest F")
    totals = [prediction.total_s] + [p.total_s for p in others]
    stalls = [prediction.meta_s] + [p.meta_s for p in others]
    return Projection(fit=central, params=at_n(central), prediction=prediction,
                      band=(min(totals), max(totals)),
                      band_from=" + ".join(sources) or "none (no spread columns)",
                      meta_band=(min(stalls), max(stalls)))
