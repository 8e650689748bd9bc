"""Read amplification measured under a real mpiexec, 4 ranks on one checkpoint of real
files: the archive says what each layout read from storage over what the job needed,
per iteration, at its worst node and at its worst rank (stampede.results.amplification).
Every rank's bytes are hash-checked, so the bytes counted are the bytes held."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi
MiB = 2**20
NRANKS, MODEL_BYTES = 4, 16 * MiB


def _rows(stampede, tmp_path: Path, layouts: list[str], replicas: int) -> list[dict[str, str]]:
    job = small_job(tmp_path, checkpoint={"layout": layouts, "replicas": replicas,
                                          "format": "safetensors"})
    for step in ("prepare", "run"):
        result = stampede(step, str(job), np=NRANKS)
        assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["valid"] for row in rows} == {"true"}
    assert {row["errors"] for row in rows} == {"0"}
    return rows


def _restores(stampede, tmp_path: Path, layouts: list[str], replicas: int,
              ) -> dict[str, dict[str, str]]:
    rows = _rows(stampede, tmp_path, layouts, replicas)
    return {row["layout"]: row for row in rows if row["op"] == "restore"}


def _amplification(row: dict[str, str]) -> tuple[float, float, float]:
    return (float(row["read_amplification"]), float(row["read_amplification_node_max"]),
            float(row["read_amplification_rank_max"]))


def test_one_replica_whole_file_reads_every_byte_four_times(stampede, tmp_path: Path) -> None:
    restores = _restores(stampede, tmp_path, ["shared", "sharded", "whole-file"], replicas=1)
    for layout, row in restores.items():
        assert int(row["needed_bytes"]) == MODEL_BYTES, layout   # the plan's, not the reads
    # (job, worst node: all 4 ranks share one host, worst rank)
    assert _amplification(restores["shared"]) == (1.0, 1.0, 1.0)
    assert _amplification(restores["sharded"]) == (1.0, 1.0, 1.0)
    assert _amplification(restores["whole-file"]) == (4.0, 4.0, 4.0)
    assert float(restores["whole-file"]["storage_bytes_per_iteration"]) == NRANKS * MODEL_BYTES
    # each rank holds its slice, not the file it read
    assert int(restores["whole-file"]["bytes_total"]) == MODEL_BYTES


def test_two_replicas_broadcast_reads_each_shard_once(stampede, tmp_path: Path) -> None:
    # 2 shards x 2 replicas: a shard's replicas read it twice unless one reads for both
    restores = _restores(stampede, tmp_path,
                         ["shared", "sharded", "broadcast", "striped", "whole-file"], replicas=2)
    for layout, row in restores.items():
        assert int(row["needed_bytes"]) == MODEL_BYTES, layout
    assert _amplification(restores["shared"]) == (2.0, 2.0, 1.0)
    assert _amplification(restores["sharded"]) == (2.0, 2.0, 1.0)
    # storage bytes only: the members' shards came over MPI, not from storage
    assert _amplification(restores["broadcast"]) == (1.0, 1.0, 1.0)
    assert _amplification(restores["striped"]) == (1.0, 1.0, 0.5)
    # every rank reads both shards of the file and keeps one
    assert _amplification(restores["whole-file"]) == (4.0, 4.0, 2.0)
    assert float(restores["broadcast"]["storage_bytes_per_iteration"]) == MODEL_BYTES
    assert float(restores["whole-file"]["storage_bytes_per_iteration"]) == NRANKS * MODEL_BYTES


def test_node_once_and_owners_read_each_byte_once_on_one_node(stampede, tmp_path: Path) -> None:
    """4 ranks on one host are one node: node-once's reader reads the file once for all 4
    (1.0x, but 4.0x at that rank: it reads the 4 slices, holds 1); owners reads each slice
    once, by its owner (1.0x everywhere). Storage bytes per iteration are the plan's."""
    from stampede.model.traffic import Geometry, layout_bytes

    rows = _rows(stampede, tmp_path, ["whole-file", "node-once", "owners"], replicas=1)
    restores = {row["layout"]: row for row in rows if row["op"] == "restore"}
    assert _amplification(restores["node-once"]) == (1.0, 1.0, 4.0)
    assert _amplification(restores["owners"]) == (1.0, 1.0, 1.0)
    assert _amplification(restores["whole-file"]) == (4.0, 4.0, 4.0)
    planned = {found.layout: found.storage_bytes
               for found in layout_bytes(Geometry(NRANKS), MODEL_BYTES / NRANKS)}
    for layout, row in restores.items():
        assert float(row["storage_bytes_per_iteration"]) == planned[layout], layout
        assert int(row["bytes_total"]) == MODEL_BYTES, layout   # each rank its own slice
    # every rank took part in its node's scatter, each of the 2 measured iterations, and
    # holds (sha256-checked) the slice it got there
    ops = {(row["layout"], row["op"]): row for row in rows}
    assert int(ops["node-once", "scatter"]["count"]) == NRANKS * 2
    assert ("owners", "scatter") not in ops and ("whole-file", "scatter") not in ops


def test_owners_with_two_replicas_reads_each_slice_once(stampede, tmp_path: Path) -> None:
    # 2 slices x 2 replicas: each slice's owner reads it, then broadcasts it to its holder
    restores = _restores(stampede, tmp_path, ["node-once", "owners"], replicas=2)
    assert _amplification(restores["owners"]) == (1.0, 1.0, 1.0)
    assert float(restores["owners"]["storage_bytes_per_iteration"]) == MODEL_BYTES
    # one node: its reader reads the 2 slices (the file) once and holds 1 of them
    assert _amplification(restores["node-once"]) == (1.0, 1.0, 2.0)
    assert float(restores["node-once"]["storage_bytes_per_iteration"]) == MODEL_BYTES
