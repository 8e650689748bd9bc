"""Fitting the contention model (stampede.model.contention) to measured points, and
projecting it: least squares on relative errors (numpy, imported inside), the steps and
the band as the contention model's description says."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stampede.model.contention import (
    Params,
    burst,
    effective_threads,
    is_saturated,
    metadata_stall,
    per_issuer,
    read_queue_time,
)
from stampede.model.traffic import Geometry, data_seconds, fit_rates, traffic

if TYPE_CHECKING:
    from stampede.model.traffic import Floats

MIN_RANK_COUNTS = 3
THREAD_GRID = (1.0, 1e6, 181)   # c from 1 to 1e6, 181 points (8% apart), then refined


@dataclass(frozen=True)
class Point:
    """One restore run at one rank count, as the fit sees it."""

    nranks: int
    ops_per_rank: float          # k measured: metadata ops per rank per iteration
    meta_s: float                # measured stall: sum over ops of k_op x lat_p50
    last_s: float                # time_to_last_rank_s (median over iterations)
    bytes_per_rank: float
    last_min_s: float = math.nan
    last_max_s: float = math.nan
    op_counts: tuple[tuple[str, float], ...] = ()   # (op, count per iteration, all ranks)
    ranks_per_node: int = 0      # 0: all on one node
    replicas: int = 1
    broadcast_group: str = "replica"
    run_id: str = ""             # the archived run it is (its sidecar: the MDS's counts)
    read_s: float = 0.0          # measured: reads per rank per iteration x the read's lat_p50
    read_max_s: float = 0.0      # the same read as the slowest: x the read's lat_max
    reads_per_rank: float = math.inf   # read calls per rank per iteration: q's ceiling
    meta_max_s: float = math.nan    # the stall read as the slowest: sum of k_op x lat_max
    outside_s: float = 0.0       # measured F: the last rank's time outside its timed ops
                                 # (median over iterations; 0: no sidecar timeline said)

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.nranks, self.ranks_per_node, self.replicas, self.broadcast_group)

    @property
    def nnodes(self) -> int:
        return self.geometry.nnodes

    @property
    def key(self) -> tuple[int, int]:
        """What makes two runs different points: the rank and node counts."""
        return self.nranks, self.nnodes


@dataclass(frozen=True)
class Known:
    """Parameters known beforehand (an emulated server), held fixed in the fit."""

    rtt_s: float | None = None
    service_s: float | None = None
    threads: float | None = None
    net_bps: float = math.inf
    node_bps: float | None = None    # one node's NIC, each direction


@dataclass(frozen=True)
class Fit:
    layout: str
    params: Params                     # ops_per_rank / bytes_per_rank: the largest run's
    points: tuple[Point, ...]
    meta_model_s: tuple[float, ...]
    last_model_s: tuple[float, ...]
    saturated: tuple[int, ...]         # rank counts whose burst exceeds the server, fitted
    agg_limited: tuple[int, ...]       # rank counts whose reads B_agg limits, fitted
    stall_bound: bool                  # no run saturated the server: s/c is a bound
    agg_bound: bool                    # no run reached B_agg: B_agg is a bound
    client_bound: bool                 # no run was B_client-limited: B_client is a bound
    notes: tuple[str, ...]
    node_bound: bool = False           # no run's reads or exchange measured B_node: a bound
    node_measured: bool = False        # B_node fitted from runs on several nodes (or given)
    limits: tuple[str, ...] = ()       # per point: what limited its reads
    exchange_measured: bool = False    # some run exchanged between nodes (measures B_node)
    locks: float = math.inf            # what the ops spread over (lock_count): c_eff <= it

    @property
    def serialised(self) -> bool:
        """One lock takes every op one at a time: c_eff = 1, whatever c."""
        return self.locks <= 1

    @property
    def residuals(self) -> tuple[float, ...]:
        """(measured - model) / measured time to last rank, per rank count."""
        return tuple((point.last_s - model) / point.last_s
                     for point, model in zip(self.points, self.last_model_s))

    @property
    def meta_measured_s(self) -> tuple[float, ...]:
        """Each point's measured stall of one issuing rank, as meta_model_s models it."""
        return tuple(measured_stall(point, self.layout) for point in self.points)

    @property
    def rms_residual(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))

    @property
    def max_residual(self) -> float:
        return max(abs(r) for r in self.residuals)


