"""The request-rate model (stampede.model.prefix_rate) on its virtual clock: cases worked
by hand, the failure after max_attempts, the scaled-down simulation against the whole one,
the fit recovering a rate from the counts it made, GCS's ramp, the K a layout needs; and
a restore's rows read back as its requests. No run, no wall clock."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from stampede.backends.s3retry import RetryPolicy
from stampede.model import prefix_rate
from stampede.model.prefix_rate import (
    Limit,
    Load,
    Observed,
    fit_read_rate,
    predict,
    run_loads,
    simulate,
    spread_needed,
)


class FixedBackoff:
    """A client that waits `wait_s` before every retry: backoffs worked by hand."""

    def __init__(self, wait_s: float, max_attempts: int = 10) -> None:
        self.wait_s, self.max_attempts = wait_s, max_attempts

    def before_request(self, now: float) -> float:
        return 0.0

    def after_failure(self, retry: int, throttling: bool, now: float,
                      draw: Callable[[], float]) -> float:
        return self.wait_s


def standard(attempts: int = 3) -> Callable[[], RetryPolicy]:
    return lambda: RetryPolicy("standard", attempts)


def test_under_the_rate_nothing_is_throttled_and_each_rank_takes_its_round_trips() -> None:
    # 4 ranks at 10 ms a request ask 400 a second of a partition serving 1,000 (burst 4)
    outcome = simulate(Load(4, 25, 0.010), Limit(1_000, 1_000, 4), lambda: FixedBackoff(1.0))
    assert outcome.throttles == 0 and outcome.failed == 0 and outcome.backoff_s == 0
    assert outcome.requests == 100
    assert outcome.last_rank_s == pytest.approx(25 * 0.010)


def test_a_case_worked_by_hand() -> None:
    # one rank, 1 token a second (burst 1), 0.1 s round trips, a fixed 0.5 s backoff:
    # t=0 admitted; t=0.1 denied (0.1 token); t=0.7 denied (0.7); t=1.3 admitted, answered 1.4
    outcome = simulate(Load(1, 2, 0.1), Limit(1.0, 1.0, 1.0), lambda: FixedBackoff(0.5))
    assert outcome.throttles == 2 and outcome.failed == 0
    assert outcome.backoff_s == pytest.approx(1.0)
    assert outcome.last_rank_s == pytest.approx(1.4)


def test_a_request_throttled_max_attempts_times_fails_and_its_rank_stops() -> None:
    # burst 1 and a rate too slow to refill in time: the second request is denied 3 times
    outcome = simulate(Load(1, 5, 0.1), Limit(1e-3, 1e-3, 1.0), lambda: FixedBackoff(0.5, 3))
    assert outcome.fails and outcome.failed == 1
    assert outcome.requests == 1 and outcome.throttles == 3
    assert outcome.backoff_s == pytest.approx(1.0)   # two retries, the third attempt the last


def test_lists_meet_their_own_bucket_first() -> None:
    # a LIST storm of 3 ranks against 1 LIST (burst 1) and plenty of reads: 2 LISTs denied
    outcome = simulate(Load(3, 2, 0.01, listers=3), Limit(1_000, 1e-6, 1.0),
                       lambda: FixedBackoff(0.5, 2))
    assert outcome.throttles == 4 and outcome.failed == 2


def test_a_store_that_counts_lists_as_reads_takes_their_tokens_from_the_reads() -> None:
    # 2 ranks, a LIST and a read each, 3 tokens in all (burst 3, no refill to speak of)
    apart = simulate(Load(2, 1, 0.01, listers=2), Limit(1e-6, 1e-6, 3.0),
                     lambda: FixedBackoff(0.5, 1))
    shared = simulate(Load(2, 1, 0.01, listers=2), Limit(1e-6, 1e-6, 3.0, lists_read=True),
                      lambda: FixedBackoff(0.5, 1))
    assert (apart.throttles, apart.requests) == (0, 4)
    assert (shared.throttles, shared.requests) == (1, 3)


def test_passes_carry_the_buckets_over_and_report_the_median_pass() -> None:
    one = simulate(Load(2, 5, 0.01), Limit(20, 20, 10), lambda: FixedBackoff(0.2))
    three = simulate(Load(2, 5, 0.01, passes=3), Limit(20, 20, 10), lambda: FixedBackoff(0.2))
    assert one.throttles == 0        # the burst covers the first pass
    assert three.throttles > 0       # not the next ones: the buckets are not refilled
    assert three.requests == one.requests == 10


def test_standard_backoff_is_deterministic_for_a_seed() -> None:
    load, limit = Load(8, 10, 0.005), Limit(40, 40, 10)
    assert simulate(load, limit, standard(10), seed=3) == simulate(load, limit, standard(10), seed=3)
    assert simulate(load, limit, standard(10), seed=3).throttles > 0


def test_the_scaled_down_simulation_agrees_with_the_whole_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    load, limit = Load(400, 10, 0.02), Limit(2_000, 2_000, 100)
    whole = predict(load, limit, standard(20))
    monkeypatch.setattr(prefix_rate, "MAX_SIMULATED_REQUESTS", 1_000)   # 4x scaled down
    monkeypatch.setattr(prefix_rate, "MIN_REPEATS_REQUESTS", 1)
    scaled = predict(load, limit, standard(20))
    assert whole.throttles > 500
    assert scaled.throttles == pytest.approx(whole.throttles, rel=0.15)
    assert scaled.last_rank_s == pytest.approx(whole.last_rank_s, rel=0.15)
    assert scaled.requests == pytest.approx(whole.requests)


def test_the_fit_recovers_the_rate_that_made_the_counts() -> None:
    policy = standard(10)
    loads = [Load(2, 10, 0.005, passes=4), Load(4, 10, 0.006, passes=4)]
    truth = Limit(40, 40, 10)
    counted = [round(predict(load, truth, policy).throttles * load.passes) for load in loads]
    rate = fit_read_rate([Observed(load, count) for load, count in zip(loads, counted,
                                                                        strict=True)], 10, policy)
    assert rate == pytest.approx(40, rel=0.1)
    with pytest.raises(ValueError, match="no 503"):
        fit_read_rate([Observed(loads[0], 0)], 10, policy)


def test_gcs_ramp_doubles_the_rate() -> None:
    # 100 s at 1 token a second, doubling every 100 s: 100 / ln 2 = 144 tokens, not 100
    steady, ramping = Limit(1.0, 1.0, 1e9), Limit(1.0, 1.0, 1e9, doubling_s=100.0)
    assert predict(Load(1, 200, 1.0), steady, standard()).throttles == 0   # the burst holds
    served = {}
    for name, limit in (("steady", steady), ("ramping", ramping)):
        bucket = prefix_rate._Bucket(limit.read_per_s, limit.burst, limit.doubling_s)
        bucket.tokens = 0.0
        bucket.take(100.0)
        served[name] = bucket.tokens + 1
    assert served["steady"] == pytest.approx(100)
    assert served["ramping"] == pytest.approx(100 / math.log(2))


def test_the_partitions_needed_spread_the_ranks_below_the_rate() -> None:
    # 1,024 ranks at 20 ms ask 51,200 requests a second; 5,500 a partition (1 s burst)
    def load_for(partitions: int) -> Load:
        return Load(math.ceil(1_024 / partitions), 20, 0.02)

    limit = Limit(5_500, 5_500, 5_500)
    needed = spread_needed(load_for, limit, standard(), 60.0, 1_024)
    assert needed is not None and 2 <= needed <= 16
    assert not predict(load_for(needed), limit, standard()).fails
    assert predict(load_for(1), limit, standard()).fails
    # one rank alone past the rate: no spread helps
    assert spread_needed(lambda k: Load(1, 10_000, 1e-5), Limit(10, 10, 1), standard(), 1.0,
                         4) is None


def _row(op: str, **cells: object) -> dict[str, object]:
    base: dict[str, object] = {"run_id": "r1", "layout": "sharded", "phase": "restore", "op": op,
                               "nranks": 4, "iterations": 3, "warmup": 1, "copies": 2,
                               "key_prefix": "none", "valid": True, "count": 0, "errors": 0,
                               "throttles": 0, "backoff_s": 0.0}
    return {**base, **cells}


def test_a_restores_rows_read_back_as_its_requests() -> None:
    rows = [_row("stat", count=12, lat_p50_s=0.001), _row("open", count=12, lat_p50_s=0.001),
            _row("read", count=96, throttles=30, backoff_s=8.0, lat_p50_s=0.004),
            _row("close", count=12), _row("list", count=3, lat_p50_s=0.002),
            _row("restore", count=12, time_to_last_rank_s=2.5)]
    (run,) = run_loads(rows)
    assert (run.nranks, run.passes, run.reads_per_rank, run.listers) == (4, 4, 10, 1)
    assert (run.copies, run.hashed, run.throttles) == (2, False, 30)
    # 30 503s over 4 ranks' 4 passes of 10.25 requests: the medians are admitted requests'
    assert run.latency_s == pytest.approx((24 * 0.001 + 96 * 0.004 + 3 * 0.002) / 123)
    assert run.load() == Load(2, 10, run.latency_s, 1, 4)   # copy 0: ranks 0 and 2
    # most requests throttled: 2.5 s less 0.5 s backing off (8 s over 16 rank-passes), over
    # the attempts (10 + 1/4 requests and 100 / 16 503s a rank and pass)
    rows[2] = {**rows[2], "throttles": 100}
    (throttled,) = run_loads(rows)
    assert throttled.latency_s == pytest.approx(2.0 / (10 + 1 / 4 + 100 / 16))
    assert not run_loads([_row("read", count=96), _row("restore", valid=False)])


# --- the save: writes against their own bucket -----------------------------------------


def test_a_saves_writes_worked_by_hand_meet_the_write_bucket_alone() -> None:
    # the hand-worked case above, the two requests writes: 1 write token a second
    limit = Limit(1e6, 1e6, 1.0, write_per_s=1.0)
    outcome = simulate(Load(1, 0, 0.1, writes_per_rank=2), limit, lambda: FixedBackoff(0.5))
    assert outcome.throttles == 2 and outcome.failed == 0
    assert outcome.backoff_s == pytest.approx(1.0)
    assert outcome.last_rank_s == pytest.approx(1.4)
    # the same two requests reads: the read bucket's million a second admits both
    reads = simulate(Load(1, 2, 0.1), limit, lambda: FixedBackoff(0.5))
    assert (reads.throttles, reads.requests) == (0, 2)
    assert Limit(10, 10).writes_per_s == 10   # no write rate given: the read's
    # a write bucket of 2 tokens (its own burst): both writes at once, none refused
    roomy = simulate(Load(1, 0, 0.1, writes_per_rank=2),
                     Limit(1e6, 1e6, 1.0, write_per_s=1.0, write_burst=2.0),
                     lambda: FixedBackoff(0.5))
    assert (roomy.throttles, roomy.requests) == (0, 2)
    assert roomy.last_rank_s == pytest.approx(0.2)


def test_lone_writes_go_round_robin_from_rank_0_after_a_ranks_own() -> None:
    load = Load(3, 2, 0.01, listers=1, writes_per_rank=4, lone_writes=4)
    assert load.requests_of(0) == [("list", 1), ("write", 4), ("read", 2), ("write", 2)]
    assert load.requests_of(1) == [("write", 4), ("read", 2), ("write", 1)]
    assert load.requests_of(2) == [("write", 4), ("read", 2), ("write", 1)]
    assert load.requests == 1 + 3 * 6 + 4
    # 2 ranks' uploads take the burst of 2 write tokens (no refill to speak of), their
    # validation reads are free, rank 0's publish then meets 2 503s and fails
    outcome = simulate(Load(2, 2, 0.01, writes_per_rank=1, lone_writes=1),
                       Limit(1e6, 1e6, 2.0, write_per_s=1e-6), lambda: FixedBackoff(0.5, 2))
    assert (outcome.requests, outcome.throttles, outcome.failed) == (6, 2, 1)


def test_the_partitions_a_save_needs_follow_its_write_rate() -> None:
    # 1,024 ranks, 4 writes each at 20 ms: 204,800 writes a second asked; reads plenty
    def load_for(partitions: int) -> Load:
        return Load(math.ceil(1_024 / partitions), 0, 0.02, writes_per_rank=4, lone_writes=1)

    roomy_writes = Limit(100, 100, 100, write_per_s=1e6)
    assert spread_needed(load_for, roomy_writes, standard(), 60.0, 1_024) == 1
    tight = Limit(1e6, 1e6, 100, write_per_s=100)
    needed = spread_needed(load_for, tight, standard(), 1.0, 1_024)
    # at least the writes over what a partition serves in the target (4,097 over its
    # burst of 100 and 100 more in the second)
    assert needed is not None and needed >= 21
    met = predict(load_for(needed), tight, standard())
    assert not met.fails and met.last_rank_s <= 1.0
    half = predict(load_for(needed // 2), tight, standard())
    assert half.fails or half.last_rank_s > 1.0


def _save_row(op: str, **cells: object) -> dict[str, object]:
    return _row(op, phase="save", nranks=2, iterations=2, copies=1, block_bytes=2**20, **cells)


def test_a_saves_rows_read_back_as_its_requests() -> None:
    # 2 ranks, 2 measured saves and a warmup, a 10 MiB shard each in two 5 MiB parts,
    # validated in 1 MiB blocks; rank 0 publishes each save, the last releases 2 objects
    rows = [_save_row("create", count=4, throttles=5, backoff_s=2.5, lat_p50_s=0.02),
            _save_row("write", count=8, op_bytes=40 * 2**20, throttles=4, lat_p50_s=0.1),
            _save_row("fsync", count=4, throttles=4, lat_p50_s=0.03),
            _save_row("validate", count=4, op_bytes=40 * 2**20, lat_p50_s=0.15),
            _save_row("publish", count=2, lat_p50_s=0.004),
            _save_row("unlink", count=2, lat_p50_s=0.003),
            _save_row("save", count=4, time_to_last_rank_s=2.0),
            _row("read", count=96), _row("restore", count=12, time_to_last_rank_s=1.0)]
    (run,) = run_loads(rows, "save")
    assert (run.phase, run.nranks, run.passes, run.throttles) == ("save", 2, 3, 13)
    assert (run.writes_per_rank, run.parts_per_rank, run.part_bytes) == (4, 2, 5 * 2**20)
    assert (run.reads_per_rank, run.gets_per_rank) == (1 + 10, 10)   # a HEAD, 10 GETs
    assert (run.publishes, run.deletes_per_rank) == (1, 0.5)
    # the writes' medians, weighted by their counts (the validate op is a whole extent's)
    assert run.latency_s == pytest.approx((4 * 0.02 + 8 * 0.1 + 4 * 0.03 + 2 * 0.004
                                           + 2 * 0.003) / 20)
    assert run.load() == Load(2, 11, run.latency_s, 0, 3, writes_per_rank=4, lone_writes=2)
    assert run.writes_for(20 * 2**20) == 4 - 2 + 4
    assert (run.lone_for(16_384), run.lone_for(1, hashed=True)) == (1 + 8_192, 0)
    (restore,) = run_loads(rows)
    assert restore.phase == "restore" and restore.writes_per_rank == 0
