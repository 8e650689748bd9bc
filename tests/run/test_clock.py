"""One time axis per phase: a rank that leaves the barrier late carries the delay."""

from __future__ import annotations

import numpy as np

from stampede.ops import OP_CODE
from stampede.run.clock import on_one_axis, origins_array

RESTORE, READ = OP_CODE["restore"], OP_CODE["read"]


def test_a_late_rank_on_the_same_node_carries_its_delay() -> None:
    # node a: rank 0 leaves the barrier at 1_000, rank 1 (descheduled) at 11_000; each
    # then reads for 500 ns. Node b has its own clock (another boot time).
    rows = [np.array([[0, READ, 1_000, 1_500, 8, 1], [0, RESTORE, 1_000, 1_500, 8, 1]]),
            np.array([[0, READ, 11_000, 11_500, 8, 1], [0, RESTORE, 11_000, 11_500, 8, 1]]),
            np.array([[0, READ, 9_000_000, 9_000_500, 8, 1],
                      [0, RESTORE, 9_000_000, 9_000_500, 8, 1]])]
    origins = [origins_array({0: 1_000}), origins_array({0: 11_000}), origins_array({0: 9_000_000})]
    axis = on_one_axis(rows, origins, ["a", "a", "b"])
    assert axis[0].tolist() == [[0, READ, 0, 500, 8, 1], [0, RESTORE, 0, 500, 8, 1]]
    # its own zero would say 500 ns: on the node's axis it is 10.5 µs after the start
    assert axis[1].tolist() == [[0, READ, 10_000, 10_500, 8, 1], [0, RESTORE, 0, 10_500, 8, 1]]
    assert axis[2].tolist() == [[0, READ, 0, 500, 8, 1], [0, RESTORE, 0, 500, 8, 1]]


def test_phases_are_put_on_their_own_axes() -> None:
    rows = [np.array([[0, READ, 100, 200, 1, 1], [1, READ, 5_100, 5_300, 1, 1]])]
    axis = on_one_axis(rows, [origins_array({0: 100, 1: 5_000})], ["a"])
    assert axis[0][:, 2:4].tolist() == [[0, 100], [100, 300]]
