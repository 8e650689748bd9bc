"""`stampede project`: a contention model of the restore, fitted to archived runs at a few
rank counts and projected to a rank count that cannot be run.

The model, per layout (N ranks leave the start barrier together):

  metadata stall   T_meta(N) = max( k (RTT + s),  RTT + s N k / c_eff )
  data             T_data(N) = bytes_per_rank / min(B_agg / N, B_client, B_net)
  time to last rank     T(N) = T_meta(N) + T_data(N)

  k        metadata ops each rank issues before its data flows: stat_count + open_count
           per file, + 1 list (list-first), + 1 index (metadata-first); taken from the
           archive as count / (nranks x iterations) of the stat/open/list/index rows, and
           projected by fitting each op's count per iteration as a N + b (list-bcast
           lists once per job, not per rank)
  RTT      one metadata op's round trip outside the server (client, network)
  s, c     server time of one op, and the server's threads (ops in service at once)
  c_eff    c, except 1 for the shared layout: every rank's stat and open land on the one
           file's inode, and one server (one Lustre MDT, one S3 prefix) serialises them
  B_agg    aggregate storage bandwidth; B_client one client's; B_net one client's network
           (indistinguishable from B_client in runs on one network: give it with --net-gbps)

Why T_meta has this shape: each rank issues its k ops one after another. While the
server keeps up, each costs RTT + s, so the rank's stall is k (RTT + s). Once the burst
exceeds capacity (N ranks with an op in flight each outrun c threads), the server drains
the burst's N k services c at a time: the last reply comes RTT + N k s / c after the
start. (The issue wrote RTT + s + N k s / c; the first op's s is already one of the N k
drained, so it is not added twice.) With --threads given (a server of known c, such as
`stampede emulate-mds`) the drain is counted in whole rounds, s ceil(N k / c): within a
few % of a simulated closed-loop FIFO server with a constant s at N = 1..8, where the
continuous form misses by up to ~20% near the knee. predict(params, nranks, layout) is
the model alone, for parameters known beforehand (such a validation).

The fit (least squares on relative errors, numpy):
1. Points: per layout, the configuration of its latest valid restore row, and the latest
   run of that configuration at each rank count. Fewer than three distinct rank counts is
   refused: two points fit a line through anything.
2. Metadata: the measured stall at N is sum over ops of k_op x lat_p50 (the median rank's
   metadata time; under a saturated closed loop with k >= 2 it approaches the drain, for
   k = 1 a FIFO burst's median is about half of it). (RTT, s, c) are fitted: for each c
   (a log grid from 1 to 1e6, refined by golden section; c_eff = 1 for shared) and each
   split of the rank counts into unsaturated / saturated, the model is linear in
   (RTT, s); the combination with the least error wins (ties: the smaller c). When no
   rank count saturated the server, the points fix only RTT + s, and the fit takes the
   most pessimistic split they allow: as much of it server time s as keeps every run
   unsaturated (RTT = 0 unless c is fixed), with the fewest threads c that do (the knee
   at the largest run). The output says so: the projected stall is then an upper bound.
   Known --rtt-s, --service-s, --threads are held fixed.
3. Data: (T(N) - T_meta model(N)) / bytes_per_rank = max(N / B_agg, 1 / B_client), fitted
   the same way in (1/B_agg, 1/B_client). When no rank count reached the aggregate limit,
   B_agg is only bounded below: the bound (the largest run exactly at the limit) is used,
   and the projected time is marked as an upper bound.
4. Residuals: measured against fitted time to last rank and stall at every rank count.
5. Band: the data fit repeated on time_to_last_rank_min_s and _max_s (every rank count's
   fastest and slowest iteration: run-to-run noise carried to N) and, with four or more
   rank counts, leave-one-out refits (each rank count dropped in turn: how much the
   projection leans on one run). The band is the envelope of those projections. The
   per-op latencies have no spread columns, so the stall's band comes from leave-one-out
   alone. It is not a confidence interval of the model: no band from a few small runs
   bounds an extrapolation thousands of times beyond them.
Each layout is printed with its configuration (job, backend, fs_type, cache, pattern,
stat_count, open_count), and warm-cache or oversubscribed runs are noted.

Limits: one server (a file system with several metadata targets spreads a sharded
checkpoint's ops over them: c is then their total, while a shared file still sits on
one); metadata ops are taken to come before data (lock traffic during reads, close, and
retries such as S3's 503 SlowDown are not modelled); client dentry/inode caches hit after
the first iteration and flatten T_meta; a warm page cache measures memory, not storage;
ranks outnumbering cores (a laptop sweep) make CPU contention look like server
contention; exchanges (broadcast, striped) are folded into the data term.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stampede.errors import UsageError

METADATA_OPS = ("list", "index", "stat", "open")
SHARED_INODE_LAYOUTS = frozenset({"shared"})
MIN_RANK_COUNTS = 3
# What must be equal for two restore runs at different rank counts to be points of one fit.
CONFIG_COLUMNS = ("backend", "fs_type", "cache", "format", "block_bytes", "pattern", "replicas",
                  "broadcast_group", "index_bytes", "stat_count", "open_count", "verify", "jitter",
                  "h2d", "size_total_requested", "size_per_rank_requested")
THREAD_GRID = (1.0, 1e6, 181)   # c from 1 to 1e6, 181 points (8% apart), then refined


# --- the model (pure) -----------------------------------------------------------------

@dataclass(frozen=True)
class Params:
    """The model's parameters for one layout on one storage system (seconds, bytes/s)."""

    rtt_s: float
    service_s: float
    threads: float
    agg_bps: float = math.inf
    client_bps: float = math.inf
    net_bps: float = math.inf
    ops_per_rank: float = 2.0        # k at the rank count predicted
    bytes_per_rank: float = 0.0      # at the rank count predicted
    whole_rounds: bool = False       # drain in whole rounds of s (a server of known c)


