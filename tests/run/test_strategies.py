"""Restore strategies under a real mpiexec (4 ranks = 2 shards x 2 replicas): every rank
ends holding exactly its shard (hash-checked) and storage ops match what each promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.run.layout import jitter_s
from stampede.spec import load_job
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi
MiB = 2**20
LAYOUTS = ["shared", "sharded", "replicated", "broadcast", "striped", "metadata-first",
           "list-first", "list-bcast"]
NRANKS, REPLICAS, ITERATIONS = 4, 2, 2
SHARD_BYTES = 8 * MiB          # 16 MiB model / 2 shards
BLOCKS_PER_SHARD = 8           # 1 MiB blocks


@pytest.fixture(scope="module")
def all_layouts(tmp_path_factory) -> tuple[list[dict[str, str]], str]:
    """One invocation restoring every layout on one target: the comparison job."""
    import subprocess
    import sys

    from stampede.launcher import find_mpiexec

    tmp_path = tmp_path_factory.mktemp("strategies")
    job = small_job(tmp_path, checkpoint={"layout": LAYOUTS, "replicas": REPLICAS,
                                          "index_size": "96KiB"})
    command = [find_mpiexec(), "-n", str(NRANKS), sys.executable, "-m", "stampede"]
    for step in ("prepare", "run"):
        result = subprocess.run([*command, step, str(job)], capture_output=True, text=True,
                                timeout=180, cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
    return read_archive(tmp_path / "results" / "job.csv"), result.stdout


def ops_of(rows: list[dict[str, str]], layout: str) -> dict[str, dict[str, str]]:
    return {row["op"]: row for row in rows if row["layout"] == layout}


def count(ops: dict[str, dict[str, str]], op: str) -> int:
    return int(ops[op]["count"]) if op in ops else 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_rank_holds_its_shard_and_the_run_is_valid(all_layouts, layout: str) -> None:
    rows, _ = all_layouts
    ops = ops_of(rows, layout)
    assert all(row["valid"] == "true" and row["errors"] == "0" for row in ops.values())
    # one verify per rank and iteration: the held shard (exchange layouts) or the bytes read
    assert count(ops, "verify") == NRANKS * ITERATIONS
    assert int(ops["verify"]["op_bytes"]) == NRANKS * ITERATIONS * SHARD_BYTES
    assert int(ops["restore"]["op_bytes"]) == NRANKS * ITERATIONS * SHARD_BYTES


@pytest.mark.parametrize(("layout", "readers", "blocks_each"), [
    ("replicated", NRANKS, BLOCKS_PER_SHARD),            # every replica reads its shard
    ("sharded", NRANKS, BLOCKS_PER_SHARD),
    ("broadcast", NRANKS // REPLICAS, BLOCKS_PER_SHARD),  # one read per group
    ("striped", NRANKS, BLOCKS_PER_SHARD // REPLICAS),   # each replica 1/R of the shard
])
def test_storage_ops_match_what_the_strategy_promises(all_layouts, layout: str, readers: int,
                                                      blocks_each: int) -> None:
    ops = ops_of(all_layouts[0], layout)
    assert count(ops, "open") == readers * ITERATIONS
    assert count(ops, "read") == readers * blocks_each * ITERATIONS
    storage_bytes = readers * blocks_each * MiB
    assert float(ops["restore"]["storage_bytes_per_iteration"]) == storage_bytes


def test_exchanges_are_timed_apart_from_storage(all_layouts) -> None:
    rows = all_layouts[0]
    broadcast, striped = ops_of(rows, "broadcast"), ops_of(rows, "striped")
    assert count(broadcast, "bcast") == NRANKS * ITERATIONS
    assert count(striped, "allgather") == NRANKS * ITERATIONS
    for ops in (broadcast, striped):
        assert count(ops, "wait") == NRANKS * ITERATIONS
        restore = ops["restore"]
        assert float(restore["network_s"]) > 0 and float(restore["storage_s"]) > 0
    assert "bcast" not in ops_of(rows, "replicated")


def test_index_and_listing_ops(all_layouts) -> None:
    rows = all_layouts[0]
    index = ops_of(rows, "metadata-first")["index"]
    assert int(index["count"]) == NRANKS * ITERATIONS
    assert int(index["op_bytes"]) == NRANKS * ITERATIONS * 96 * 1024
    assert count(ops_of(rows, "list-first"), "list") == NRANKS * ITERATIONS
    assert count(ops_of(rows, "list-bcast"), "list") == ITERATIONS  # rank 0 alone
    assert count(ops_of(rows, "list-bcast"), "bcast") == NRANKS * ITERATIONS


def test_the_report_ranks_layouts_by_time_to_last_rank(all_layouts) -> None:
    rows, stdout = all_layouts
    restores = {row["layout"]: float(row["time_to_last_rank_s"])
                for row in rows if row["op"] == "restore"}
    table = stdout[stdout.index("Restore: time until"):stdout.index("slowest ranks")]
    shown = [line.split()[0] for line in table.splitlines()
             if line.split() and line.split()[0] in LAYOUTS]
    assert shown == sorted(restores, key=restores.get)


def test_a_missing_shard_under_list_first_is_named(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "list-first"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    (tmp_path / "ckpt" / "sharded" / "shard-00001-of-00002.raw").unlink()
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert ("rank 1: list sharded: sharded/shard-00001-of-00002.raw is not in the listing"
            in result.stdout)


def test_jitter_delays_each_rank_inside_the_restore(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"},
                    run={"jitter": "uniform:0.05", "iterations": 3})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stderr
    ops = ops_of(read_archive(tmp_path / "results" / "job.csv"), "sharded")
    assert count(ops, "jitter") == 2 * 3
    # each rank's delay is drawn from run.seed: the sleeps took at least those (a floor)
    spec = load_job(job)
    delays = [jitter_s(spec, rank, iteration) for rank in range(2) for iteration in range(3)]
    assert 0 < max(delays) < 0.05
    assert float(ops["jitter"]["lat_min_s"]) >= min(delays)
    assert float(ops["jitter"]["lat_max_s"]) >= max(delays)
    assert float(ops["restore"]["lat_max_s"]) >= float(ops["jitter"]["lat_max_s"])
    assert ops["restore"]["jitter"] == "uniform:0.05"


def test_a_member_whose_leader_failed_does_not_count_as_restored(stampede, tmp_path: Path) -> None:
    import os
    job = small_job(tmp_path, checkpoint={"layout": "broadcast", "replicas": 2},
                    run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    os.truncate(tmp_path / "ckpt" / "sharded" / "shard-00000-of-00001.raw", 3 * MiB)
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    restore = ops_of(read_archive(tmp_path / "results" / "job.csv"), "broadcast")["restore"]
    assert restore["errors"] == "2" and restore["count"] == "0"   # the leader and its member
    assert "2 rank(s) did not hold all their bytes" in result.stderr
