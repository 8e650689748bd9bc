"""The plan: every byte of the checkpoint is read by exactly the ranks the layout says."""

from __future__ import annotations

import pytest

from stampede.checkpoint.plan import (
    INDEX_FILE,
    SHARED_FILE,
    Extent,
    assign_owners,
    bytes_per_rank,
    checkpoint_files,
    needed_bytes,
    plan_rank,
    reads_storage,
    stripes,
    union_bytes,
    writes_of_rank,
)
from stampede.errors import UsageError
from stampede.spec import build_job


def job(**checkpoint: object):
    return build_job("t", "t.toml", {"target": {"path": "/nonexistent/never/touched"},
                                     "checkpoint": {"size": "10MiB", "block_size": "1MiB",
                                                    **checkpoint}})


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("layout", ["shared", "sharded"])
def test_every_byte_read_exactly_once(layout: str, nranks: int) -> None:
    spec = job()
    files = dict(checkpoint_files(spec, layout, nranks))
    coverage = {path: [0] * size for path, size in files.items()}
    for rank in range(nranks):
        plan = plan_rank(spec, layout, nranks, rank)
        for extent in plan.extents:
            covered = 0
            for offset, length in extent.blocks(spec.block_bytes):
                assert length <= spec.block_bytes
                for byte in range(offset, offset + length, 4096):  # page granularity suffices
                    coverage[extent.relpath][byte] += 1
                covered += length
            assert covered == extent.length
    for path, counts in coverage.items():
        assert all(count == 1 for count in counts[::4096]), path
    assert sum(files.values()) == bytes_per_rank(spec, nranks) * nranks


def test_shared_means_one_file_sharded_means_one_each() -> None:
    spec = job()
    shared = [plan_rank(spec, "shared", 4, rank) for rank in range(4)]
    assert {plan.files for plan in shared} == {(SHARED_FILE,)}
    assert [plan.extents[0].offset for plan in shared] == [0, 2621440, 5242880, 7864320]
    sharded = [plan_rank(spec, "sharded", 4, rank) for rank in range(4)]
    assert len({plan.files for plan in sharded}) == 4
    assert all(plan.extents[0].offset == 0 for plan in sharded)


def test_op_counts_follow_the_pattern() -> None:
    spec = build_job("t", "t", {"target": {"path": "/x"},
                                "checkpoint": {"size_per_rank": "5MiB", "block_size": "2MiB"},
                                "pattern": {"stat_count": 100, "open_count": 3}})
    plan = plan_rank(spec, "sharded", 2, 1)
    assert plan.op_counts() == {"stat": 100, "open": 3, "read": 3, "close": 3}
    assert sum(extent.length for extent in plan.extents) == 5 * 2**20


def test_slices_stay_aligned_and_too_small_is_an_error() -> None:
    spec = job(size="10000000")  # not a multiple of 4 KiB per rank
    per_rank = bytes_per_rank(spec, 3)
    assert per_rank % 4096 == 0 and per_rank * 3 <= 10_000_000
    with pytest.raises(UsageError, match="too small for 4 shards"):
        bytes_per_rank(job(size="8KiB"), 4)
    direct = build_job("t", "t", {"target": {"path": "/x"}, "run": {"cache": "direct"},
                                  "checkpoint": {"size_per_rank": 5000}})
    with pytest.raises(UsageError, match="multiple of 4096"):
        bytes_per_rank(direct, 2)


def replicated_job(replicas: int, **checkpoint: object):
    return build_job("t", "t.toml", {"target": {"path": "/nonexistent"},
                                     "checkpoint": {"size": "8MiB", "block_size": "1MiB",
                                                    "replicas": replicas, **checkpoint}})


