"""The runner in-process at one rank (stampede.mpi.SingleRank, no mpiexec): prepare, the
job's layouts, the statistics on rank 0, exactly as `stampede run` makes them. The same
code paths run under a real mpiexec in tests/run/test_restore.py."""

from __future__ import annotations

from pathlib import Path

from stampede.checkpoint.prepare import prepare
from stampede.mpi import SingleRank
from stampede.results.rows import archive_rows
from stampede.run.job import run_job
from stampede.spec import build_job


def job(tmp_path: Path, **run: object) -> object:
    return build_job("inproc", str(tmp_path / "inproc.toml"), {
        "target": {"path": str(tmp_path / "ckpt")},
        "checkpoint": {"size": "4MiB", "layout": ["shared", "sharded", "metadata-first"],
                       "block_size": "1MiB", "index_size": "64KiB"},
        "run": {"iterations": 2, "warmup": 1, "verify": "xxh3", **run},
        "archive": {"path": str(tmp_path / "inproc.csv")}})


def test_every_layout_restores_its_bytes_at_one_rank(tmp_path: Path) -> None:
    spec = job(tmp_path, cache="cold")
    comm = SingleRank()
    prepare(comm, spec, show_progress=False)
    context, runs = run_job(comm, spec)
    assert context.nranks == 1 and [run.layout for run in runs] == list(spec.layouts)
    for run in runs:
        assert run.invalid_reason == "" and run.stats is not None, run.messages
        assert run.bytes_per_rank == 4 * 2**20
        ops = {op.op: op for op in run.stats.ops}
        assert ops["read"].count == 2 * 4 and ops["read"].bytes == 2 * 4 * 2**20
        assert ops["verify"].errors == 0 and ops["restore"].count == 2
        assert run.stats.restore.time_to_last_rank_s.median > 0
        assert len(run.resident_fraction) == 2   # cold: residency asked each iteration
        rows = archive_rows(spec, context, run)
        assert {row["op"] for row in rows} >= {"stat", "open", "read", "close", "restore"}
        assert all(row["valid"] == "true" and row["nranks"] == "1" for row in rows)
    assert "index" in {op.op for op in runs[-1].stats.ops}


def test_a_corrupt_byte_is_found_in_process(tmp_path: Path) -> None:
    spec = job(tmp_path)
    comm = SingleRank()
    prepare(comm, spec, show_progress=False)
    shard = tmp_path / "ckpt" / "sharded" / "shard-00000-of-00001.raw"
    with open(shard, "r+b") as stream:
        stream.seek(12345)
        byte = stream.read(1)
        stream.seek(12345)
        stream.write(bytes([byte[0] ^ 0xFF]))
    _, runs = run_job(comm, spec)
    by_layout = {run.layout: run for run in runs}
    assert by_layout["shared"].invalid_reason == ""
    assert "differ from the checkpoint" in by_layout["sharded"].invalid_reason
    assert any("first at offset 12345, last at offset 12345" in text
               for text in by_layout["sharded"].messages)
