"""An object store's request-rate limit at scale, pure: the 503 SlowDown count, the time
spent backing off and the time to last rank of a restore (or a save) whose requests meet a
limit per partition (an S3 prefix, a directory bucket, a GCS bucket), simulated request by request
on a virtual clock, and the rate fitted to runs that met one.

The service (what stampede.emulate.throttle does and S3 documents):

  limit    a token bucket per partition and kind (read: GET/HEAD; write: PUT/POST/DELETE;
           list): `rate_per_s`
           tokens a second, at most `burst` held, full at the start; a request takes one
           or is denied (503). GCS's rate grows, doubling every `doubling_s` (its
           autoscaling); S3 partitions a hot prefix only after minutes, so a partition here
           never splits: the rates are those of prefixes S3 has already partitioned
  ranks    each sends its requests one after another (its LIST, its writes, its reads, then
           its share of the lone writes: a save's publish and releases), a closed loop: an
           answer, admitted or 503, comes `latency_s` after the request
  client   a 503 is retried up to max_attempts in all, after the wait the retry policy
           says (stampede.backends.s3retry's: standard is full jitter, min(2^(n-1) s, 20 s)
           before retry n; adaptive adds its client-side limiter's waits), drawn from a
           seeded random source; a request 503'd max_attempts times fails the restore
  passes   a run's passes (warmup and measured iterations) one after another, each
           starting when the last rank ended the one before, the buckets carried over

What the model is handed (a Load) is one partition's: with K copies under K prefixes the
busiest holds ceil(N / K) ranks' requests, with hashed keys one shard's, with one rank
listing (list-bcast) one LIST; a save's are its ranks' writes (uploads begun, parts or
PUTs, uploads completed), its validation's reads and its lone writes (the pointer's
publish, the released version's DELETEs). Large loads are simulated scaled down: N ranks
at rate R and burst B behave as N/m ranks at R/m and B/m (each rank's requests, latency and backoff
the same), the counts multiplied back by m, so that one prediction simulates at most
MAX_SIMULATED_REQUESTS requests. Small ones are repeated with other seeds and averaged
(the draws of a few ranks' backoffs scatter).

The rate is fitted by bisection: the rate (of every kind alike: a restore's reads and
LISTs, a save's writes) at which the simulation of the archived runs gives the 503s they
counted (the count falls as the rate grows).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

MAX_SIMULATED_REQUESTS = 10_000   # per prediction, scaled down past it
MIN_REPEATS_REQUESTS = 20_000     # small loads repeated until they simulate this many
MAX_REPEATS = 40
FIT_RANGE_PER_S = (1e-3, 1e8)     # where the fitted rate is looked for
FIT_STEPS = 40                    # bisection steps, on a log scale
SPREAD_PRECISION = 50             # partitions needed to within 1 in this many (2%)


class Policy(Protocol):
    """A client's retry policy (stampede.backends.s3retry.RetryPolicy): what the model
    asks of it, on its own clock and draws."""

    max_attempts: int

    def before_request(self, now: float) -> float: ...

    def after_failure(self, retry: int, throttling: bool, now: float,
                      draw: Callable[[], float]) -> float: ...


PolicyFactory = Callable[[], Policy]   # one policy per rank, as each rank has its client


@dataclass(frozen=True)
class Limit:
    """A partition's rates (requests a second) and burst; GCS's ramp (doubling_s)."""

    read_per_s: float
    list_per_s: float
    burst: float = 1.0
    doubling_s: float = math.inf
    lists_read: bool = False       # a LIST takes a read's token (GCS counts it a read)
    write_per_s: float | None = None   # PUT/POST/DELETE; None: as read_per_s
    write_burst: float | None = None   # the write bucket's; None: burst (emulate-s3's one)

    def __post_init__(self) -> None:
        if not (self.read_per_s > 0 and self.list_per_s > 0 and self.burst >= 1
                and self.doubling_s > 0 and self.writes_per_s > 0 and self.writes_burst >= 1):
            raise ValueError(f"{self}: rates above 0, burst at least 1, doubling above 0")

    @property
    def writes_per_s(self) -> float:
        return self.read_per_s if self.write_per_s is None else self.write_per_s

    @property
    def writes_burst(self) -> float:
        return self.burst if self.write_burst is None else self.write_burst


@dataclass(frozen=True)
class Load:
    """What one partition is asked per pass: `ranks` ranks each sending `writes_per_rank`
    writes and `reads_per_rank` reads, the first `listers` of them a LIST each first, and
    `lone_writes` more writes dealt to the ranks round-robin from rank 0, last (a save's
    publish and the DELETEs of the version it releases); each answered after latency_s."""

    ranks: int
    reads_per_rank: int
    latency_s: float
    listers: int = 0
    passes: int = 1
    writes_per_rank: int = 0
    lone_writes: int = 0

    @property
    def requests(self) -> int:
        return (self.ranks * (self.reads_per_rank + self.writes_per_rank) + self.listers
                + self.lone_writes) * self.passes

    def scaled(self, factor: int) -> Load:
        return replace(self, ranks=max(1, self.ranks // factor),
                       listers=math.ceil(self.listers / factor),
                       lone_writes=math.ceil(self.lone_writes / factor))

    def requests_of(self, rank: int) -> list[tuple[str, int]]:
        """A rank's requests per pass in the order it sends them: (kind, how many)."""
        lone = self.lone_writes // self.ranks + int(rank < self.lone_writes % self.ranks)
        return [(kind, count) for kind, count in (
            ("list", int(rank < self.listers)), ("write", self.writes_per_rank),
            ("read", self.reads_per_rank), ("write", lone)) if count]


