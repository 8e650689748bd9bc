"""The object store's request-rate rule (stampede.emulate.throttle) on a virtual clock:
exact admit and deny counts, Retry-After, and the split of a hot prefix."""

from __future__ import annotations

import pytest

from stampede.emulate.throttle import Throttle, TokenBucket, request_kind

RATES = {"read": 8.0, "write": 4.0, "list": 2.0}
TICK_S = 1 / 64     # times and rates in powers of two: exact in floating point


def test_a_full_bucket_admits_its_burst_then_one_per_token() -> None:
    bucket = TokenBucket(rate_per_s=8.0, burst=3.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == 0.125                   # the next token is due in 1/rate
    assert bucket.take(0.0625) == 0.0625               # half of it has come
    assert bucket.take(0.125) == 0.0
    assert bucket.take(10.0) == 0.0                    # refilled, but only to the burst
    assert [bucket.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.125]


def test_kinds() -> None:
    assert [request_kind(m, k) for m, k in (("GET", "a/b"), ("HEAD", "a"), ("GET", ""),
                                            ("PUT", "a"), ("POST", "a"), ("DELETE", "a"))] \
        == ["read", "read", "list", "write", "write", "write"]


def test_each_kind_has_its_own_bucket_per_partition() -> None:
    throttle = Throttle(RATES, burst=2.0, split_delay_s=float("inf"))
    admitted = {kind: 0 for kind in RATES}
    for method, key, kind in (("GET", "k", "read"), ("PUT", "k", "write"), ("GET", "", "list")):
        for _ in range(5):
            admitted[kind] += throttle.decide(method, "b", key, 0.0).admitted
    assert admitted == {"read": 2, "write": 2, "list": 2}
    # another bucket of the store is another partition, with full buckets
    assert throttle.decide("GET", "other", "k", 0.0).admitted


def test_a_steady_overload_is_admitted_at_the_rate() -> None:
    throttle = Throttle(RATES, burst=1.0, split_delay_s=float("inf"))
    # 64 GETs a second for 2 s against 8/s: the first, then one per 1/8 s
    verdicts = [throttle.decide("GET", "b", "x", i * TICK_S).admitted for i in range(128)]
    assert sum(verdicts) == 16 and verdicts[::8] == [True] * 16
    denied = throttle.decide("GET", "b", "x", 127 * TICK_S)
    assert denied.partition == "b/" and denied.kind == "read"
    assert not denied.admitted and denied.retry_after_header() == "1"


def test_a_partition_throttled_longer_than_the_delay_splits_by_the_next_character() -> None:
    throttle = Throttle(RATES, burst=1.0, split_delay_s=1.0)
    keys = ["a1", "b1"]
    verdicts: list[tuple[float, str, bool]] = []
    for i in range(128):   # 64 GETs a second, alternating two keys, for 2 s
        now = i * TICK_S
        decision = throttle.decide("GET", "b", keys[i % 2], now)
        verdicts.append((now, decision.partition, decision.admitted))
    # throttled from the second request (1/64 s); the first denial 1 s after that splits:
    # 64/64 s is admitted (a token every 8 ticks), 65/64 s denied
    assert throttle.splits == [(65 * TICK_S, "b/")]
    assert throttle.partition_of("b", "a1") == "b/a" and throttle.partition_of("b", "") == "b/"
    before, after = verdicts[:66], verdicts[66:]
    assert {p for _, p, _ in before} == {"b/"} and {p for _, p, _ in after} == {"b/a", "b/b"}
    assert sum(a for _, _, a in before) == 9     # 0, 8, ..., 64 ticks
    # then each child has 8/s of its own (the first at once): twice the rate in all;
    # the children are throttled too, but not yet for 1 s
    assert sum(a for _, p, a in after if p == "b/a") == 8    # ticks 66, 74, ..., 122
    assert sum(a for _, p, a in after if p == "b/b") == 8    # ticks 67, 75, ..., 123


def test_a_quiet_spell_restarts_the_hot_clock() -> None:
    throttle = Throttle(RATES, burst=1.0, split_delay_s=1.0)
    for start in (0.0, 2.0, 4.0):   # 0.9 s bursts of overload, 1.1 s quiet between
        for i in range(58):
            throttle.decide("GET", "b", "k", start + i * TICK_S)
    assert throttle.splits == []


def test_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="rate for list"):
        Throttle({"read": 1.0, "write": 1.0, "list": 0.0})


def test_a_prefix_partitioned_ahead_gives_each_next_character_its_own_budget() -> None:
    throttle = Throttle(RATES, burst=1.0, split_delay_s=float("inf"))
    throttle.partitioned("b", "ck/copy-")
    assert throttle.splits == []   # no hot spell split it
    assert [throttle.partition_of("b", key) for key in
            ("ck/copy-0/s.raw", "ck/copy-1/s.raw", "ck/other", "dk", "")] == [
        "b/ck/copy-0", "b/ck/copy-1", "b/ck/o", "b/d", "b/"]
    assert throttle.partition_of("other-bucket", "ck/copy-0/s.raw") == "other-bucket/"
    # one token each at the same instant: each partition admits its own, once
    verdicts = [throttle.decide("GET", "b", f"ck/copy-{copy}/s.raw", 0.0).admitted
                for copy in (0, 1, 0, 1)]
    assert verdicts == [True, True, False, False]


def test_a_list_counts_against_its_prefix_partition() -> None:
    throttle = Throttle(RATES, burst=1.0, split_delay_s=float("inf"))
    throttle.partitioned("b", "ck/copy-")
    first = throttle.decide("GET", "b", "", 0.0, list_prefix="ck/copy-0/sharded/")
    other = throttle.decide("GET", "b", "", 0.0, list_prefix="ck/copy-1/sharded/")
    again = throttle.decide("GET", "b", "", 0.0, list_prefix="ck/copy-0/sharded/")
    assert (first.kind, first.partition, first.admitted) == ("list", "b/ck/copy-0", True)
    assert (other.partition, other.admitted) == ("b/ck/copy-1", True)
    assert (again.partition, again.admitted) == ("b/ck/copy-0", False)
    assert throttle.decide("GET", "b", "", 0.0).partition == "b/"   # no prefix: the bucket's
