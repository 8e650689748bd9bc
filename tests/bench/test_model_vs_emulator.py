"""bench/model_vs_emulator.py's mapping of the requests counted in the emulator's log to
the model's parameters, as its docstring states it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from model_vs_emulator import model_params, why_outside  # noqa: E402

S, C, RTT_OP = 0.010, 2, 0.0006
# what the emulator's log gave per rank and iteration: 7 GETATTRs and 1 OPEN; with
# --serialize-inode 6 of them queue on the file's lock, the 2 directory lookups do not
COUNTED = {"total": 8.0, "file": 6.0, "other": 2.0, "getattr": 7.0, "open": 1.0}


def test_sharded_every_counted_request_is_a_model_op_with_the_round_trips_kept() -> None:
    params = model_params("sharded", S, C, COUNTED, RTT_OP, 1e9, 1e9, 2**21)
    assert params.ops_per_rank == 8 and params.service_s == S and params.threads == C
    assert params.rtt_s * params.ops_per_rank == pytest.approx(2 * RTT_OP)   # k ops' round trips
    assert params.whole_rounds


def test_shared_the_files_requests_queue_and_the_directory_lookups_are_round_trips() -> None:
    params = model_params("shared", S, C, COUNTED, RTT_OP, 1e9, 1e9, 2**21)
    assert params.ops_per_rank == 2
    assert params.service_s == pytest.approx(3 * S)                  # 6 file requests / 2 ops
    assert params.rtt_s == pytest.approx(RTT_OP + 1 * S)             # 2 lookups / 2 ops


def test_a_point_outside_says_what_was_measured_beside_it() -> None:
    said = why_outside(1, [0.100, 0.102, 0.140], 0.050, 0.010)
    assert "spread 39%" in said and "92.0 ms of metadata against the model's 50.0 ms" in said
