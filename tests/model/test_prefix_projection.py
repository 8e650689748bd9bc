"""project's request-rate table (stampede.model.prefix_projection), pure: the lines each
layout gets (one prefix, its copies, hashed where it has shards), a bucket's rates one
line, the round trip shared by every layout, the presets as documented, a fit that needs
503s. No run, no wall clock."""

from __future__ import annotations

import math

import pytest

from stampede.backends.s3retry import RetryPolicy
from stampede.model.prefix_projection import (
    Rates,
    fitted_rates,
    preset_rates,
    project_prefixes,
    round_trip_s,
)
from stampede.model.prefix_rate import Limit, RunLoad
from stampede.targets import RATE_PRESETS


def _run(layout: str, latency_s: float, copies: int = 1, listers: int = 0,
         throttles: int = 0) -> RunLoad:
    return RunLoad(layout, 4, 4, 6, listers, copies, False, throttles, 0.0, 0.5, latency_s,
                   gets_per_rank=4, block_bytes=256 * 1024)


def policy() -> RetryPolicy:
    return RetryPolicy("standard", 3)


def test_each_layout_gets_a_line_per_way_its_keys_spread() -> None:
    runs = [_run("shared", 0.01, copies=2), _run("sharded", 0.03), _run("list-first", 0.02, listers=4)]
    roomy = Rates("roomy", Limit(1e6, 1e6, 1e6), "prefix")
    items = project_prefixes(runs, [roomy], 64, 60.0, policy)
    assert [(item.layout, item.keys, item.per_partition) for item in items] == [
        ("shared", "1 prefix", 64), ("shared", "2 copies", 32),
        ("sharded", "1 prefix", 64), ("sharded", "hashed", 1),
        ("list-first", "1 prefix", 64)]
    # one round trip for every layout: the runs' median
    assert {item.load.latency_s for item in items} == {0.02} == {round_trip_s(runs)}
    assert [item.shows_needed for item in items] == [True, False, True, False, True]
    assert all(item.needed == 1 and not item.outcome.fails for item in items)
    # a LIST storm lists on every rank of the partition, list-bcast's rank 0 alone
    assert items[-1].load.listers == 64
    # a bucket's rates: copies under prefixes do not spread them
    bucket = Rates("bucket", Limit(1e6, 1e6, 1e6), "bucket")
    assert [item.keys for item in project_prefixes(runs, [bucket], 64, 60.0, policy)] == \
        ["1 bucket"] * 3


def test_the_target_bytes_change_each_ranks_gets_in_the_runs_blocks() -> None:
    run = _run("sharded", 0.01)
    assert run.reads_for(None) == 6
    assert run.reads_for(64 * 2**20) == 2 + 256
    roomy = Rates("roomy", Limit(1e6, 1e6, 1e6), "prefix")
    (first, _) = project_prefixes([run], [roomy], 8, 60.0, policy, bytes_per_rank=64 * 2**20)
    assert first.load.reads_per_rank == 258
    assert first.outcome.last_rank_s == pytest.approx(258 * 0.01)


def test_the_presets_are_the_vendors_numbers() -> None:
    standard, express, gcs = (preset_rates(RATE_PRESETS[name])
                              for name in ("s3-standard", "s3-express", "gcs"))
    assert (standard.limit.read_per_s, standard.by_prefix) == (5_500, True)
    assert RATE_PRESETS["s3-standard"].write_per_s == 3_500
    assert (express.limit.read_per_s, express.by_prefix) == (200_000, False)
    assert RATE_PRESETS["s3-express"].write_per_s == 100_000
    assert (gcs.limit.read_per_s, gcs.limit.doubling_s) == (5_000, 20 * 60)
    assert RATE_PRESETS["gcs"].write_per_s == 1_000
    assert gcs.limit.lists_read and not standard.limit.lists_read
    assert math.isinf(standard.limit.doubling_s)


def test_a_fit_needs_503s_and_counts_the_busiest_partitions_share() -> None:
    assert fitted_rates([_run("sharded", 0.01)], 10, lambda run: policy) is None
    run = _run("sharded", 0.01, copies=2, throttles=40)
    assert run.observed().throttles == 20 and run.observed().load.ranks == 2
    fitted = fitted_rates([run], 10, lambda run: lambda: RetryPolicy("standard", 1_000))
    assert fitted is not None and fitted.by_prefix
    assert 0 < fitted.limit.read_per_s < 2 / 0.01   # below what 2 ranks ask unthrottled


def _save(layout: str, latency_s: float, throttles: int = 0) -> RunLoad:
    """2 ranks' save: 4 writes (2 parts), 11 validation reads, a publish, half a DELETE
    per rank and pass."""
    return RunLoad(layout, 2, 3, 11, 0, 1, False, throttles, 0.0, 2.0, latency_s,
                   gets_per_rank=10, block_bytes=2**20, phase="save", writes_per_rank=4,
                   publishes=1, deletes_per_rank=0.5, parts_per_rank=2, part_bytes=5 * 2**20)


def test_a_save_gets_one_prefix_and_hashed_lines_against_the_write_rate() -> None:
    runs = [_save("sharded", 0.02), _save("shared", 0.02)]
    standard = preset_rates(RATE_PRESETS["s3-standard"])
    # a preset's buckets absorb a second of their own rate: 3,500 writes, 5,500 reads
    assert (standard.limit.writes_per_s, standard.limit.writes_burst) == (3_500, 3_500)
    assert standard.limit.burst == 5_500
    items = project_prefixes(runs, [standard], 64, 60.0, policy)
    assert [(item.layout, item.keys, item.per_partition) for item in items] == [
        ("sharded", "1 prefix", 64), ("sharded", "hashed", 1), ("shared", "1 prefix", 64)]
    one, hashed, _ = items
    # a rank's uploads and validation; the partition's publish and 32 DELETEs (0.5 a rank)
    assert (one.load.writes_per_rank, one.load.reads_per_rank, one.load.lone_writes) == \
        (4, 11, 1 + 32)
    assert hashed.load.lone_writes == 0   # the pointer is not under a shard's prefix
    assert one.outcome.requests == 64 * 15 + 33 and not one.outcome.throttles
    # writes at 10 a second (burst 10), reads plenty: the writes are what is throttled,
    # and K prefixes are needed
    writes = Rates("writes", Limit(1e6, 1e6, 10, write_per_s=10), "prefix")
    (tight, _, _) = project_prefixes(runs, [writes], 64, 60.0, policy)
    assert tight.outcome.throttles > 0 and tight.needed is not None and tight.needed > 1
    # the bytes at the target: a rank's parts in the run's 5 MiB, its validation's GETs
    (bigger, _, _) = project_prefixes(runs, [standard], 8, 60.0, policy,
                                      bytes_per_rank=50 * 2**20)
    assert (bigger.load.writes_per_rank, bigger.load.reads_per_rank) == (2 + 10, 1 + 50)


def test_a_saves_503s_fit_its_write_rate() -> None:
    run = _save("sharded", 0.02, throttles=13)
    fitted = fitted_rates([run], 4, lambda run: lambda: RetryPolicy("standard", 1_000))
    assert fitted is not None
    assert fitted.limit.writes_per_s == fitted.limit.read_per_s
    # below the 2 ranks' writes a second unthrottled (about 5 in 6 of their requests)
    assert 0 < fitted.limit.writes_per_s < 2 / 0.02