@dataclass(frozen=True)
class Outcome:
    """What a load met: per pass, over all its ranks (means over the repeats)."""

    throttles: float        # 503 answers
    backoff_s: float        # seconds waited before retries (and adaptive's tokens), summed
    last_rank_s: float      # time to last rank: the slowest rank's last answer
    failed: float           # requests that met max_attempts 503s (the restore fails)
    requests: float         # admitted

    @property
    def fails(self) -> bool:
        return self.failed > 0


class _Bucket:
    """A token bucket whose rate may double every `doubling_s` (virtual time)."""

    def __init__(self, rate_per_s: float, burst: float, doubling_s: float) -> None:
        self.rate_per_s, self.burst, self.doubling_s = rate_per_s, burst, doubling_s
        self.tokens, self.updated_s = burst, 0.0

    def _gained(self, since_s: float, now: float) -> float:
        if math.isinf(self.doubling_s):
            return (now - since_s) * self.rate_per_s
        scale = self.doubling_s / math.log(2)
        return self.rate_per_s * scale * (2 ** (now / self.doubling_s) -
                                          2 ** (since_s / self.doubling_s))

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + self._gained(self.updated_s, now))
        self.updated_s = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def simulate(load: Load, limit: Limit, policy: PolicyFactory, seed: int = 0) -> Outcome:
    """One run of `load` against `limit`, every request an event on a virtual clock;
    ties go in rank order. Deterministic for a seed."""
    draw = random.Random(seed).random
    reads = _Bucket(limit.read_per_s, limit.burst, limit.doubling_s)
    buckets = {"read": reads, "list": reads if limit.lists_read else
               _Bucket(limit.list_per_s, limit.burst, limit.doubling_s),
               "write": _Bucket(limit.writes_per_s, limit.writes_burst, limit.doubling_s)}
    throttles = failed = admitted = 0
    backoff_s = 0.0
    lasts: list[float] = []
    start_s = 0.0
    for _ in range(load.passes):
        policies = [policy() for _ in range(load.ranks)]
        # each rank's requests left, the next last (Load.requests_of's order, reversed)
        left = [[kind for kind, count in reversed(load.requests_of(rank)) for _ in range(count)]
                for rank in range(load.ranks)]
        done_s = [start_s] * load.ranks
        retry = [0] * load.ranks
        # (when the rank sends, rank, whether the policy's pre-send wait is behind it)
        events = [(start_s, rank, False) for rank in range(load.ranks) if left[rank]]
        heapq.heapify(events)
        while events:
            now, rank, waited = heapq.heappop(events)
            if not waited:
                wait = policies[rank].before_request(now)
                if wait > 0:
                    backoff_s += wait
                    heapq.heappush(events, (now + wait, rank, True))
                    continue
            answered = now + load.latency_s
            if buckets[left[rank][-1]].take(now):
                admitted += 1
                left[rank].pop()
                retry[rank] = 0
                done_s[rank] = answered
                if left[rank]:
                    heapq.heappush(events, (answered, rank, False))
                continue
            throttles += 1
            retry[rank] += 1
            if retry[rank] >= policies[rank].max_attempts:
                failed += 1
                done_s[rank] = answered
                continue   # the rank's restore fails: it sends nothing more
            wait = policies[rank].after_failure(retry[rank], True, answered, draw)
            backoff_s += wait
            heapq.heappush(events, (answered + wait, rank, False))
        end_s = max(done_s, default=start_s)
        lasts.append(end_s - start_s)
        start_s = end_s
    passes = load.passes
    return Outcome(throttles / passes, backoff_s / passes, statistics.median(lasts),
                   failed / passes, admitted / passes)


