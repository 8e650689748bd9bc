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


def _restores(stampede, tmp_path: Path, layouts: list[str], replicas: int,
              ) -> dict[str, dict[str, str]]:
    job = small_job(tmp_path, checkpoint={"layout": layouts, "replicas": replicas,
                                          "format": "safetensors"})
    for step in ("prepare", "run"):
        result = stampede(step, str(job), np=NRANKS)
        assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["valid"] for row in rows} == {"true"}
    assert {row["errors"] for row in rows} == {"0"}
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