def _solve_nonneg(design: Floats, target: Floats, fixed: Sequence[float | None]) -> list[float]:
    """Least squares in two unknowns (normal equations), the free ones >= 0: a negative
    one is clamped to 0 and the other re-solved; an unidentified pair (the two columns
    proportional) puts it all on the second (RTT = 0: all latency is server time)."""
    values: list[float | None] = list(fixed)
    rest = target - sum(design[:, i] * value for i, value in enumerate(values) if value is not None)
    free = [i for i, value in enumerate(values) if value is None]
    if len(free) == 2:
        a, b = design[:, 0], design[:, 1]
        aa, ab, bb = float(a @ a), float(a @ b), float(b @ b)
        ay, by = float(a @ rest), float(b @ rest)
        determinant = aa * bb - ab * ab
        if determinant > 1e-9 * aa * bb:
            x0, x1 = (bb * ay - ab * by) / determinant, (aa * by - ab * ay) / determinant
            if x0 >= 0 and x1 >= 0:
                return [x0, x1]
        # the other one alone, with this one at 0; the better of the two (or the second
        # when unidentified)
        candidates = []
        for zero, keep, kk, ky in ((0, 1, bb, by), (1, 0, aa, ay)):
            x = max(ky / kk, 0.0) if kk > 0 else 0.0
            pair = [0.0, 0.0]
            pair[keep] = x
            error = float(((design[:, keep] * x - rest) ** 2).sum())
            candidates.append((error, zero, pair))
        if determinant <= 1e-9 * aa * bb:
            return candidates[0][2]
        return min(candidates, key=lambda item: (item[0], item[1]))[2]
    if len(free) == 1:
        column = design[:, free[0]]
        norm = float(column @ column)
        values[free[0]] = max(float(column @ rest) / norm, 0.0) if norm > 0 else 0.0
    return [float(value or 0.0) for value in values]