@dataclass(frozen=True)
class Prediction:
    layout: str
    nranks: int
    meta_s: float
    data_s: float
    limit: str           # which bandwidth sets T_data: "B_agg / N", "B_client", "B_net"
    saturated: bool      # the metadata burst exceeds the server's capacity
    rate_bps: float      # the per-rank rate of the data term

    @property
    def total_s(self) -> float:
        return self.meta_s + self.data_s


def effective_threads(layout: str, threads: float) -> float:
    """c_eff: the shared layout's ops all wait on one inode."""
    return 1.0 if layout in SHARED_INODE_LAYOUTS else threads


def metadata_stall(nranks: float, ops_per_rank: float, rtt_s: float, service_s: float,
                   threads: float, whole_rounds: bool = False) -> float:
    """T_meta = max(k (RTT + s), RTT + s N k / c): alone, or draining the burst."""
    if ops_per_rank <= 0:
        return 0.0
    rounds = nranks * ops_per_rank / threads
    if whole_rounds:
        rounds = math.ceil(rounds - 1e-9)
    return max(ops_per_rank * (rtt_s + service_s), rtt_s + service_s * rounds)


def is_saturated(nranks: float, ops_per_rank: float, rtt_s: float, service_s: float,
                 threads: float, whole_rounds: bool = False) -> bool:
    alone = ops_per_rank * (rtt_s + service_s)
    return ops_per_rank > 0 and metadata_stall(nranks, ops_per_rank, rtt_s, service_s, threads,
                                               whole_rounds) > alone * (1 + 1e-6)


def data_rate(nranks: float, agg_bps: float, client_bps: float,
              net_bps: float = math.inf) -> tuple[float, str]:
    """The slowest of B_agg / N, B_client and B_net, and its name."""
    rates = (("B_agg / N", agg_bps / nranks), ("B_client", client_bps), ("B_net", net_bps))
    name, rate = min(rates, key=lambda item: item[1])
    return rate, name


def data_time(nranks: float, bytes_per_rank: float, agg_bps: float, client_bps: float,
              net_bps: float = math.inf) -> float:
    """T_data = bytes_per_rank / min(B_agg / N, B_client, B_net)."""
    rate, _ = data_rate(nranks, agg_bps, client_bps, net_bps)
    if bytes_per_rank <= 0 or math.isinf(rate):
        return 0.0
    return bytes_per_rank / rate


def predict(params: Params, nranks: int, layout: str) -> Prediction:
    """Time to last rank = T_meta + T_data at `nranks` for `layout`, from known parameters."""
    threads = effective_threads(layout, params.threads)
    meta = metadata_stall(nranks, params.ops_per_rank, params.rtt_s, params.service_s, threads,
                          params.whole_rounds)
    rate, limit = data_rate(nranks, params.agg_bps, params.client_bps, params.net_bps)
    return Prediction(layout=layout, nranks=nranks, meta_s=meta,
                      data_s=data_time(nranks, params.bytes_per_rank, params.agg_bps,
                                       params.client_bps, params.net_bps),
                      limit=limit, rate_bps=rate,
                      saturated=is_saturated(nranks, params.ops_per_rank, params.rtt_s,
                                             params.service_s, threads, params.whole_rounds))


