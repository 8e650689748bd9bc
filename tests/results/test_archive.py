"""The CSV archive: appended, header once, full precision, old rows never lost."""

from __future__ import annotations

import io
import multiprocessing
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.present.report import make_console, render_archive
from stampede.results.archive import COLUMNS, REQUIRED_COLUMNS, append_rows, cell, read_rows
from stampede.results.archived import Archive
from stampede.results.columns import OPTION_BEFORE
from stampede.spec import load_job
from tests.helpers.jobs import write_job


def row(run_id: str, op: str = "restore", **values: object) -> dict[str, object]:
    base: dict[str, object] = {
        "schema": 1, "run_id": run_id, "timestamp": "2026-11-29T00:00:00+00:00", "job": "t",
        "backend": "posix", "layout": "shared", "format": "raw", "cache": "warm", "nranks": 2,
        "nnodes": 1, "ranks_per_node": 2, "bytes_total": 2**21, "bytes_per_rank": 2**20,
        "block_bytes": 2**20, "iterations": 3, "op": op, "count": 6, "errors": 0,
        "lat_min_s": 2e-6, "lat_p50_s": 2.123456789e-6, "lat_p90_s": 3e-6, "lat_p99_s": 4e-6,
        "lat_p999_s": 5e-6, "lat_max_s": 6e-6, "ops_per_s": 1e5, "agg_gbps": 1.5,
        "time_to_last_rank_s": 0.5, "time_to_last_rank_min_s": 0.4,
        "time_to_last_rank_max_s": 0.6, "first_done_s": 0.25, "straggler_ratio": 1.2,
        "slowest_ranks": "1@vm:0.5 0@vm:0.4", "valid": True, "stampede_version": "0",
        "hosts": "vm", "slurm_job_id": "", "warnings": "",
    }
    base.update(values)
    return base


def test_required_columns_present_once() -> None:
    assert set(REQUIRED_COLUMNS) <= set(COLUMNS)
    assert len(COLUMNS) == len(set(COLUMNS))


def test_round_trip_keeps_full_precision_and_appends(tmp_path: Path) -> None:
    archive = tmp_path / "a" / "r.csv"
    append_rows(archive, [row("one"), row("one", op="stat", agg_gbps=float("nan"))])
    append_rows(archive, [row("two")])
    text = archive.read_text()
    assert text.count("schema,run_id") == 1
    rows = read_rows(archive)
    assert [r["run_id"] for r in rows] == ["one", "one", "two"]
    assert float(rows[0]["lat_p50_s"]) == 2.123456789e-6
    assert rows[1]["agg_gbps"] == ""
    assert rows[0]["valid"] == "true"


def test_a_foreign_header_is_refused_and_left_intact(tmp_path: Path) -> None:
    archive = tmp_path / "r.csv"
    archive.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match="not this stampede's CSV schema"):
        append_rows(archive, [row("x")])
    assert archive.read_text() == "a,b\n1,2\n"


def test_a_torn_last_line_is_skipped_and_later_rows_start_on_a_new_line(tmp_path: Path) -> None:
    archive = tmp_path / "r.csv"
    append_rows(archive, [row("one")])
    with open(archive, "a") as stream:
        stream.write("schema-1-torn,run")  # a crash in the middle of a write
    append_rows(archive, [row("two")])
    assert [r["run_id"] for r in read_rows(archive)] == ["one", "two"]


def _append_many(path: str, name: str) -> None:
    for index in range(30):
        append_rows(path, [row(f"{name}-{index}", op=op) for op in ("stat", "read", "restore")])


def test_concurrent_writers_interleave_whole_runs(tmp_path: Path) -> None:
    archive = str(tmp_path / "r.csv")
    workers = [multiprocessing.Process(target=_append_many, args=(archive, name))
               for name in "abc"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    rows = read_rows(archive)
    assert len(rows) == 3 * 30 * 3
    for start in range(0, len(rows), 3):  # each run's three rows stay together
        assert len({r["run_id"] for r in rows[start:start + 3]}) == 1


def test_cells() -> None:
    assert cell(float("nan")) == "" and cell(None) == "" and cell(True) == "true"
    assert cell(2e-06) == "2e-06"


def test_report_renders_from_the_archive_alone(tmp_path: Path) -> None:
    archive = tmp_path / "r.csv"
    append_rows(archive, [row("run-1", op="stat"), row("run-1"),
                          row("run-1", layout="sharded", time_to_last_rank_s=0.25),
                          row("run-2", valid=False, invalid_reason="ops failed in iteration 0")])
    stream = io.StringIO()
    render_archive(Archive.open(archive).rows, make_console(stream, width=100),
                   run_ids=["run-1"])
    text = stream.getvalue()
    assert "Restore: time until every rank holds its bytes" in text
    assert text.index("sharded") < text.index("shared ")  # best (0.25 s) first
    assert "500 ms" in text and "250 ms" in text
    assert "2.12" in text  # stat p50 in µs
    assert "Every run in the archive" in text and "run-2" in text
    with pytest.raises(UsageError, match="not in the archive"):
        render_archive(Archive.open(archive).rows, make_console(io.StringIO()), run_ids=["nope"])


def _append_forever(path: str) -> None:
    index = 0
    while True:
        append_rows(path, [row(f"loop-{index}", op=op) for op in ("stat", "read", "restore")])
        index += 1


def test_a_writer_killed_mid_append_loses_no_earlier_row(tmp_path: Path) -> None:
    import os
    import signal
    import time

    archive = str(tmp_path / "r.csv")
    append_rows(archive, [row("before")])
    for attempt in range(5):  # kill at different moments of the write loop
        size = os.path.getsize(archive)
        writer = multiprocessing.Process(target=_append_forever, args=(archive,))
        writer.start()
        deadline = time.monotonic() + 60
        while os.path.getsize(archive) == size:    # it is writing: now, or a moment later
            assert time.monotonic() < deadline, "the writer never appended"
            time.sleep(0.001)
        time.sleep(0.003 * attempt)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(10)
    rows = read_rows(archive)
    assert rows[0]["run_id"] == "before"
    assert len(rows) > 1
    for row_ in rows:  # every row that reads back is whole: all columns, known values
        assert row_["schema"] == "1" and row_["valid"] == "true" and row_["op"] in ("stat", "read", "restore")
    append_rows(archive, [row("after")])
    assert read_rows(archive)[-1]["run_id"] == "after"


def test_rows_of_schema_3_read_as_what_they_measured(tmp_path: Path) -> None:
    # schema 4 added run.exchange and MLPerf's workload, scale and subset, columns compare
    # matches on: an older row (no such columns) exchanged over MPI and ran no workload,
    # and must still match a new row of a default job
    archive = tmp_path / "r.csv"
    old_columns = [column for column in COLUMNS if column not in OPTION_BEFORE]
    values = {**row("old", schema=3, phase="save"), "valid": "true"}
    archive.write_text(",".join(old_columns) + "\n"
                       + ",".join(str(values.get(column, "")) for column in old_columns) + "\n")
    append_rows(tmp_path / "new.csv", [row("new", schema=4, exchange="torch")])
    old, = read_rows(archive)
    new, = read_rows(tmp_path / "new.csv")
    assert (old["exchange"], old["phase"]) == ("mpi", "save")
    assert (new["exchange"], new["phase"]) == ("torch", "restore")
    job = write_job(tmp_path, target={"path": str(tmp_path / "ck")}, checkpoint={"size": "1MiB"})
    written = load_job(job).columns()
    assert {column: old[column] for column in OPTION_BEFORE} == \
        {column: cell(written[column]) for column in OPTION_BEFORE}
