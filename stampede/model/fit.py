"""Fitting the contention model (stampede.model.contention) to measured points, and
projecting it: least squares on relative errors (numpy, imported inside), the steps and
the band as the contention model's description says."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stampede.errors import UsageError
from stampede.model.contention import (
    Params,
    Prediction,
    data_rate,
    data_time,
    effective_threads,
    is_saturated,
    lock_count,
    metadata_stall,
    predict,
)

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


@dataclass(frozen=True)
class Known:
    """Parameters known beforehand (an emulated server), held fixed in the fit."""

    rtt_s: float | None = None
    service_s: float | None = None
    threads: float | None = None
    net_bps: float = math.inf


@dataclass(frozen=True)
class Fit:
    layout: str
    params: Params                     # ops_per_rank / bytes_per_rank: the largest run's
    points: tuple[Point, ...]
    meta_model_s: tuple[float, ...]
    last_model_s: tuple[float, ...]
    saturated: tuple[int, ...]         # rank counts whose burst exceeds the server, fitted
    agg_limited: tuple[int, ...]       # rank counts limited by B_agg / N, fitted
    stall_bound: bool                  # no run saturated the server: s/c is a bound
    agg_bound: bool                    # no run reached B_agg: B_agg is a bound
    client_bound: bool                 # every run was B_agg-limited: B_client is a bound
    notes: tuple[str, ...]
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
    def rms_residual(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))

    @property
    def max_residual(self) -> float:
        return max(abs(r) for r in self.residuals)


def _solve_nonneg(design: Any, target: Any, fixed: Sequence[float | None]) -> list[float]:
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


def fit_metadata(points: Sequence[Point], layout: str, known: Known = Known(),
                 locks: float | None = None) -> tuple[float, float, float]:
    """(RTT, s, c) that fit the measured stalls best (c = 1 where one lock serialises:
    `locks`, the restore's of the layout when None)."""
    import numpy as np

    locks = lock_count(layout) if locks is None else locks
    n = np.array([p.nranks for p in points], dtype=float)
    k = np.array([p.ops_per_rank for p in points], dtype=float)
    y = np.array([p.meta_s for p in points], dtype=float)
    used = (k > 0) & (y > 0)
    if not used.any():
        return (known.rtt_s or 0.0, known.service_s or 0.0, known.threads or 1.0)
    stalls = _Stalls(n[used], k[used], y[used], whole=known.threads is not None,
                     fixed=(known.rtt_s, known.service_s))
    if locks <= 1:
        grid = [1.0]
    elif known.threads is not None:
        grid = [known.threads]
    else:
        grid = [float(c) for c in np.geomspace(*THREAD_GRID[:2], int(THREAD_GRID[2]))]
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


@dataclass(frozen=True)
class _Stalls:
    """The measured stalls y at N ranks with k ops each, weighted by 1/y (relative error)."""

    n: Any
    k: Any
    y: Any
    whole: bool                              # drain in whole rounds (c known)
    fixed: tuple[float | None, float | None]   # (RTT, s) when known

    def rounds(self, threads: float) -> Any:
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


def fit_data(nranks: Sequence[float], bytes_per_rank: Sequence[float],
             data_s: Sequence[float]) -> tuple[float, float, bool, bool]:
    """(B_agg, B_client, agg_bound, client_bound) for data_s = bytes / min(B_agg / N, B_client);
    a bound: no point was limited by it, so the fit puts its knee at the edge of the points."""
    import numpy as np

    n = np.asarray(nranks, dtype=float)
    b = np.asarray(bytes_per_rank, dtype=float)
    t = np.asarray(data_s, dtype=float)
    used = (b > 0) & (t > 0)
    if not used.any():
        return math.inf, math.inf, False, False
    n, y = n[used], t[used] / b[used]          # seconds per byte of one rank
    weight = 1 / y
    w2 = weight ** 2
    order = np.argsort(n, kind="stable")
    best = (math.inf, 0.0, 0.0)
    for split in range(len(y) + 1):
        agg = np.zeros(len(y), dtype=bool)
        agg[order[split:]] = True
        client = ~agg
        v = float(np.sum(w2[client] * y[client]) / np.sum(w2[client])) if client.any() else math.nan
        u = float(np.sum(w2[agg] * n[agg] * y[agg]) / np.sum(w2[agg] * n[agg] ** 2)) \
            if agg.any() else math.nan
        if math.isnan(u):
            u = v / float(n.max())     # the largest run exactly at the aggregate limit
        if math.isnan(v):
            v = u * float(n.min())     # the smallest run exactly at the per-client limit
        model = np.maximum(n * u, v)
        error = float(np.sum(((model - y) * weight) ** 2))
        if error < best[0] * (1 - 1e-9) - 1e-300:
            best = (error, u, v)
    _, u, v = best
    # a limit no point is strictly past is a bound (the knee at the edge of the points)
    agg_bound = not bool(np.any(n * u > v * (1 + 1e-6)))
    client_bound = not bool(np.any(n * u < v * (1 - 1e-6)))
    return (1 / u if u > 0 else math.inf), (1 / v if v > 0 else math.inf), agg_bound, client_bound


def fit_points(points: Sequence[Point], layout: str, known: Known = Known(),
               last: Callable[[Point], float] = lambda point: point.last_s,
               meta: tuple[float, float, float] | None = None,
               locks: float | None = None) -> Fit:
    """Both stages: the metadata fit on the stalls, then the data fit on what remains of
    the time to last rank. `last` picks the measurement (median, min or max of the
    iterations); `meta` reuses a metadata fit; `locks` as fit_metadata's."""
    points = tuple(sorted(points, key=lambda p: p.nranks))
    locks = lock_count(layout) if locks is None else locks
    rtt, service, threads = meta if meta is not None else fit_metadata(points, layout, known,
                                                                        locks)
    whole = known.threads is not None
    c_eff = effective_threads(layout, threads, locks)
    meta_model = tuple(metadata_stall(p.nranks, p.ops_per_rank, rtt, service, c_eff, whole)
                       for p in points)
    notes = []
    data = []
    for point, stall in zip(points, meta_model):
        remaining = last(point) - stall
        if remaining <= 0 < point.bytes_per_rank:
            notes.append(f"at {point.nranks} rank(s) the fitted stall exceeds the measured time "
                         "to last rank: its data term is taken as 1% of it")
            remaining = 0.01 * last(point)
        data.append(remaining)
    agg, client, agg_bound, client_bound = fit_data([p.nranks for p in points],
                                      [p.bytes_per_rank for p in points], data)
    largest = points[-1]
    params = Params(rtt_s=rtt, service_s=service, threads=threads, agg_bps=agg,
                    client_bps=client, net_bps=math.inf, ops_per_rank=largest.ops_per_rank,
                    bytes_per_rank=largest.bytes_per_rank, whole_rounds=whole, locks=locks)
    last_model = tuple(stall + data_time(p.nranks, p.bytes_per_rank, agg, client)
                       for p, stall in zip(points, meta_model))
    saturated = tuple(p.nranks for p in points
                      if is_saturated(p.nranks, p.ops_per_rank, rtt, service, c_eff, whole))
    limited = tuple(p.nranks for p in points
                    if data_rate(p.nranks, agg, client)[1] == "B_agg / N" and p.bytes_per_rank > 0)
    has_meta = any(p.ops_per_rank > 0 and p.meta_s > 0 for p in points)
    fixed_drain = known.service_s is not None and (known.threads is not None or locks <= 1)
    return Fit(layout=layout, params=params, points=points, meta_model_s=meta_model,
               last_model_s=last_model, saturated=saturated, agg_limited=limited,
               stall_bound=has_meta and not saturated and not fixed_drain,
               agg_bound=agg_bound, client_bound=client_bound, notes=tuple(notes), locks=locks)


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


def bytes_per_rank_at(points: Sequence[Point], nranks: int, per_rank_size: bool) -> float:
    """A per-rank size stays; a total size is split over the ranks (as the largest run)."""
    largest = max(points, key=lambda p: p.nranks)
    if per_rank_size:
        return largest.bytes_per_rank
    return largest.bytes_per_rank * largest.nranks / nranks


@dataclass(frozen=True)
class Projection:
    fit: Fit
    params: Params                      # the fit's, with k and bytes at the projected count
    prediction: Prediction
    band: tuple[float, float]
    band_from: str
    meta_band: tuple[float, float]

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


def _measured(column: str) -> Callable[[Point], float]:
    def value(point: Point) -> float:
        return float(getattr(point, column))
    return value


def project(points: Sequence[Point], layout: str, nranks: int, known: Known = Known(),
            per_rank_size: bool = False, bytes_per_rank: float | None = None,
            locks: float | None = None, phase: str = "restore") -> Projection:
    """Fit, predict at `nranks`, and the band (spread refits, leave-one-out); `locks` as
    fit_metadata's, `phase` names the runs in a refusal."""
    counts = sorted({p.nranks for p in points})
    if len(counts) < MIN_RANK_COUNTS:
        raise UsageError(f"layout {layout}: {phase} runs at {len(counts)} distinct rank count(s) "
                         f"({', '.join(map(str, counts))}); projecting needs at least "
                         f"{MIN_RANK_COUNTS} (sweep more, e.g. stampede sweep JOB --ranks 1,2,4,8, "
                         f"or choose layouts with --layout)")
    k = ops_per_rank_at(points, nranks)
    size = bytes_per_rank if bytes_per_rank is not None else \
        bytes_per_rank_at(points, nranks, per_rank_size)

    def at_n(fit: Fit) -> Params:
        return replace(fit.params, ops_per_rank=k, bytes_per_rank=size, net_bps=known.net_bps)

    def at(fit: Fit) -> Prediction:
        return predict(at_n(fit), nranks, layout)

    central = fit_points(points, layout, known, locks=locks)
    prediction = at(central)
    meta = (central.params.rtt_s, central.params.service_s, central.params.threads)
    others: list[Prediction] = []
    sources = []
    spread = [fit_points(points, layout, known, last=_measured(column), meta=meta, locks=locks)
              for column in ("last_min_s", "last_max_s")
              if all(math.isfinite(getattr(p, column)) for p in points)]
    if spread:
        others += [at(fit) for fit in spread]
        sources.append("refit on the min/max iteration")
    if len(counts) > MIN_RANK_COUNTS:
        others += [at(fit_points([p for p in points if p.nranks != dropped], layout, known,
                                 locks=locks))
                   for dropped in counts]
        sources.append("leave-one-out")
    totals = [prediction.total_s] + [p.total_s for p in others]
    stalls = [prediction.meta_s] + [p.meta_s for p in others]
    return Projection(fit=central, params=at_n(central), prediction=prediction,
                      band=(min(totals), max(totals)),
                      band_from=" + ".join(sources) or "none (no spread columns)",
                      meta_band=(min(stalls), max(stalls)))
