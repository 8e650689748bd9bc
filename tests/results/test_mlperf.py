"""MLPerf's metrics and rules from measured facts (pure): DLIO's mean of rates against
the throughput, the cache rule with residency measured before each read, the 30 s gap,
the rank shift, and what makes a run not comparable."""

from fractions import Fraction

import pytest

from stampede.results.mlperf import (
    GB,
    Phase,
    cache_rule,
    comparability,
    gap_rule,
    phase_metrics,
    rank_shift_rule,
    summary,
)


def test_mean_of_rates_against_the_slowest_ranks_throughput():
    # a 2 GB checkpoint in 1 s, then in 3 s: DLIO's mean of rates (2 + 2/3) / 2 = 1.33,
    # MLPerf's throughput 2 GB over the mean duration of 2 s = 1.0
    phase = Phase(durations_s=(1.0, 3.0), per_rank_s=(0.5, 2.0), rank_bytes=(GB, GB))
    metric = phase_metrics(phase, "save")
    assert metric["save_checkpoint_io_mean_GB_per_second"] == pytest.approx(4 / 3)
    assert metric["save_checkpoint_throughput_GB_per_second"] == pytest.approx(1.0)
    assert metric["save_checkpoint_duration_mean_seconds"] == pytest.approx(2.0)
    assert metric["save_checkpoint_duration_stdev_seconds"] == pytest.approx(1.0)
    assert metric["save_checkpoint_slowest_rank_GB_per_second"] == pytest.approx(0.5)


def test_cache_rule_reads_the_measured_residency():
    memory = {"a": 10 * GB, "b": 10 * GB}
    big = cache_rule({"a": 30 * GB, "b": 31 * GB}, memory, [0.9])
    assert big.ok                                   # 3x RAM written: the cache may stay
    broken = cache_rule({"a": 2 * GB, "b": 31 * GB}, memory, [0.0, 0.25, 0.0])
    assert not broken.ok and "25.0%" in broken.detail and "before read 2" in broken.detail
    assert "a wrote less than 3x" in broken.detail
    assert cache_rule({"a": 2 * GB}, memory, [0.001, 0.0]).ok
    assert not cache_rule({"a": 2 * GB}, memory, []).ok   # not measured: not assumed


def test_gap_and_rank_shift():
    assert gap_rule(29.9).ok and not gap_rule(30.5).ok
    assert "30.5 s" in gap_rule(30.5).detail
    two_hosts = ("a",) * 4 + ("b",) * 4
    assert rank_shift_rule(two_hosts, 4).ok
    assert not rank_shift_rule(two_hosts, 1).ok     # 6 of 8 read their own host's bytes
    assert "6 of 8" in rank_shift_rule(two_hosts, 1).detail


def test_summary_says_why_it_is_not_comparable():
    phase = Phase((1.0,), (1.0,), (GB,))
    rules = [gap_rule(45.0), rank_shift_rule(("a", "b"), 1)]
    why = comparability("llama3-8b", 8, False, Fraction(1, 1024))
    document = summary("llama3-8b", 2, ("a", "b"), {"a": GB}, phase, phase, rules, why, {})
    assert document["comparable"] is False
    assert document["not_comparable"] == [
        "sizes scaled by 1/1024: not comparable with submissions",
        "rule gap: the reads started 45.0 s after the writes ended (over 30 s): not "
        "comparable with submissions"]
    assert document["num_hosts"] == 2 and document["host_memory_GB"] == [1.0, 0.0]
    assert set(document["metric"]) >= {"save_checkpoint_io_mean_GB_per_second",
                                       "load_checkpoint_duration_mean_seconds",
                                       "checkpoint_size_GB"}
    assert comparability("llama3-70b", 64, False, Fraction(1)) == []
    assert comparability("llama3-70b", 8, True, Fraction(1)) == ["subset: 8 of 64 ranks"]