def coverage(spec, layout: str, nranks: int, readers) -> dict[str, list[int]]:
    """Page-granular read counts per file, over the ranks `readers` says read storage."""
    counts = {path: [0] * (size // 4096) for path, size in checkpoint_files(spec, layout, nranks)}
    for rank in range(nranks):
        plan = plan_rank(spec, layout, nranks, rank)
        if not readers(plan):
            continue
        for extent in plan.extents:
            for page in range(extent.offset // 4096, (extent.offset + extent.length) // 4096):
                counts[extent.relpath][page] += 1
    return counts


@pytest.mark.parametrize(("nranks", "replicas"), [(2, 2), (4, 2), (6, 3), (8, 4)])
def test_strategies_read_each_shard_as_often_as_they_promise(nranks: int, replicas: int) -> None:
    spec = replicated_job(replicas)
    shards = nranks // replicas
    # every rank ends holding its model shard, whatever the strategy
    for layout in ("replicated", "broadcast", "striped"):
        holds = [plan_rank(spec, layout, nranks, rank).hold for rank in range(nranks)]
        assert [hold.relpath for hold in holds] == \
            [f"sharded/shard-{rank % shards:05d}-of-{shards:05d}.raw" for rank in range(nranks)]
    # replicated: every replica reads the whole shard -> R reads of every byte
    counts = coverage(spec, "replicated", nranks, lambda plan: True)
    assert {count for pages in counts.values() for count in pages} == {replicas}
    # broadcast: one leader per group (the group's lowest rank) -> each byte read once
    counts = coverage(spec, "broadcast", nranks, lambda plan: plan.rank < shards)
    assert {count for pages in counts.values() for count in pages} == {1}
    assert all(plan_rank(spec, "broadcast", nranks, rank).exchange == "bcast"
               for rank in range(nranks))
    # striped: the replicas' stripes tile each shard exactly once
    counts = coverage(spec, "striped", nranks, lambda plan: True)
    assert {count for pages in counts.values() for count in pages} == {1}
    plan = plan_rank(spec, "striped", nranks, 0)
    parts = stripes(spec, plan.hold)
    assert sum(length for _, length in parts) == plan.hold.length
    assert [offset for offset, _ in parts] == sorted(offset for offset, _ in parts)


def test_metadata_first_and_list_layouts() -> None:
    spec = replicated_job(1, index_size="100KiB")
    files = dict(checkpoint_files(spec, "metadata-first", 2))
    assert files[INDEX_FILE] == 100 * 1024
    plan = plan_rank(spec, "metadata-first", 2, 1)
    assert plan.index_file == INDEX_FILE and plan.op_counts()["index"] == 1
    assert INDEX_FILE not in plan.files  # the index is read by its own op, not the pattern
    first = [plan_rank(spec, "list-first", 4, rank).op_counts()["list"] for rank in range(4)]
    once = [plan_rank(spec, "list-bcast", 4, rank).op_counts()["list"] for rank in range(4)]
    assert (first, once) == ([1, 1, 1, 1], [1, 0, 0, 0])
    assert writes_of_rank(spec, "metadata-first", 2, 0)[0].relpath == INDEX_FILE


def test_replicas_must_divide_the_ranks_and_strategies_need_two() -> None:
    with pytest.raises(UsageError, match="checkpoint.replicas = 2 does not divide 3 ranks"):
        plan_rank(replicated_job(2), "broadcast", 3, 0)
    with pytest.raises(UsageError, match="needs checkpoint.replicas >= 2"):
        replicated_job(1, layout="broadcast")


@pytest.mark.parametrize("fmt", ["raw", "safetensors"])
def test_whole_file_reads_every_slice_and_holds_its_own(fmt: str) -> None:
    spec = job(format=fmt)
    shared = [plan_rank(spec, "shared", 4, rank) for rank in range(4)]
    for rank in range(4):
        plan = plan_rank(spec, "whole-file", 4, rank)
        assert plan.files == shared[rank].files   # the shared layout's file, read whole
        assert plan.extents == tuple(other.hold for other in shared)
        assert plan.hold == shared[rank].hold and plan.needed_bytes == plan.hold.length
        assert sum(e.length for e in plan.extents) == 4 * bytes_per_rank(spec, 4)
        assert plan.op_counts()["read"] == 4 * shared[rank].op_counts()["read"]


def test_union_bytes_counts_an_overlap_once() -> None:
    assert union_bytes([]) == 0
    assert union_bytes([Extent("a", 0, 10), Extent("a", 5, 10), Extent("a", 30, 5)]) == 20
    assert union_bytes([Extent("a", 0, 10), Extent("a", 0, 10, "t"), Extent("b", 0, 10)]) == 30
    assert union_bytes([Extent("a", 0, 100), Extent("a", 10, 5)]) == 100


@pytest.mark.parametrize(("nranks", "replicas", "shift"), [(4, 1, 0), (4, 2, 0), (6, 3, 1),
                                                           (4, 4, 3)])
def test_the_job_needs_its_shards_once_whatever_each_layout_reads(nranks: int, replicas: int,
                                                                 shift: int) -> None:
    spec = build_job("t", "t", {"target": {"path": "/x"},
                                "checkpoint": {"size_per_rank": "1MiB", "replicas": replicas},
                                "run": {"rank_shift": shift}})
    shards = nranks // replicas
    for layout in ("shared", "whole-file", "sharded", "broadcast", "striped", "metadata-first"):
        if layout in ("broadcast", "striped") and replicas < 2:
            continue
        plans = [plan_rank(spec, layout, nranks, rank) for rank in range(nranks)]
        needed = needed_bytes(spec, layout, nranks)
        assert needed == shards * 2**20, layout
        # the union of what the ranks hold is the sum over their distinct keys
        keyed = {plan.needed_key: plan.needed_bytes for plan in plans}
        assert sum(keyed.values()) == needed == union_bytes(p.hold for p in plans), layout
        # a broadcast group's leader is its replica 0 (with a shift, not its lowest rank)
        read = sum(e.length for p in plans for e in p.extents
                   if not p.leader_reads or p.member == 0)
        assert read == (nranks * needed if layout == "whole-file" else
                        needed if layout in ("broadcast", "striped") else
                        nranks * 2**20), layout


def test_owners_by_bytes_largest_first_to_the_least_loaded_holder() -> None:
    # shards of 5, 3, 3, 2 bytes: 5 to rank 0 (all idle, lowest), 3 to rank 1, the other 3
    # to rank 1 too (rank 0 holds 5 already), 2 to rank 0 (5 < 6): 7 and 6 bytes each
    assert assign_owners([5, 3, 3, 2], [[0, 1], [0, 1], [0, 1], [0, 1]]) == [0, 1, 1, 0]
    # only a holder reads a shard: rank 0 owns 9 bytes, and the shard only it holds too
    assert assign_owners([1, 9], [[0], [0, 1]]) == [0, 0]
    assert assign_owners([4, 4, 4], [[2], [1, 2], [0, 1, 2]]) == [2, 1, 0]


@pytest.mark.parametrize(("nranks", "replicas", "shift"), [(4, 1, 0), (4, 2, 0), (6, 3, 1),
                                                          (8, 2, 3)])
def test_owners_read_each_slice_once_and_lead_their_group(nranks: int, replicas: int,
                                                         shift: int) -> None:
    spec = build_job("t", "t.toml", {"target": {"path": "/nonexistent"},
                                     "checkpoint": {"size": "8MiB", "replicas": replicas},
                                     "run": {"rank_shift": shift}})
    plans = [plan_rank(spec, "owners", nranks, rank) for rank in range(nranks)]
    assert {plan.files for plan in plans} == {(SHARED_FILE,)}   # one file of S slices
    counts = coverage(spec, "owners", nranks, lambda plan: reads_storage(spec, plan))
    assert {count for pages in counts.values() for count in pages} == {1}
    for plan in plans:   # the owner holds the slice it reads, and is its group's first
        owner = plans[plan.owner]
        assert owner.hold == plan.hold and owner.member == 0 and owner.group == plan.group
        assert plan.exchange == "bcast" and (plan.member == 0) == (plan.rank == plan.owner)


@pytest.mark.parametrize("fmt", ["raw", "safetensors"])
def test_node_once_reads_the_whole_file_into_memory_in_slice_order(fmt: str) -> None:
    spec = job(format=fmt)
    per_rank = bytes_per_rank(spec, 4)
    for rank in range(4):
        plan = plan_rank(spec, "node-once", 4, rank)
        whole = plan_rank(spec, "whole-file", 4, rank)
        # the whole-file layout's reads, each slice at its place in the reader's memory
        assert [(e.relpath, e.offset, e.length, e.tensor) for e in plan.extents] == \
            [(e.relpath, e.offset, e.length, e.tensor) for e in whole.extents]
        assert [e.at(plan.hold) for e in plan.extents] == [s * per_rank for s in range(4)]
        assert plan.held_bytes == 4 * per_rank and plan.hold == whole.hold
        assert (plan.exchange, plan.by_node, plan.group) == ("scatter", True, 0)
        assert plan.needed_bytes == per_rank
    assert needed_bytes(spec, "node-once", 4) == 4 * per_rank

def s3_job(**checkpoint: object):
    """A job on an object store (no I/O: the plan is pure)."""
    return build_job("t", "t.toml", {"target": {"path": "s3://bucket/ck"},
                                     "checkpoint": {"size": "8MiB", "block_size": "1MiB",
                                                    **checkpoint}})


@pytest.mark.parametrize("layout", ["shared", "sharded", "metadata-first", "list-first"])
def test_copies_are_read_round_robin_and_each_is_whole(layout: str) -> None:
    spec = s3_job(copies=2, layout=[layout])
    plans = [plan_rank(spec, layout, 4, rank) for rank in range(4)]
    assert [plan.files[0].split("/")[0] for plan in plans] == ["copy-0", "copy-1"] * 2
    files = dict(checkpoint_files(spec, layout, 4))
    single = dict(checkpoint_files(s3_job(layout=[layout]), layout, 4))
    # every file of one copy, under each copy's prefix, and nothing else
    assert sorted(files) == sorted(f"copy-{copy}/{path}" for copy in (0, 1) for path in single)
    for plan in plans:
        prefix = plan.files[0].split("/")[0] + "/"
        assert all(path.startswith(prefix) for path in
                   (*plan.files, *filter(None, (plan.index_file, plan.list_dir))))
    # a shard's bytes are the same in every copy: the job needs them once
    assert needed_bytes(spec, layout, 4) == needed_bytes(s3_job(layout=[layout]), layout, 4)
    # two readers of one shard in two copies need its bytes once
    spread = s3_job(copies=3, replicas=2, layout=[layout])
    pair = [plan_rank(spread, layout, 4, rank) for rank in (0, 2)]
    assert pair[0].files != pair[1].files and pair[0].needed_key == pair[1].needed_key


@pytest.mark.parametrize("layout", ["shared", "sharded", "metadata-first"])
def test_prepare_writes_every_copy_once(layout: str) -> None:
    spec = s3_job(copies=3, layout=[layout])
    written = [extent for rank in range(4)
               for extent in writes_of_rank(spec, layout, 4, rank, whole_files=True)]
    assert len(written) == len(set(written))
    by_file: dict[str, int] = {}
    for extent in written:
        by_file[extent.relpath] = by_file.get(extent.relpath, 0) + extent.length
    assert by_file == dict(checkpoint_files(spec, layout, 4))
    if layout == "shared":   # each copy's one object is a different rank's upload
        writers = {extent.relpath.split("/")[0]: rank for rank in range(4)
                   for extent in writes_of_rank(spec, layout, 4, rank, whole_files=True)}
        assert writers == {"copy-0": 0, "copy-1": 1, "copy-2": 2}


def test_hashed_keys_lead_with_the_shards_hash() -> None:
    spec = s3_job(key_prefix="hash", layout=["sharded"])
    paths = [plan_rank(spec, "sharded", 4, rank).files[0] for rank in range(4)]
    heads = [path.split("/")[0] for path in paths]
    assert all(len(head) == 4 and int(head, 16) >= 0 for head in heads)
    assert [path.split("/", 1)[1] for path in paths] == [
        f"sharded/shard-{shard:05d}-of-00004.raw" for shard in range(4)]
    assert len({head[0] for head in heads}) >= 2   # apart at their first character
    # the same keys on every call (every rank, every run) and in prepare's files
    assert paths == [plan_rank(spec, "sharded", 4, rank).files[0] for rank in range(4)]
    assert sorted(paths) == sorted(path for path, _ in checkpoint_files(spec, "sharded", 4))
    both = s3_job(key_prefix="hash", copies=2, layout=["sharded"])
    assert plan_rank(both, "sharded", 4, 1).files[0] == f"copy-1/{paths[1]}"


@pytest.mark.parametrize(("target", "checkpoint", "words"), [
    ("/tmp/posix", {"copies": 2}, "not one"),
    ("/tmp/posix", {"key_prefix": "hash"}, "not one"),
    ("memory://x", {"copies": 2}, "not one"),
    ("s3://b/ck", {"copies": 2, "layout": ["mlperf"], "workload": "llama3-8b",
                   "size": None}, "workload"),
    ("s3://b/ck", {"key_prefix": "hash", "layout": ["shared", "sharded"]}, "shared"),
    ("s3://b/ck", {"key_prefix": "hash", "layout": ["list-first"]}, "list-first"),
    ("s3://b/ck", {"copies": 0}, "copies"),
    ("s3://b/ck", {"key_prefix": "random"}, "key_prefix"),
])
def test_prefix_options_refused_where_they_mean_nothing(target: str, checkpoint: dict[str, object],
                                                        words: str) -> None:
    body: dict[str, object] = {"size": "8MiB", **checkpoint}
    body = {key: value for key, value in body.items() if value is not None}
    with pytest.raises(UsageError, match=words):
        build_job("t", "t.toml", {"target": {"path": target}, "checkpoint": body})


def test_copies_refuse_a_saved_restore() -> None:
    with pytest.raises(UsageError, match="saved"):
        build_job("t", "t.toml", {"target": {"path": "s3://b/ck"},
                                  "checkpoint": {"size": "8MiB", "copies": 2},
                                  "run": {"restore": "saved"}})
