"""The plan: every byte of the checkpoint is read by exactly the ranks the layout says."""

from __future__ import annotations

import pytest

from stampede.errors import UsageError
from stampede.plan import SHARED_FILE, bytes_per_rank, checkpoint_files, plan_rank
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
    assert plan.bytes == 5 * 2**20


def test_slices_stay_aligned_and_too_small_is_an_error() -> None:
    spec = job(size="10000000")  # not a multiple of 4 KiB per rank
    per_rank = bytes_per_rank(spec, 3)
    assert per_rank % 4096 == 0 and per_rank * 3 <= 10_000_000
    with pytest.raises(UsageError, match="too small for 4 ranks"):
        bytes_per_rank(job(size="8KiB"), 4)
    direct = build_job("t", "t", {"target": {"path": "/x"}, "run": {"cache": "direct"},
                                  "checkpoint": {"size_per_rank": 5000}})
    with pytest.raises(UsageError, match="multiple of 4096"):
        bytes_per_rank(direct, 2)
