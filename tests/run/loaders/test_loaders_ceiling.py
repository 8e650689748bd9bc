"""`stampede loaders` with run.ceiling = true under a real mpiexec: the node's raw-read
ceiling is measured once, before the first policy's restore, on the checkpoint's own
files (cold), and every restore row, the ceiling's and each loader's, says its GB/s per
node over it; the report adds the column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stampede.results.ceiling import REPEATS, STREAM_COUNTS
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.loaders import loader_package

pytestmark = pytest.mark.mpi
POLICIES = ["files", "tensor-slices"]


def test_loaders_against_the_raw_ceiling(stampede, tmp_path: Path, sharded: Path) -> None:
    loader_package("safetensors")
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": POLICIES, "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 0, "cache": "cold", "ceiling": True},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(sharded), "--loaders",
                      "safetensors", "--devices", "cpu", np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vs raw" in result.stdout
    archive = tmp_path / "results" / "loaders.csv"
    rows = read_archive(archive)
    document = json.loads((archive.parent / "loaders.runs" / f"{rows[0]['run_id']}.json")
                          .read_text())
    [node] = document["ceiling"]["ceiling"]["nodes"]   # the ceiling's run document's
    assert [read["streams"] for read in node["reads"]] == list(STREAM_COUNTS) * REPEATS
    # the first policy's files: the whole checkpoint, each byte read once per read
    files_bytes = sum(path.stat().st_size for path in sharded.glob("*.safetensors"))
    assert {(read["bytes_asked"], read["bytes_read"]) for read in node["reads"]} \
        == {(files_bytes, files_bytes)}
    restores = [row for row in rows if row["op"] == "restore"]
    assert {(row["tool"], row["layout"]) for row in restores} \
        == {(tool, policy) for tool in ("stampede", "safetensors") for policy in POLICIES}
    # one measurement for every policy and loader: the same ceiling on every row
    assert {float(row["ceiling_gbps"]) for row in restores} == {node["gbps"]}
    for row in restores:
        if row["tool"] == "safetensors":   # a loader: its assigned bytes over its time
            per_node = int(row["bytes_total"]) / int(row["nnodes"]) \
                / float(row["time_to_last_rank_s"]) / 1e9
            assert float(row["ceiling_efficiency"]) == pytest.approx(per_node / node["gbps"])
        else:
            assert float(row["ceiling_efficiency"]) > 0
