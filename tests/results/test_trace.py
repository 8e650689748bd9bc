"""A run's trace (stampede.results.trace): written and read back whole (readback); its segments,
concurrency, per-rank times and Chrome events computed from rows whose answers are known."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stampede.ops import OP_CODE
from stampede.results import trace as traces
from stampede.results.model import LayoutTrace
from stampede.results.readback import Read, read_trace

MS = 1_000_000


def row(iteration: int, op: str, start_ms: float, stop_ms: float, nbytes: int, rank: int,
        ok: int = 1) -> list[int]:
    """A row; a read's file is its rank's shard (file `rank`), at offset 4096 x iteration."""
    located = [rank, 4096 * max(iteration, 0)] if op == "read" else [traces.NOWHERE] * 2
    return [iteration, OP_CODE[op], int(start_ms * MS), int(stop_ms * MS), nbytes, ok, rank,
            *located]


def two_ranks() -> np.ndarray:
    """Iteration 0: rank 0 reads 10 MB over 0-10 ms, rank 1 reads 10 MB over 5-15 ms after
    a stat (0-5 ms); both done at their last read's end. Iteration 1: faster, rank 1's
    read failed."""
    return np.array([
        row(0, "read", 0, 10, 10_000_000, 0),
        row(0, "restore", 0, 10, 10_000_000, 0),
        row(0, "stat", 0, 5, 0, 1), row(0, "read", 5, 15, 10_000_000, 1),
        row(0, "restore", 0, 15, 10_000_000, 1),
        row(1, "read", 0, 4, 10_000_000, 0), row(1, "restore", 0, 4, 10_000_000, 0),
        row(1, "read", 0, 5, 10_000_000, 1, ok=0), row(1, "restore", 0, 5, 0, 1),
        row(-1, "read", 0, 50, 10_000_000, 0),     # a warmup: never counted
    ], dtype=np.int64)


def trace_of(tmp_path: Path) -> traces.Trace:
    layout = LayoutTrace(two_ranks(), ["shards/0", "shards/1"])
    path = traces.write_trace(tmp_path / "r.trace.npz", {"sharded": layout},
                              {"run_id": "r", "phase": "restore", "hosts_by_rank": ["a", "b"]})
    assert not list(tmp_path.glob(".*"))           # no temporary file left
    return whole(path)


def whole(path: Path) -> traces.Trace:
    """A trace that reads back whole: no note."""
    found = read_trace(path)
    assert found.value is not None and found.notes == (), found.notes
    return found.value


def test_a_trace_reads_back_whole_and_is_refused_when_it_is_not_one(tmp_path: Path) -> None:
    trace = trace_of(tmp_path)
    assert list(trace.layouts) == ["sharded"]
    assert np.array_equal(trace.layouts["sharded"], two_ranks())
    assert trace.meta["units"] == "ns" and trace.meta["hosts_by_rank"] == ["a", "b"]
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    assert read_trace(tmp_path / "other.npz") == Read(None, (
        f"{tmp_path / 'other.npz'}: the trace is an .npz without a meta array (not a "
        "stampede trace): nothing of it can be read",))


def test_a_first_trace_without_file_and_offset_still_reads(tmp_path: Path) -> None:
    """Traces written before the file and offset columns read back with both NOWHERE."""
    first = two_ranks()[:, :len(traces.FIRST_COLUMNS)]
    meta = {"columns": list(traces.FIRST_COLUMNS), "ops": list(traces.OPS),
            "layouts": ["sharded"], "units": "ns"}
    np.savez(tmp_path / "old.trace.npz", meta=np.array(json.dumps(meta)), layout_0=first)
    rows = whole(tmp_path / "old.trace.npz").layouts["sharded"]
    assert rows.shape == (len(first), len(traces.TRACE_COLUMNS))
    assert np.array_equal(rows[:, :len(traces.FIRST_COLUMNS)], first)
    assert set(rows[:, traces.FILE].tolist()) == set(rows[:, traces.OFFSET].tolist()) == {-1}


def test_segments_spread_the_bytes_and_count_the_ranks_inside(tmp_path: Path) -> None:
    trace = trace_of(tmp_path)
    rows = trace.layouts["sharded"]
    assert traces.slowest_iteration(trace, rows) == 0
    first = rows[rows[:, traces.ITERATION] == 0]
    found = traces.segments(trace, first, count=3)            # 0-5, 5-10, 10-15 ms
    assert [s.stop_ns for s in found] == [5 * MS, 10 * MS, 15 * MS]
    assert [s.nbytes for s in found] == pytest.approx([5e6, 10e6, 5e6])
    assert sum(s.nbytes for s in found) == pytest.approx(20e6)  # every byte, once
    assert [s.inside_max for s in found] == [2, 2, 1]          # both ranks busy until 10 ms
    assert [s.inside_mean for s in found] == pytest.approx([2.0, 2.0, 1.0])
    assert [s.ops for s in found] == [0, 1, 2]     # the stat ends at 5 ms; the reads at 10, 15
    assert found[1].gbps == pytest.approx(10e6 / 5e-3 / 1e9)
    second = rows[rows[:, traces.ITERATION] == 1]
    assert sum(s.errors for s in traces.segments(trace, second, count=2)) == 1


def test_ranks_nodes_and_counts(tmp_path: Path) -> None:
    trace = trace_of(tmp_path)
    rows = trace.layouts["sharded"]
    first = rows[rows[:, traces.ITERATION] == 0]
    times = traces.rank_times(trace, first)
    assert [(t.rank, t.host, t.first_byte_ns, t.last_byte_ns, t.done_ns) for t in times] == [
        (0, "a", 10 * MS, 10 * MS, 10 * MS), (1, "b", 15 * MS, 15 * MS, 15 * MS)]
    assert traces.by_node(times) == [("b", 15 * MS, 1), ("a", 10 * MS, 1)]
    # the archive's count column: successful samples of the measured iterations
    assert traces.op_counts(trace, rows) == {"stat": 1, "read": 3, "restore": 4}


def test_the_chrome_trace_has_a_slice_per_op_a_thread_per_rank(tmp_path: Path) -> None:
    trace = trace_of(tmp_path)
    document = json.loads(json.dumps(traces.chrome_events(trace)))
    slices = [event for event in document["traceEvents"] if event["ph"] == "X"]
    assert len(slices) == len(two_ranks())
    names = {(event["name"], event["args"]["name"]) for event in document["traceEvents"]
             if event["ph"] == "M"}
    assert names == {("process_name", "a"), ("process_name", "b"),
                     ("thread_name", "rank 0"), ("thread_name", "rank 1")}
    read = next(event for event in slices if event["name"] == "read" and event["tid"] == 1
                and event["args"]["iteration"] == 0)
    warm = [event for event in slices if event["args"]["iteration"] == -1]
    assert read["dur"] == pytest.approx(10_000.0) and read["pid"] == 1   # µs, node b
    assert (read["args"]["file"], read["args"]["offset"]) == ("shards/1", 0)
    stat = next(event for event in slices if event["name"] == "stat")
    assert "file" not in stat["args"] and "offset" not in stat["args"]
    # iterations one after another: the warmup first, then 0, then 1
    assert warm[0]["ts"] < read["ts"]


def test_the_heat_map_cells_are_each_ranks_share_of_a_segment_inside_storage(
        tmp_path: Path) -> None:
    """Iteration 0 over 0-15 ms in 3 segments: rank 0 reads 0-10 ms (busy, busy, idle);
    rank 1 stats 0-5 then reads 5-15 (busy throughout); banded, their mean."""
    trace = trace_of(tmp_path)
    rows = trace.layouts["sharded"]
    first = rows[rows[:, traces.ITERATION] == 0]
    labels, busy = traces.rank_busy(trace, first, count=3)
    assert labels == ["rank 0", "rank 1"]
    assert np.allclose(busy, [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    labels, banded = traces.rank_busy(trace, first, count=3, bands=1)
    assert labels == ["ranks 0-1"] and np.allclose(banded, [[1.0, 1.0, 0.5]])