def predict(load: Load, limit: Limit, policy: PolicyFactory, seed: int = 0) -> Outcome:
    """`simulate`, scaled down past MAX_SIMULATED_REQUESTS (counts multiplied back) and
    repeated with seeds seed, seed + 1, ... while small (means)."""
    factor = max(1, min(load.ranks, math.ceil(load.requests / MAX_SIMULATED_REQUESTS)))
    small = load.scaled(factor)
    multiple = load.ranks / small.ranks
    # the LISTs of one rank (list-bcast) are not scaled down, nor then is their rate
    at = replace(limit, read_per_s=limit.read_per_s / multiple,
                 write_per_s=limit.writes_per_s / multiple,
                 list_per_s=limit.list_per_s * (small.listers / load.listers if load.listers
                                                else 1.0),
                 burst=max(1.0, limit.burst / multiple),
                 write_burst=max(1.0, limit.writes_burst / multiple))
    repeats = max(1, min(MAX_REPEATS, MIN_REPEATS_REQUESTS // max(1, small.requests)))
    runs = [simulate(small, at, policy, seed + repeat) for repeat in range(repeats)]

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    return Outcome(throttles=mean([run.throttles for run in runs]) * multiple,
                   backoff_s=mean([run.backoff_s for run in runs]) * multiple,
                   last_rank_s=mean([run.last_rank_s for run in runs]),
                   failed=mean([run.failed for run in runs]) * multiple,
                   requests=mean([run.requests for run in runs]) * multiple)


@dataclass(frozen=True)
class Observed:
    """A run that met the limit: its load (passes included) and what it counted: 503s
    over all its passes and ranks."""

    load: Load
    throttles: int
    policy: PolicyFactory | None = None   # its clients' (else the fit's)


def fit_read_rate(observed: Sequence[Observed], burst: float, policy: PolicyFactory,
                  list_per_s: float | None = None) -> float:
    """The read rate per partition at which the simulation of `observed` gives as many
    503s in all as they counted; the LIST rate the same unless given, the write rate the
    same (a save's 503s fit it). ValueError when no run was throttled (a rate above what
    they asked: nothing to fit)."""
    counted = sum(item.throttles for item in observed)
    if not counted:
        raise ValueError("no 503 in the runs: the limit was never met, nothing to fit")

    def throttles_at(rate_per_s: float) -> float:
        limit = Limit(rate_per_s, list_per_s or rate_per_s, burst)
        return sum(predict(item.load, limit, item.policy or policy).throttles * item.load.passes
                   for item in observed)

    low, high = (math.log(edge) for edge in FIT_RANGE_PER_S)
    for _ in range(FIT_STEPS):
        middle = (low + high) / 2
        if throttles_at(math.exp(middle)) > counted:
            low = middle
        else:
            high = middle
    return math.exp((low + high) / 2)


def spread_needed(load_for: Callable[[int], Load], limit: Limit, policy: PolicyFactory,
                  target_s: float, most: int) -> int | None:
    """The fewest partitions K (copies under K prefixes, or K buckets) whose busiest one,
    `load_for(K)`, restores within `target_s` with no request failed; None when `most`
    do not. Doubles K from the closed form's floor (the partition's requests over its
    rate in target_s), then bisects back, to within 1 in SPREAD_PRECISION (an answer never
    below the fewest that meet it)."""
    def meets(count: int) -> bool:
        outcome = predict(load_for(count), limit, policy)
        return not outcome.fails and outcome.last_rank_s <= target_s

    whole = load_for(1)
    writes = whole.ranks * whole.writes_per_rank + whole.lone_writes
    floor = math.ceil(max((whole.requests / whole.passes - writes) / limit.read_per_s,
                          writes / limit.writes_per_s) / target_s)
    count = max(1, min(most, floor))
    below = count // 2 if count > 1 else 0
    while not meets(count):
        if count >= most:
            return None
        below, count = count, min(most, count * 2)
    while count - below > max(1, count // SPREAD_PRECISION):
        middle = (below + count) // 2
        if meets(middle):
            count = middle
        else:
            below = middle
    return count


# --- from an archive's rows -------------------------------------------------------------

REQUEST_OPS = ("stat", "open", "read")   # a HEAD, a HEAD, a ranged GET each (list apart)
# a save's rank's writes: CreateMultipartUpload (create), a part or the object's one PUT
# (write), CompleteMultipartUpload (fsync); its lone writes: the pointer's conditional PUT
# (publish, rank 0) and the released version's DELETEs (unlink)
SAVE_WRITE_OPS = ("create", "write", "fsync")
SAVE_LONE_OPS = ("publish", "unlink")


@dataclass(frozen=True)
class RunLoad:
    """One archived restore of one layout, as the requests it sent: per rank and pass its
    reads and LISTs, the ranks that listed, its keys' spread (copies, hashed), its 503s,
    and an admitted request's round trip."""

    layout: str
    nranks: int
    passes: int                # warmup + measured iterations: all met the limit
    reads_per_rank: int
    listers: int               # ranks that LIST each pass (every rank: a LIST storm)
    copies: int
    hashed: bool
    throttles: int             # over all passes and ranks
    backoff_s: float
    last_rank_s: float         # per pass (the median over the measured ones)
    latency_s: float
    gets_per_rank: int = 0     # of reads_per_rank, the ranged GETs of its bytes
    block_bytes: int = 0       # one GET's
    run_id: str = ""
    phase: str = "restore"
    writes_per_rank: int = 0   # a save's: its uploads' requests (SAVE_WRITE_OPS)
    publishes: int = 0         # a save's per pass: the pointer's PUT (rank 0's)
    deletes_per_rank: float = 0.0   # a save's per rank and pass: its releases' DELETEs
    parts_per_rank: int = 0    # of writes_per_rank, those carrying its bytes
    part_bytes: int = 0        # one part's (or one PUT's)

    def reads_for(self, bytes_per_rank: float | None) -> int:
        """A rank's reads when it restores `bytes_per_rank` (None: as the run did) in the
        run's blocks: its HEADs as they were, a GET a block."""
        if bytes_per_rank is None or self.block_bytes <= 0:
            return self.reads_per_rank
        return self.reads_per_rank - self.gets_per_rank + \
            max(1, math.ceil(bytes_per_rank / self.block_bytes))

    def writes_for(self, bytes_per_rank: float | None) -> int:
        """A save's rank's writes when it saves `bytes_per_rank` in the run's parts."""
        if bytes_per_rank is None or self.part_bytes <= 0:
            return self.writes_per_rank
        return self.writes_per_rank - self.parts_per_rank + \
            max(1, math.ceil(bytes_per_rank / self.part_bytes))

    def lone_for(self, ranks: int, hashed: bool = False) -> int:
        """A save's lone writes per pass on a partition holding `ranks` ranks' keys: their
        releases' DELETEs, and rank 0's publish unless its keys are hashed (the pointer
        is under the version's prefix, not a shard's)."""
        return (0 if hashed else self.publishes) + round(self.deletes_per_rank * ranks)

    def load(self) -> Load:
        """Its busiest partition's load: the ranks of one copy (round-robin), with hashed
        keys one rank's shard (the copies and hashed prefixes partitioned apart)."""
        ranks = 1 if self.hashed else math.ceil(self.nranks / self.copies)
        return Load(ranks, self.reads_per_rank, self.latency_s,
                    min(ranks, self.listers), self.passes, self.writes_per_rank,
                    self.lone_for(ranks, self.hashed))

    def observed(self, policy: PolicyFactory | None = None) -> Observed:
        """Its busiest partition's load and 503s: its ranks' share of the run's (the
        archive counts them over all partitions); `policy`: its clients' retries."""
        load = self.load()
        return Observed(load, round(self.throttles * load.ranks / self.nranks), policy)


def run_loads(rows: Sequence[dict[str, object]], phase: str = "restore") -> list[RunLoad]:
    """Each valid restore (or save) run of the rows (a row per op, the `restore` or `save`
    row's time to last rank), in the archive's order."""
    by_run: dict[tuple[object, object], dict[str, dict[str, object]]] = {}
    for row in rows:
        if (row.get("phase") or "restore") == phase:
            by_run.setdefault((row.get("run_id"), row.get("layout")), {})[str(row["op"])] = row
    if phase == "save":
        return [load for (run_id, layout), ops in by_run.items()
                if (load := _save_load(str(run_id or ""), str(layout), ops)) is not None]
    found = []
    for (run_id, layout), ops in by_run.items():
        restore = ops.get("restore")
        if restore is None or not restore.get("valid") or "read" not in ops:
            continue
        nranks, measured = int(_num(restore, "nranks")), max(1, int(_num(restore, "iterations")))
        passes = measured + int(_num(restore, "warmup"))
        reads = round(sum(_done(ops, op) for op in REQUEST_OPS) / (nranks * measured))
        gets = round(_done(ops, "read") / (nranks * measured))
        listers = round(_done(ops, "list") / measured)
        throttles = round(sum(_num(row, "throttles") for row in ops.values()))
        backoff_s = sum(_num(row, "backoff_s") for row in ops.values())
        last_s = _num(restore, "time_to_last_rank_s")
        latency_s = _round_trip_s(ops, reads, listers / nranks, throttles / (nranks * passes),
                                  last_s - backoff_s / (nranks * passes))
        found.append(RunLoad(str(layout), nranks, passes, reads, listers,
                             max(1, int(_num(restore, "copies") or 1)),
                             restore.get("key_prefix") == "hash", throttles, backoff_s,
                             last_s, latency_s, gets, int(_num(restore, "block_bytes")),
                             str(run_id or "")))
    return found


def _save_load(run_id: str, layout: str, ops: dict[str, dict[str, object]]) -> RunLoad | None:
    """A valid save run's requests: per rank and pass its uploads' writes and its
    validation's reads (a HEAD and a GET a block), per pass the lone writes."""
    save = ops.get("save")
    if save is None or not save.get("valid") or "write" not in ops:
        return None
    nranks, measured = int(_num(save, "nranks")), max(1, int(_num(save, "iterations")))
    passes = measured + int(_num(save, "warmup"))
    rank_passes = nranks * measured
    writes = round(sum(_done(ops, op) for op in SAVE_WRITE_OPS) / rank_passes)
    parts = round(_done(ops, "write") / rank_passes)
    part_bytes = round(_num(ops["write"], "op_bytes") / max(1.0, _num(ops["write"], "count")))
    block_bytes = int(_num(save, "block_bytes"))
    validate = ops.get("validate", {})
    gets = round(math.ceil(_num(validate, "op_bytes") / block_bytes) / rank_passes) \
        if block_bytes > 0 else 0
    reads = round(_done(ops, "validate") / rank_passes) + gets
    publishes = round(_done(ops, "publish") / measured)
    deletes = _done(ops, "unlink") / rank_passes
    throttles = round(sum(_num(row, "throttles") for row in ops.values()))
    backoff_s = sum(_num(row, "backoff_s") for row in ops.values())
    last_s = _num(save, "time_to_last_rank_s")
    latency_s = _round_trip_s(ops, writes + reads + publishes / nranks + deletes, 0.0,
                              throttles / (nranks * passes),
                              last_s - backoff_s / (nranks * passes),
                              (*SAVE_WRITE_OPS, *SAVE_LONE_OPS))
    return RunLoad(layout, nranks, passes, reads, 0, 1, save.get("key_prefix") == "hash",
                   throttles, backoff_s, last_s, latency_s, gets, block_bytes, run_id,
                   "save", writes, publishes, deletes, parts, part_bytes)


def _done(ops: dict[str, dict[str, object]], op: str) -> float:
    """An op's requests over all ranks and measured passes: successes and failures."""
    row = ops.get(op, {})
    return _num(row, "count") + _num(row, "errors")


def _round_trip_s(ops: dict[str, dict[str, object]], reads: float, lists: float,
                  throttles: float, busy_s: float,
                  request_ops: tuple[str, ...] = (*REQUEST_OPS, "list")) -> float:
    """An admitted request's round trip: the requests' median latencies (weighted by their
    counts) while fewer than half of them were throttled (the median is then one that
    was not); else the run's time less its mean backoff over its attempts (an upper
    bound: the last rank backed off more than the mean). A save's: its writes' (its
    validation's op is a whole extent's GETs, not one request)."""
    counted = [(_num(ops[op], "count"), _num(ops[op], "lat_p50_s"))
               for op in request_ops if op in ops]
    total = sum(count for count, _ in counted)
    if total and throttles < (reads + lists) / 2:
        return sum(count * p50 for count, p50 in counted) / total
    return max(busy_s, 0.0) / max(reads + lists + throttles, 1.0)


def _num(row: dict[str, object], column: str) -> float:
    value = row.get(column)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0
