"""The raw-read ceiling's pure parts: each node's share of the checkpoint and each
stream's piece (every byte once, no overlap), the best stream count, the efficiency."""

from __future__ import annotations

import math

import pytest

from stampede.results.ceiling import (
    Ceiling,
    NodeCeiling,
    StreamRead,
    ceiling_columns,
    efficiency,
    pieces,
    split_evenly,
)

MiB = 2**20


@pytest.mark.parametrize(("total", "parts", "align"), [(100 * MiB, 3, 8 * MiB), (10, 4, 4096),
                                                      (0, 2, 4096), (8 * MiB, 1, 8 * MiB)])
def test_the_pieces_cover_every_byte_once(total: int, parts: int, align: int) -> None:
    cut = split_evenly(total, parts, align)
    assert len(cut) == parts
    assert cut[0][0] == 0 and cut[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(cut, cut[1:], strict=False))
    assert all(start % align == 0 or start == total for start, _ in cut)


def test_a_share_across_files_names_each_file_range() -> None:
    files = [("a", 10), ("b", 5), ("c", 20)]
    assert pieces(files, 8, 18) == [("a", 8, 2), ("b", 0, 5), ("c", 0, 3)]
    assert pieces(files, 0, 35) == [("a", 0, 10), ("b", 0, 5), ("c", 0, 20)]
    assert pieces(files, 35, 35) == []


def _node(host: str, *gbps_at: tuple[int, float]) -> NodeCeiling:
    # 1 GB read in 1/gbps seconds at each stream count
    return NodeCeiling(host, tuple(StreamRead(streams, 10**9, 10**9, 1 / gbps, 0)
                                   for streams, gbps in gbps_at))


def test_the_best_stream_count_is_the_ceiling_and_the_efficiency_is_over_it() -> None:
    fast = _node("a", (1, 1.0), (4, 3.0), (16, 4.0), (32, 3.5))
    slow = _node("b", (1, 0.5), (4, 2.0), (16, 1.5), (32, 1.0))
    assert fast.best is not None and fast.best.streams == 16
    assert fast.gbps == pytest.approx(4.0) and slow.gbps == pytest.approx(2.0)
    ceiling = Ceiling((fast, slow))
    # 12 GB from storage by 2 nodes in 2 s: 3 GB/s per node, over a mean ceiling of 3
    columns = ceiling_columns(ceiling, 12e9, 2.0, 2)
    assert columns["ceiling_gbps"] == pytest.approx(2.0)
    assert columns["ceiling_gbps_max"] == pytest.approx(4.0)
    assert columns["ceiling_efficiency"] == pytest.approx(1.0)
    assert efficiency(12e9, 4.0, 2, 3.0) == pytest.approx(0.5)
    assert math.isnan(efficiency(12e9, 0.0, 2, 3.0))
    assert math.isnan(efficiency(12e9, 2.0, 2, math.nan))
    sidecar = ceiling.sidecar()
    assert [node["best_streams"] for node in sidecar["nodes"]] == [16, 4]


def test_each_stream_count_is_its_median_read_and_a_lucky_read_is_not_the_ceiling() -> None:
    # rounds of (1, 4, 32) as measure reads them; 32 streams once at 9 GB/s (a read the
    # page cache or a quiet moment flattered), its median 2.0; 4 streams steadily 3.0
    rounds = [((1, 1.0), (4, 3.1), (32, 9.0)), ((1, 1.2), (4, 2.9), (32, 2.0)),
              ((1, 0.8), (4, 3.0), (32, 1.5))]
    node = _node("a", *(read for one in rounds for read in one))
    assert [(read.streams, read.gbps) for read in node.medians] == \
        [(1, pytest.approx(1.0)), (4, pytest.approx(3.0)), (32, pytest.approx(2.0))]
    assert node.best is not None and node.best.streams == 4
    assert node.gbps == pytest.approx(3.0)
    # the sidecar keeps every read, in the order read, beside the median's ceiling
    [said] = Ceiling((node,)).sidecar()["nodes"]
    assert [read["streams"] for read in said["reads"]] == [1, 4, 32] * 3
    assert said["gbps"] == pytest.approx(3.0) and said["best_streams"] == 4


def test_a_failed_read_is_left_out_of_its_median_and_an_even_count_takes_the_lower() -> None:
    failed = StreamRead(16, 10**9, 0, 0.0, 0)   # no time: NaN GB/s
    node = NodeCeiling("a", (*_node("a", (16, 2.0), (16, 4.0)).reads, failed))
    [median] = node.medians
    assert median.gbps == pytest.approx(2.0)   # a read that happened, not 3.0
    assert NodeCeiling("b", (failed,)).best is None
    assert math.isnan(NodeCeiling("b", (failed,)).gbps)