def _golden(objective: Callable[[float], float], low: float, high: float, steps: int = 30) -> float:
    """Minimum of a one-dimensional function on [low, high] (log scale); ties go low."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(low), math.log(high)
    x1, x2 = b - ratio * (b - a), a + ratio * (b - a)
    f1, f2 = objective(math.exp(x1)), objective(math.exp(x2))
    for _ in range(steps):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = objective(math.exp(x1))
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = objective(math.exp(x2))
    return math.exp(a if f1 <= f2 else x2)


def point_burst(point: Point, layout: str) -> tuple[float, float]:
    """(I, k N / I) of a point (contention.burst)."""
    return burst(layout, point.geometry, point.ops_per_rank)


def measured_stall(point: Point, layout: str) -> float:
    """The point's measured stall of one issuing rank: meta_s is the average over all
    ranks (x N / I)."""
    return point.meta_s * per_issuer(layout, point.geometry)


def _stalls_of(points: Sequence[Point], known: Known, layout: str) -> _Stalls | None:
    import numpy as np

    bursts = [point_burst(p, layout) for p in points]
    n = np.array([issuing for issuing, _ in bursts], dtype=float)
    k = np.array([ops for _, ops in bursts], dtype=float)
    y = np.array([measured_stall(p, layout) for p in points], dtype=float)
    used = (k > 0) & (y > 0)
    if not used.any():
        return None
    return _Stalls(n[used], k[used], y[used], whole=known.threads is not None,
                   fixed=(known.rtt_s, known.service_s))


def _thread_grid(locks: float, known: Known) -> list[float]:
    import numpy as np

    if locks <= 1:
        return [1.0]
    if known.threads is not None:
        return [known.threads]
    return [float(c) for c in np.geomspace(*THREAD_GRID[:2], int(THREAD_GRID[2]))]


def fit_metadata(points: Sequence[Point], layout: str, known: Known, locks: float
                 ) -> tuple[float, float, float]:
    """(RTT, s, c) that fit the measured stalls best (c = 1 where one lock serialises:
    `locks`, what the phase's metadata ops spread over: contention.lock_count)."""
    stalls = _stalls_of(points, known, layout)
    if stalls is None:
        return (known.rtt_s or 0.0, known.service_s or 0.0, known.threads or 1.0)
    grid = _thread_grid(locks, known)
    threads = _best_threads(grid, stalls, locks)
    _, rtt, service = stalls.at(min(threads, locks))
    c_eff = effective_threads(layout, threads, locks)
    if locks <= 1 and known.threads is not None:
        threads = known.threads         # reported as given; the one lock still serialises
    if any(is_saturated(*point, rtt, service, c_eff, stalls.whole)
           for point in zip(stalls.n, stalls.k)):
        return rtt, service, threads
    return _unsaturated(stalls, known, c_eff, c_fixed=grid == [1.0] or known.threads is not None,
                        threads=threads)


def metadata_alternatives(points: Sequence[Point], layout: str, known: Known,
                          tolerance: float, locks: float) -> list[tuple[float, float, float]]:
    """Fits (RTT, s, c) that saturate the server and whose error (the sum of squared
    relative misses) is within `tolerance` of the best: the runs cannot tell them apart.
    The fastest and the slowest drain s/c among them."""
    stalls = _stalls_of(points, known, layout)
    grid = _thread_grid(locks, known)
    if stalls is None or len(grid) == 1 or tolerance <= 0:
        return []
    fits = [(threads, *stalls.at(min(threads, locks))) for threads in grid]
    best = min(error for _, error, _, _ in fits)
    within = [(rtt, service, threads) for threads, error, rtt, service in fits
              if error <= best + tolerance and service > 0 and any(
                  is_saturated(n, k, rtt, service, min(threads, locks))
                  for n, k in zip(stalls.n, stalls.k))]
    if not within:
        return []
    drains = sorted(within, key=lambda fit: fit[1] / min(fit[2], locks))
    return [drains[0], drains[-1]]


@dataclass(frozen=True)
class _Stalls:
    """The measured stalls y at N ranks with k ops each, weighted by 1/y (relative error)."""

    n: Floats
    k: Floats
    y: Floats
    whole: bool                              # drain in whole rounds (c known)
    fixed: tuple[float | None, float | None]   # (RTT, s) when known

    def rounds(self, threads: float) -> Floats:
        import numpy as np

        rounds = self.n * self.k / threads
        return np.ceil(rounds - 1e-9) if self.whole else rounds

    def at(self, threads: float) -> tuple[float, float, float]:
        """(error, RTT, s) at this c: the best split of the rank counts into unsaturated
        and saturated, for each of which the model is linear in (RTT, s)."""
        import numpy as np

        n, k, y, weight = self.n, self.k, self.y, 1 / self.y
        rounds = self.rounds(threads)
        order = np.argsort(n * k, kind="stable")
        best = (math.inf, 0.0, 0.0)
        for split in range(len(y) + 1):
            saturated = np.zeros(len(y), dtype=bool)
            saturated[order[split:]] = True
            design = np.where(saturated[:, None], np.column_stack([np.ones_like(n), rounds]),
                              np.column_stack([k, k]))
            rtt, service = _solve_nonneg(design * weight[:, None], y * weight, self.fixed)
            model = np.maximum(k * (rtt + service), rtt + service * rounds)
            error = float(np.sum(((model - y) * weight) ** 2))
            if error < best[0] * (1 - 1e-9) - 1e-300:
                best = (error, rtt, service)
        return best


def _best_threads(grid: list[float], stalls: _Stalls, locks: float = math.inf) -> float:
    """The c of least error on the grid (ties: the smaller, so never more than `locks`
    where they bind), refined by golden section."""
    errors = [stalls.at(min(c, locks))[0] for c in grid]
    best_error = min(errors)
    tolerance = best_error * 1e-9 + 1e-300
    index = next(i for i, error in enumerate(errors) if error <= best_error + tolerance)
    threads = grid[index]
    if len(grid) > 1:
        low, high = grid[max(index - 1, 0)], grid[min(index + 1, len(grid) - 1)]
        refined = _golden(lambda c: stalls.at(min(c, locks))[0], low, high)
        if stalls.at(min(refined, locks))[0] <= best_error + tolerance:
            threads = refined
    return threads


def _unsaturated(stalls: _Stalls, known: Known, c_eff: float, c_fixed: bool,
                 threads: float) -> tuple[float, float, float]:
    """No run saturated the server: the points fix only L0 = RTT + s. Take the most
    pessimistic consistent split: as much of L0 server time as allowed, and the fewest
    threads with which every run stays unsaturated (the knee at the largest run)."""
    import numpy as np

    n, k, y, weight = stalls.n, stalls.k, stalls.y, 1 / stalls.y
    unloaded = float(np.sum(weight ** 2 * k * y) / np.sum(weight ** 2 * k * k))
    if c_fixed:      # c fixed: s as large as keeps every run unsaturated
        excess = stalls.rounds(c_eff) - 1
        limits = [(kk - 1) * unloaded / e for kk, e in zip(k, excess) if e > 0]
        service = min([unloaded, *limits])
    else:
        service = unloaded
    if known.service_s is not None:
        service = known.service_s
    rtt = known.rtt_s if known.rtt_s is not None else max(unloaded - service, 0.0)
    if known.rtt_s is not None and known.service_s is None:
        service = max(unloaded - rtt, 0.0)
    if not c_fixed and service > 0:
        threads = max([1.0] + [service * nn * kk / (kk * (rtt + service) - rtt)
                               for nn, kk in zip(n, k) if kk * (rtt + service) > rtt])
    return rtt, service, threads


def _inverse(seconds_per_byte: float) -> float:
    return 1 / seconds_per_byte if seconds_per_byte > 0 else math.inf


def fit_data(nranks: Sequence[float], bytes_per_rank: Sequence[float],
             data_s: Sequence[float]) -> tuple[float, float, bool, bool]:
    """(B_agg, B_client, agg_bound, client_bound) for data_s = bytes / min(B_agg / N, B_client)
    (N ranks on one node, each reading its shard); a bound: no point was limited by it, so
    the fit puts its knee at the edge of the points."""
    used = [(n, t / b) for n, b, t in zip(nranks, bytes_per_rank, data_s) if b > 0 and t > 0]
    if not used:
        return math.inf, math.inf, False, False
    rates = fit_rates([(float(n), 0.0, 1.0) for n, _ in used], [0.0] * len(used),
                      [y for _, y in used], fixed=(None, 0.0, None))
    return (_inverse(rates.agg_s_per_byte), _inverse(rates.client_s_per_byte),
            "B_agg" in rates.bound, "B_client" in rates.bound)


def _fit_rates(points: Sequence[Point], layout: str, data: Sequence[float],
               known: Known) -> tuple[float, float, float, tuple[str, ...], bool]:
    """(B_agg, B_node, B_client, the bounded ones, B_node measured) from each point's data
    time; B_node is left out (unlimited) when every run was on one node and none is given."""
    used = [(point, remaining) for point, remaining in zip(points, data)
            if point.bytes_per_rank > 0 and remaining > 0]
    several = any(point.nnodes > 1 for point, _ in used)
    if known.node_bps is not None:
        node: float | None = 1 / known.node_bps
    else:
        node = None if several else 0.0
    if not used:
        return math.inf, known.node_bps or math.inf, math.inf, (), known.node_bps is not None
    flows = [traffic(layout, point.geometry) for point, _ in used]
    rates = fit_rates([(f.storage, f.node, f.rank) for f in flows], [f.exchange for f in flows],
                      [remaining / point.bytes_per_rank for point, remaining in used],
                      fixed=(None, node, None))
    return (_inverse(rates.agg_s_per_byte), _inverse(rates.node_s_per_byte),
            _inverse(rates.client_s_per_byte), rates.bound, node != 0.0)


def read_queue_ops(points: Sequence[Point], saturated: bool, layout: str = "") -> float:
    """q, the reads' requests at the metadata server in metadata ops per issuing rank: the
    read's time per issuing rank (contention.issuers) against the metadata ops' time per
    op, each as growth over the smallest run (what does not grow, a read's bytes at
    B_client, cancels), least squares through 0. Only when some run saturated the server:
    below it the ops' time is flat and a read's growth is the bandwidth's (q = 0). At most
    one metadata op per read call: a read's growth beyond it is not the server's (ranks
    outnumbering cores slow every read; a local disk's 8 KiB read once fitted q = 110)."""
    used = [p for p in points if p.ops_per_rank > 0 and p.meta_s > 0 and p.read_s > 0]
    if not saturated or len(used) < 2:
        return 0.0
    ceiling = min(p.reads_per_rank * per_issuer(layout, p.geometry) for p in used)
    base = used[0]
    xs = [p.meta_s / p.ops_per_rank - base.meta_s / base.ops_per_rank for p in used[1:]]
    ys = [(p.read_s * per_issuer(layout, p.geometry)
           - base.read_s * per_issuer(layout, base.geometry)) for p in used[1:]]
    xx = sum(x * x for x in xs)
    if xx <= 0:
        return 0.0
    return min(max(sum(x * y for x, y in zip(xs, ys)) / xx, 0.0), ceiling)


def fit_points(points: Sequence[Point], layout: str, locks: float, known: Known = Known(),
               last: Callable[[Point], float] = lambda point: point.last_s,
               meta: tuple[float, float, float] | None = None) -> Fit:
    """Both stages: the metadata fit on the stalls, then the data fit on what remains of
    the time to last rank. `last` picks the measurement (median, min or max of the
    iterations); `meta` reuses a metadata fit; `locks` as fit_metadata's."""
    points = tuple(sorted(points, key=lambda p: p.key))
    rtt, service, threads = meta if meta is not None else fit_metadata(points, layout, known,
                                                                        locks)
    whole = known.threads is not None
    c_eff = effective_threads(layout, threads, locks)
    # each point's burst: its issuing ranks, each one's ops (every rank but a reader's members)
    bursts = [point_burst(p, layout) for p in points]
    meta_model = tuple(metadata_stall(*b, rtt, service, c_eff, whole) for b in bursts)
    saturated = tuple(p.nranks for p, b in zip(points, bursts)
                      if is_saturated(*b, rtt, service, c_eff, whole))
    read_ops = read_queue_ops(points, bool(saturated), layout)
    read_model = tuple(read_queue_time(*b, read_ops, rtt, service, c_eff, whole)
                       for b in bursts)
    notes = []
    data = []
    for point, stall, queued in zip(points, meta_model, read_model):
        # F is measured per run, not fitted: the data term is what is left without it
        remaining = last(point) - point.outside_s - stall - queued
        if remaining <= 0 < point.bytes_per_rank:
            notes.append(f"at {point.nranks} rank(s) the fitted stall (with the reads' requests "
                         "and the time outside the ops) exceeds the measured time to last rank: "
                         "its data term is taken as 1% of it")
            remaining = 0.01 * last(point)
        data.append(remaining)
    agg, node, client, bound, node_measured = _fit_rates(points, layout, data, known)
    largest = points[-1]
    params = Params(rtt_s=rtt, service_s=service, threads=threads, agg_bps=agg,
                    client_bps=client, net_bps=math.inf, node_bps=node,
                    ops_per_rank=largest.ops_per_rank, bytes_per_rank=largest.bytes_per_rank,
                    whole_rounds=whole, locks=locks, ranks_per_node=largest.ranks_per_node,
                    replicas=largest.replicas, broadcast_group=largest.broadcast_group,
                    read_ops_per_rank=read_ops, fixed_s=largest.outside_s)
    parts = [data_seconds(traffic(layout, p.geometry), p.bytes_per_rank, agg, node, client)
             for p in points]
    last_model = tuple(p.outside_s + stall + queued + read + exchange
                       for p, stall, queued, (read, exchange, _)
                       in zip(points, meta_model, read_model, parts))
    limited = tuple(p.nranks for p, (_, _, limit) in zip(points, parts)
                    if limit == "B_agg" and p.bytes_per_rank > 0)
    has_meta = any(p.ops_per_rank > 0 and p.meta_s > 0 for p in points)
    fixed_drain = known.service_s is not None and (known.threads is not None or locks <= 1)
    return Fit(layout=layout, params=params, points=points, meta_model_s=meta_model,
               last_model_s=last_model, saturated=saturated, agg_limited=limited,
               stall_bound=has_meta and not saturated and not fixed_drain,
               agg_bound="B_agg" in bound, client_bound="B_client" in bound,
               notes=tuple(notes), locks=locks, node_bound="B_node" in bound,
               node_measured=node_measured, limits=tuple(limit for _, _, limit in parts),
               exchange_measured=any(exchange > 0 for _, exchange, _ in parts))
