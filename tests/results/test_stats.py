"""Statistics definitions, checked on samples whose answers are known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from stampede.ops import OPS
from stampede.results.stats import layout_stats
from stampede.results.summaries import Latency
from stampede.results.warnings import warnings_for


def sample(rank: int, iteration: int, op: str, start_ns: int, stop_ns: int, nbytes: int = 0,
           ok: int = 1) -> list[int]:
    return [iteration, OPS.index(op), start_ns, stop_ns, nbytes, ok, rank]


def test_aggregate_bandwidth_is_total_bytes_over_first_start_to_last_stop() -> None:
    # rank 0 reads 1 GB in 0..1 s, rank 1 reads 1 GB in 0.5..2 s: 2 GB over 2 s = 1 GB/s,
    # not the 1.0 + 0.667 GB/s that summing per-rank rates would claim.
    rows = np.array([
        sample(0, 0, "read", 0, 10**9, 10**9), sample(1, 0, "read", 5 * 10**8, 2 * 10**9, 10**9),
        sample(0, 0, "restore", 0, 10**9, 10**9), sample(1, 0, "restore", 0, 2 * 10**9, 10**9),
    ])
    stats = layout_stats("sharded", rows, nranks=2)
    read = next(op for op in stats.ops if op.op == "read")
    assert read.agg_gbps.median == pytest.approx(1.0)
    assert read.elapsed_s.median == pytest.approx(2.0)
    assert stats.restore.time_to_last_rank_s.median == pytest.approx(2.0)
    assert stats.restore.first_done_s.median == pytest.approx(1.0)
    assert stats.restore.straggler_ratio.median == pytest.approx(2.0 / 1.5)
    assert stats.restore.slowest_ranks[0] == (1, pytest.approx(2.0))


def test_percentiles_pool_every_rank_and_iteration_with_linear_interpolation() -> None:
    rows = np.array([sample(rank, iteration, "stat", 0, 1000 * (1 + rank + 2 * iteration))
                     for rank in range(2) for iteration in range(2)])  # 1, 2, 3, 4 µs
    stat = layout_stats("shared", rows, nranks=2).ops[0]
    assert stat.count == 4
    assert stat.latency.min_s == pytest.approx(1e-6)
    assert stat.latency.p50_s == pytest.approx(2.5e-6)
    assert stat.latency.p90_s == pytest.approx(3.7e-6)
    assert stat.latency.max_s == pytest.approx(4e-6)


def test_failed_samples_are_counted_not_measured() -> None:
    rows = np.array([sample(0, 0, "open", 0, 500), sample(0, 0, "open", 0, 10**9, ok=0),
                     sample(0, 0, "restore", 0, 1000, ok=0)])
    opened = layout_stats("shared", rows, nranks=1).ops[0]
    assert (opened.count, opened.errors) == (1, 1)
    assert opened.latency.max_s == pytest.approx(5e-7)


def test_median_and_spread_across_iterations() -> None:
    rows = np.array([sample(0, it, "restore", 0, ns, 100)
                     for it, ns in enumerate((10**8, 3 * 10**8, 2 * 10**8))])
    stats = layout_stats("shared", rows, nranks=1)
    ttlr = stats.restore.time_to_last_rank_s
    assert (ttlr.median, ttlr.min, ttlr.max) == pytest.approx((0.2, 0.1, 0.3))
    notes = warnings_for(stats, cache="warm", ranks_per_node=4, cpus_per_node=2, fs_type="ext4",
                         page_cache=True)
    assert any("varies 100%" in note for note in notes)
    assert any("page cache" in note for note in notes)
    assert any("oversubscribed" in note for note in notes)


def test_a_summary_with_a_negative_duration_cannot_exist() -> None:
    with pytest.raises(ValueError):
        Latency(1, -1e-6, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        Latency(1, 2e-6, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6)


def test_timeline_and_histograms_for_plots() -> None:
    rows = np.array([
        sample(0, 0, "open", 100, 200), sample(0, 0, "read", 300, 1_000, 10),
        sample(0, 0, "read", 1_000, 5_000, 10), sample(0, 0, "restore", 0, 5_000, 20),
        sample(1, 0, "open", 50, 60), sample(1, 0, "read", 70, 900, 20),
        sample(1, 0, "restore", 0, 900, 20),
    ])
    stats = layout_stats("sharded", rows, nranks=2)
    # the moments, then the seconds in metadata, read, write, wait, exchange, verify, device copy
    expected = ((0.0, 0.0, 100e-9, 1_000e-9, 5_000e-9, 5_000e-9, 100e-9, 4_700e-9, 0, 0, 0, 0, 0),
                (1.0, 0.0, 50e-9, 900e-9, 900e-9, 900e-9, 10e-9, 830e-9, 0, 0, 0, 0, 0))
    assert [row == pytest.approx(want) for row, want in zip(stats.timeline, expected)] == [True] * 2
    read = stats.histograms["read"]
    assert sum(read.counts) == 3 and len(read.edges_s) == len(read.counts) + 1
    # 700 ns, 830 ns and 4 µs fall into the buckets whose edges hold them
    filled = [i for i, count in enumerate(read.counts) for _ in range(count)]
    for index, seconds in zip(filled, sorted([700e-9, 830e-9, 4_000e-9])):
        assert read.edges_s[index] <= seconds < read.edges_s[index + 1]
