"""An object store's requests per prefix, as `stampede plan` counts them: what each layout
asks of its busiest prefix per restore and per save, with copies and hashed keys."""

from __future__ import annotations

import pytest

from stampede.checkpoint.prefix_requests import (
    copies_for_rate,
    prefix_load,
    prefix_of,
    restore_requests,
    save_requests,
)
from stampede.spec import build_job
from stampede.targets import S3_PREFIX_RATES_PER_S


def job(save: dict[str, object] | None = None, **checkpoint: object):
    return build_job("t", "t.toml", {"target": {"path": "s3://bucket/ck"},
                                     "checkpoint": {"size_per_rank": "1MiB",
                                                    "block_size": "256KiB", **checkpoint},
                                     "save": save or {}})


def test_a_prefix_is_the_keys_first_component() -> None:
    assert [prefix_of(key) for key in ("copy-1/sharded/s.raw", "a3f9/sharded/s.raw",
                                       "stampede-manifest.json")] == ["copy-1/", "a3f9/", ""]


@pytest.mark.parametrize("layout", ["shared", "sharded"])
def test_each_rank_asks_two_heads_and_a_get_a_block_of_one_prefix(layout: str) -> None:
    # pattern stat, open, read, close: stat and open a HEAD each, 4 blocks of 256 KiB
    requests = restore_requests(job(layout=[layout]), layout, 8)
    prefix = f"{layout}/"
    assert requests == {(prefix, "HEAD"): 16, (prefix, "GET"): 32}


@pytest.mark.parametrize("layout", ["shared", "sharded", "list-first", "metadata-first"])
def test_k_copies_divide_the_busiest_prefixs_requests_by_k(layout: str) -> None:
    one = prefix_load(job(layout=[layout]), layout, 8, 1.0)
    four = prefix_load(job(layout=[layout], copies=4), layout, 8, 1.0)
    assert (one.prefixes, four.prefixes) == (1, 4)
    assert four.busiest.startswith("copy-")
    assert {method: count * 4 for method, count in four.requests.items()} == one.requests
    totals = [sum(restore_requests(job(layout=[layout], copies=copies), layout, 8).values())
              for copies in (1, 4)]
    assert totals[0] == totals[1]   # spread, not fewer
    assert four.save_prefixes == 0 and one.save_prefixes == (0 if layout == "list-first" else 1)


def test_hashed_keys_spread_restore_and_save_over_a_prefix_each() -> None:
    spec = job(layout=["sharded"], key_prefix="hash")
    load = prefix_load(spec, "sharded", 16, 2.0)
    assert load.prefixes == 16 and load.requests == {"HEAD": 2, "GET": 4}
    assert load.reads_per_s == 3.0
    assert load.read_share == pytest.approx(3.0 / S3_PREFIX_RATES_PER_S["read"])
    assert (load.save_prefixes, load.save_writes) == (16, 1)
    assert load.write_share == pytest.approx(0.5 / S3_PREFIX_RATES_PER_S["write"])


def test_list_first_lists_on_every_rank_list_bcast_once_and_pages_by_the_thousand() -> None:
    for nranks, pages in ((4, 1), (2_048, 3)):
        first = restore_requests(job(layout=["list-first"]), "list-first", nranks)
        bcast = restore_requests(job(layout=["list-bcast"]), "list-bcast", nranks)
        assert first["sharded/", "LIST"] == nranks * pages
        assert bcast["sharded/", "LIST"] == pages


def test_broadcast_reads_once_a_group_and_whole_file_every_slice() -> None:
    replicated = restore_requests(job(layout=["replicated"], replicas=2), "replicated", 8)
    broadcast = restore_requests(job(layout=["broadcast"], replicas=2), "broadcast", 8)
    assert {key: count // 2 for key, count in replicated.items()} == broadcast
    whole = restore_requests(job(layout=["whole-file"]), "whole-file", 8)
    assert whole == {("shared/", "HEAD"): 16, ("shared/", "GET"): 8 * 8 * 4}


def test_a_multipart_save_asks_two_posts_and_a_put_a_part() -> None:
    plain = save_requests(job(layout=["sharded"]), "sharded", 4)
    parts = save_requests(job(layout=["sharded"], size_per_rank="12MiB",
                              save={"part_size": "5MiB"}), "sharded", 4)
    assert plain == {("sharded/", "PUT"): 4}
    assert parts == {("sharded/", "PUT"): 4 * 3, ("sharded/", "POST"): 4 * 2}


def test_the_copies_that_bring_the_busiest_prefix_to_s3s_rate() -> None:
    # 16,384 ranks of 1 GiB in 16 MiB blocks: 64 GETs and 2 HEADs a rank
    big = {"size_per_rank": "1GiB", "block_size": "16MiB", "layout": ["sharded"]}
    plain = prefix_load(job(**big), "sharded", 16_384, 60.0)
    assert plain.reads == 16_384 * 66 and plain.read_share > 3   # 18k/s of 5,500/s
    assert plain.copies_for_rate == 4 == copies_for_rate(16_384 * 66, 1, 16_384, 60.0)
    spread = prefix_load(job(copies=4, **big), "sharded", 16_384, 60.0)
    assert spread.read_share < 1 and spread.copies_for_rate == 4   # the same answer
    # more copies than ranks would be needed: none help (each copy's reader alone is past it)
    assert copies_for_rate(16_384 * 66, 1, 2, 60.0) is None
    assert copies_for_rate(1, 1, 1, 60.0) == 1
