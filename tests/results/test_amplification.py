"""Read amplification (stampede.results.amplification): bytes read over bytes needed, for
the job, its worst node and its worst rank."""

from __future__ import annotations

import math

import numpy as np

from stampede.ops import OP_CODE
from stampede.results.amplification import RankNeed, amplification, rank_read_bytes

MIB = 2**20
HOSTS = ("a", "a", "b", "b")


def test_every_rank_reading_the_whole_file_is_n_fold_everywhere() -> None:
    needs = [RankNeed(4 * MIB, MIB, ("shard", rank)) for rank in range(4)]
    found = amplification(needs, HOSTS)
    assert found.needed_bytes == 4 * MIB
    assert found.of(16 * MIB) == 4.0 and found.node_max == 4.0 and found.rank_max == 4.0


def test_a_shard_two_ranks_of_a_node_hold_is_needed_once() -> None:
    # broadcast by node: one reader per node, both ranks of a node hold the same shard
    needs = [RankNeed(MIB, MIB, "s0"), RankNeed(0, MIB, "s0"),
             RankNeed(3 * MIB, MIB, "s1"), RankNeed(0, MIB, "s1")]
    found = amplification(needs, HOSTS)
    assert found.needed_bytes == 2 * MIB
    assert found.of(4 * MIB) == 2.0
    assert found.node_max == 3.0   # node b read its shard three times over
    assert found.rank_max == 3.0


def test_nothing_needed_says_nothing() -> None:
    found = amplification([RankNeed(0, 0, ("rank", 0))], ("a",))
    assert found.needed_bytes == 0
    assert all(math.isnan(value) for value in (found.of(8), found.node_max, found.rank_max))


def test_a_ranks_reads_per_iteration_are_the_median_of_its_successful_reads() -> None:
    read, stat, restore = OP_CODE["read"], OP_CODE["stat"], OP_CODE["restore"]
    rows = np.array([  # ITER, OP, START, STOP, NBYTES, OK
        [0, read, 0, 1, 100, 1], [0, read, 1, 2, 100, 1], [0, stat, 0, 1, 0, 1],
        [1, read, 0, 1, 100, 1], [1, read, 1, 2, 50, 0],       # a failed read counts nothing
        [2, restore, 0, 1, 0, 1],                                # an iteration it read nothing
        [0, restore, 0, 2, 200, 1]], dtype=np.int64)
    assert rank_read_bytes(rows) == 100.0   # median of 200, 100, 0
    assert rank_read_bytes(np.empty((0, 6), dtype=np.int64)) == 0.0