# --- the fit (pure; numpy inside) --------------------------------------------------------

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

    @property
    def residuals(self) -> tuple[float, ...]:
        """(measured - model) / measured time to last rank, per rank count."""
        return tuple((point.last_s - model) / point.last_s
                     for point, model in zip(self.points, self.last_model_s))


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


def fit_metadata(points: Sequence[Point], layout: str,
                 known: Known = Known()) -> tuple[float, float, float]:
    """(RTT, s, c) that fit the measured stalls best (c = 1 for the shared layout)."""
    import numpy as np

    n = np.array([p.nranks for p in points], dtype=float)
    k = np.array([p.ops_per_rank for p in points], dtype=float)
    y = np.array([p.meta_s for p in points], dtype=float)
    used = (k > 0) & (y > 0)
    if not used.any():
        return (known.rtt_s or 0.0, known.service_s or 0.0, known.threads or 1.0)
    n, k, y = n[used], k[used], y[used]
    weight = 1 / y
    whole = known.threads is not None
    order = np.argsort(n * k, kind="stable")
    fixed = (known.rtt_s, known.service_s)

    def at(threads: float) -> tuple[float, float, float]:
        """(error, RTT, s) at this c: the best split into unsaturated / saturated."""
        rounds = n * k / threads
        if whole:
            rounds = np.ceil(rounds - 1e-9)
        best = (math.inf, 0.0, 0.0)
        for split in range(len(y) + 1):
            saturated = np.zeros(len(y), dtype=bool)
            saturated[order[split:]] = True
            design = np.where(saturated[:, None], np.column_stack([np.ones_like(n), rounds]),
                              np.column_stack([k, k]))
            rtt, service = _solve_nonneg(design * weight[:, None], y * weight, fixed)
            model = np.maximum(k * (rtt + service), rtt + service * rounds)
            error = float(np.sum(((model - y) * weight) ** 2))
            if error < best[0] * (1 - 1e-9) - 1e-300:
                best = (error, rtt, service)
        return best

    if layout in SHARED_INODE_LAYOUTS:
        grid = [1.0]
    elif known.threads is not None:
        grid = [known.threads]
    else:
        grid = [float(c) for c in np.geomspace(*THREAD_GRID[:2], int(THREAD_GRID[2]))]
    errors = [at(c)[0] for c in grid]
    best_error = min(errors)
    tolerance = best_error * 1e-9 + 1e-300
    index = next(i for i, error in enumerate(errors) if error <= best_error + tolerance)
    threads = grid[index]
    if len(grid) > 1:
        low, high = grid[max(index - 1, 0)], grid[min(index + 1, len(grid) - 1)]
        refined = _golden(lambda c: at(c)[0], low, high)
        if at(refined)[0] <= best_error + tolerance:
            threads = refined
    _, rtt, service = at(threads)
    c_eff = effective_threads(layout, threads)
    if layout in SHARED_INODE_LAYOUTS and known.threads is not None:
        threads = known.threads         # reported as given; the one inode still serialises
    if any(is_saturated(*point, rtt, service, c_eff, whole) for point in zip(n, k)):
        return rtt, service, threads
    # No run saturated the server: the points fix only L0 = RTT + s. Take the most
    # pessimistic consistent split: as much of L0 server time as allowed, and the fewest
    # threads with which every run stays unsaturated (the knee at the largest run).
    unloaded = float(np.sum(weight ** 2 * k * y) / np.sum(weight ** 2 * k * k))
    if grid == [1.0] or known.threads is not None:      # c fixed: s as large as stays unsaturated
        rounds = n * k / c_eff
        if whole:
            rounds = np.ceil(rounds - 1e-9)
        excess = rounds - 1
        limits = [(kk - 1) * unloaded / e for kk, e in zip(k, excess) if e > 0]
        service = min([unloaded, *limits])
    else:
        service = unloaded
    if known.service_s is not None:
        service = known.service_s
    rtt = known.rtt_s if known.rtt_s is not None else max(unloaded - service, 0.0)
    if known.rtt_s is not None and known.service_s is None:
        service = max(unloaded - rtt, 0.0)
    if grid != [1.0] and known.threads is None and service > 0:
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
               meta: tuple[float, float, float] | None = None) -> Fit:
    """Both stages: the metadata fit on the stalls, then the data fit on what remains of
    the time to last rank. `last` picks the measurement (median, min or max of the
    iterations); `meta` reuses a metadata fit."""
    points = tuple(sorted(points, key=lambda p: p.nranks))
    rtt, service, threads = meta if meta is not None else fit_metadata(points, layout, known)
    whole = known.threads is not None
    c_eff = effective_threads(layout, threads)
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
                    bytes_per_rank=largest.bytes_per_rank, whole_rounds=whole)
    last_model = tuple(stall + data_time(p.nranks, p.bytes_per_rank, agg, client)
                       for p, stall in zip(points, meta_model))
    saturated = tuple(p.nranks for p in points
                      if is_saturated(p.nranks, p.ops_per_rank, rtt, service, c_eff, whole))
    limited = tuple(p.nranks for p in points
                    if data_rate(p.nranks, agg, client)[1] == "B_agg / N" and p.bytes_per_rank > 0)
    has_meta = any(p.ops_per_rank > 0 and p.meta_s > 0 for p in points)
    fixed_drain = known.service_s is not None and (known.threads is not None
                                                   or layout in SHARED_INODE_LAYOUTS)
    return Fit(layout=layout, params=params, points=points, meta_model_s=meta_model,
               last_model_s=last_model, saturated=saturated, agg_limited=limited,
               stall_bound=has_meta and not saturated and not fixed_drain,
               agg_bound=agg_bound, client_bound=client_bound, notes=tuple(notes))


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


def _measured(column: str) -> Callable[[Point], float]:
    def value(point: Point) -> float:
        return float(getattr(point, column))
    return value


def project(points: Sequence[Point], layout: str, nranks: int, known: Known = Known(),
            per_rank_size: bool = False, bytes_per_rank: float | None = None) -> Projection:
    """Fit, predict at `nranks`, and the band (spread refits, leave-one-out)."""
    counts = sorted({p.nranks for p in points})
    if len(counts) < MIN_RANK_COUNTS:
        raise UsageError(f"layout {layout}: restore runs at {len(counts)} distinct rank count(s) "
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

    central = fit_points(points, layout, known)
    prediction = at(central)
    meta = (central.params.rtt_s, central.params.service_s, central.params.threads)
    others: list[Prediction] = []
    sources = []
    spread = [fit_points(points, layout, known, last=_measured(column), meta=meta)
              for column in ("last_min_s", "last_max_s")
              if all(math.isfinite(getattr(p, column)) for p in points)]
    if spread:
        others += [at(fit) for fit in spread]
        sources.append("refit on the min/max iteration")
    if len(counts) > MIN_RANK_COUNTS:
        others += [at(fit_points([p for p in points if p.nranks != dropped], layout, known))
                   for dropped in counts]
        sources.append("leave-one-out")
    totals = [prediction.total_s] + [p.total_s for p in others]
    stalls = [prediction.meta_s] + [p.meta_s for p in others]
    return Projection(fit=central, params=at_n(central), prediction=prediction,
                      band=(min(totals), max(totals)),
                      band_from=" + ".join(sources) or "none (no spread columns)",
                      meta_band=(min(stalls), max(stalls)))


# --- from archives ---------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    """One layout's restore runs of one configuration, a point per rank count."""

    layout: str
    points: tuple[Point, ...]
    context: str
    per_rank_size: bool
    notes: tuple[str, ...]


def _number(row: dict[str, str], column: str) -> float:
    try:
        return float(row.get(column) or "nan")
    except ValueError:
        return math.nan


def _point(row: dict[str, str], op_rows: dict[tuple[str, str, str], dict[str, str]],
           ops: Sequence[str]) -> Point:
    nranks = int(row["nranks"])
    iterations = _number(row, "iterations")
    iterations = iterations if math.isfinite(iterations) and iterations >= 1 else 1.0
    counts, stall = [], 0.0
    for op in ops:
        op_row = op_rows.get((row["run_id"], row["layout"], op))
        if op_row is None:
            continue
        count, p50 = _number(op_row, "count"), _number(op_row, "lat_p50_s")
        if not (math.isfinite(count) and math.isfinite(p50)) or count <= 0:
            continue
        per_iteration = count / iterations
        counts.append((op, per_iteration))
        stall += per_iteration / nranks * p50
    bytes_per_rank = _number(row, "bytes_per_rank")
    return Point(nranks=nranks, ops_per_rank=sum(c for _, c in counts) / nranks, meta_s=stall,
                 last_s=_number(row, "time_to_last_rank_s"),
                 bytes_per_rank=bytes_per_rank if math.isfinite(bytes_per_rank) else 0.0,
                 last_min_s=_number(row, "time_to_last_rank_min_s"),
                 last_max_s=_number(row, "time_to_last_rank_max_s"), op_counts=tuple(counts))


def series_from_rows(rows: Sequence[dict[str, str]], layouts: Sequence[str] = (),
                     ops: Sequence[str] = METADATA_OPS) -> list[Series]:
    """Per layout: the latest configuration's latest valid restore run at each rank count."""
    rows = sorted(rows, key=lambda row: row.get("timestamp", ""))   # stable: archive order
    restores = [row for row in rows if row.get("op") == "restore" and row.get("valid") == "true"
                and _number(row, "time_to_last_rank_s") > 0 and _number(row, "nranks") >= 1]
    present = list(dict.fromkeys(row["layout"] for row in restores))
    missing = [layout for layout in layouts if layout not in present]
    if missing:
        raise UsageError(f"--layout {','.join(missing)}: no valid restore run of it in the archives "
                         f"(they hold: {', '.join(present) or 'none'})")
    op_rows = {(row["run_id"], row["layout"], row["op"]): row for row in rows
               if row.get("op") in ops and row.get("valid") == "true"}
    result = []
    for layout in layouts or present:
        mine = [row for row in restores if row["layout"] == layout]
        config = tuple(mine[-1].get(column, "") for column in CONFIG_COLUMNS)
        same = [row for row in mine if tuple(row.get(c, "") for c in CONFIG_COLUMNS) == config]
        latest = {int(row["nranks"]): row for row in same}
        notes = []
        if len(same) < len(mine):
            notes.append(f"{len(mine) - len(same)} restore run(s) of another configuration left out "
                         "(the latest configuration is fitted)")
        if len(latest) < len(same):
            notes.append(f"{len(same) - len(latest)} earlier run(s) at a repeated rank count "
                         "superseded by the latest")
        chosen = [latest[n] for n in sorted(latest)]
        ref = chosen[-1]
        if ref.get("cache") == "warm":
            notes.append("cache warm: the runs may have read the page cache, so B_agg and "
                         "B_client are memory bandwidth, not storage")
        crowded = [row["nranks"] for row in chosen if "oversubscribed" in row.get("warnings", "")]
        if crowded:
            notes.append(f"oversubscribed at {', '.join(crowded)} rank(s): CPU contention is fitted "
                         "as if it were the storage's")
        context = (f"job {ref.get('job') or '?'}, {ref.get('backend') or '?'} on "
                   f"{ref.get('fs_type') or '?'}, cache {ref.get('cache') or '?'}, "
                   f"{ref.get('pattern') or '?'}, stat_count {ref.get('stat_count') or '?'}, "
                   f"open_count {ref.get('open_count') or '?'}")
        result.append(Series(layout=layout, points=tuple(_point(row, op_rows, ops) for row in chosen),
                             context=context, per_rank_size=bool(ref.get("size_per_rank_requested")),
                             notes=tuple(notes)))
    return result


# --- command ---------------------------------------------------------------------------


# --- rendering (plain text) ------------------------------------------------------------

def _gbps(rate: float) -> str:
    return "unlimited" if math.isinf(rate) else f"{rate / 1e9:.3g} GB/s"


def render(projections: Sequence[tuple[Series, Projection]], nranks: int,
           archives: Sequence[str], known: Known = Known()) -> str:
    from stampede.units import format_bytes, format_seconds

    lines = [f"stampede project: {len(projections)} layout(s) from {', '.join(archives)}, "
             f"projected to {nranks} ranks",
             "model: T_meta = max(k (RTT + s), RTT + s N k / c_eff)  (stampede project --help)",
             "       T_data = bytes_per_rank / min(B_agg / N, B_client, B_net);  time to last rank = "
             "T_meta + T_data", ""]
    given = [name for name, value in (("RTT", known.rtt_s), ("s", known.service_s),
                                      ("c", known.threads)) if value is not None]
    for series, projection in projections:
        fit, prediction = projection.fit, projection.prediction
        params = fit.params
        layout = series.layout
        shared = layout in SHARED_INODE_LAYOUTS
        threads = "1 (c_eff: one shared inode)" if shared else f"{params.threads:.3g}"
        lines.append(f"layout {layout}  [{series.context}]")
        lines.append(f"  fitted: RTT {format_seconds(params.rtt_s)}, s {format_seconds(params.service_s)}, "
                     f"c {threads}, B_agg {_gbps(params.agg_bps)}, B_client {_gbps(params.client_bps)}"
                     + (f"  (given: {', '.join(given)})" if given else ""))
        lines.append(f"  {'ranks':>7} {'k':>6} {'stall meas':>11} {'stall model':>12} "
                     f"{'last rank meas':>15} {'model':>10} {'residual':>9}")
        for point, stall, model, residual in zip(fit.points, fit.meta_model_s, fit.last_model_s,
                                                 fit.residuals):
            lines.append(f"  {point.nranks:>7} {point.ops_per_rank:>6.3g} "
                         f"{format_seconds(point.meta_s):>11} {format_seconds(stall):>12} "
                         f"{format_seconds(point.last_s):>15} {format_seconds(model):>10} "
                         f"{residual:>+9.1%}")
        rms = math.sqrt(sum(r * r for r in fit.residuals) / len(fit.residuals))
        lines.append(f"  residuals (measured - model) / measured: rms {rms:.1%}, "
                     f"max {max(abs(r) for r in fit.residuals):.1%}; metadata saturated at "
                     f"{', '.join(map(str, fit.saturated)) or 'no measured rank count'}; B_agg / N "
                     f"limits at {', '.join(map(str, fit.agg_limited)) or 'no measured rank count'}")
        bound = fit.stall_bound or fit.agg_bound
        low, high = projection.band
        lines.append(f"  at {nranks} ranks: time to last rank {format_seconds(prediction.total_s)}"
                     f"{' (upper bound)' if bound else ''}, band {format_seconds(low)} - "
                     f"{format_seconds(high)} ({projection.band_from})")
        meta_low, meta_high = projection.meta_band
        meta_band = (f", band {format_seconds(meta_low)} - {format_seconds(meta_high)}"
                     if meta_high > meta_low else "")
        k = projection.params.ops_per_rank
        burst = prediction.nranks * k
        lines.append(f"    metadata stall {format_seconds(prediction.meta_s)}"
                     f"{' (upper bound)' if fit.stall_bound else ''}{meta_band}: k = {k:.3g} "
                     f"op(s) per rank, a burst of {burst:.4g} ops, "
                     + ("more than the server keeps up with: drained c_eff ops per s"
                        if prediction.saturated else "within the server's capacity"))
        size = projection.params.bytes_per_rank
        lines.append(f"    data {format_seconds(prediction.data_s)}: {format_bytes(size)} per rank at "
                     f"{_gbps(prediction.rate_bps)}, limited by {prediction.limit}"
                     if size > 0 else "    data: no bytes")
        notes = list(series.notes) + list(fit.notes)
        if fit.stall_bound:
            notes.append("no measured rank count saturated the metadata server: s/c is bounded, not "
                         "fitted; the knee is put at the largest run (the most pessimistic fit)")
        elif len(fit.saturated) == 1 and known.threads is None and not shared:
            notes.append(f"the drain rate s/c rests on one saturated rank count ({fit.saturated[0]})")
        if fit.agg_bound:
            notes.append("no measured rank count reached the aggregate bandwidth: B_agg is a lower "
                         "bound (the largest run exactly at the limit)")
        if fit.client_bound:
            notes.append("every measured rank count was limited by B_agg / N: B_client is a lower "
                         "bound (it only matters below the measured rank counts)")
        if nranks <= max(p.nranks for p in fit.points):
            notes.append(f"{nranks} ranks is within the measured range: an interpolation")
        for note in notes:
            lines.append(f"  note: {note}")
        lines.append("")
    if len(projections) > 1:
        ranked = sorted(projections, key=lambda item: item[1].prediction.total_s)
        lines.append(f"ranked at {nranks} ranks: " + ", ".join(
            f"{series.layout} {format_seconds(projection.prediction.total_s)}"
            for series, projection in ranked))
    return "\n".join(lines) + "\n"
