"""stampede's node-aware paths on real nodes: 2 emulated nodes x 2 ranks (network
namespaces, each with its hostname, address and a shaped NIC; tests/helpers/cluster.py),
the checkpoint on S3 on a storage host of its own. MPI sees two nodes (COMM_TYPE_SHARED,
processor names node0 and node1) and the ranks of two nodes talk over their NICs.

What stampede does per node is checked against what the storage host saw: the recorder in
front of S3 knows which node's address sent each request."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from stampede.checkpoint.plan import shard_path
from stampede.emulate.cluster import leftovers
from stampede.model.traffic import Geometry, layout_bytes
from stampede.results.definitions import BUCKET_ERROR
from tests.helpers.cluster import Nodes, cluster_ready
from tests.helpers.jobs import read_archive, write_job

pytestmark = pytest.mark.mpi
MiB = 2**20
LAYOUTS = ["shared", "sharded", "replicated", "broadcast", "striped"]


def _job(tmp_path: Path, nodes: Nodes, name: str, **sections: dict[str, object]) -> Path:
    base: dict[str, dict[str, object]] = {
        "target": nodes.s3_target(name),
        "checkpoint": {"size_per_rank": "2MiB", "block_size": "1MiB"},
        "run": {"iterations": 2, "warmup": 1, "verify": "xxh3"},
        "archive": {"path": str(tmp_path / "results" / f"{name}.csv")},
    }
    for section, table in sections.items():   # a target given replaces the S3 one
        base[section] = table if section == "target" else {**base.get(section, {}), **table}
    return write_job(tmp_path, name, **base)


def _prepared_and_run(nodes: Nodes, job: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    prepared = nodes.stampede("prepare", str(job), cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    result = nodes.stampede("run", str(job), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _sidecar(archive: Path, run_id: str) -> dict[str, object]:
    return json.loads((archive.parent / f"{archive.stem}.runs" / f"{run_id}.json").read_text())


def test_every_layout_holds_its_bytes_and_names_its_nodes(nodes: Nodes, tmp_path: Path) -> None:
    """Five layouts across two nodes (2 shards x 2 replicas: each node holds one replica):
    every rank's bytes hash right; archive, sidecar and report count 2 nodes of 2 ranks."""
    job = _job(tmp_path, nodes, "layouts", checkpoint={"layout": LAYOUTS, "replicas": 2})
    received_before, _ = nodes.cluster.link_bytes("node1")
    result = _prepared_and_run(nodes, job, tmp_path)
    received = nodes.cluster.link_bytes("node1")[0] - received_before
    archive = tmp_path / "results" / "layouts.csv"
    rows = read_archive(archive)
    for layout in LAYOUTS:
        ops = {row["op"]: row for row in rows if row["layout"] == layout}
        assert {row["valid"] for row in ops.values()} == {"true"}, layout
        assert int(ops["verify"]["errors"]) == 0 and int(ops["verify"]["count"]) == 4 * 2
        assert int(ops["restore"]["op_bytes"]) == 4 * 2 * 2 * MiB
    assert {(row["nranks"], row["nnodes"], row["ranks_per_node"], row["hosts"]) for row in rows} \
        == {("4", "2", "2", "node0 node1")}
    restore = next(row for row in rows if row["layout"] == "sharded" and row["op"] == "restore")
    assert {item.split("@")[1].split(":")[0] for item in restore["slowest_ranks"].split()} \
        <= {"node0", "node1"}
    sidecar = _sidecar(archive, rows[0]["run_id"])
    assert sidecar["hosts_by_rank"] == ["node0", "node0", "node1", "node1"]
    assert "4 ranks on 2 node(s) (2/node)" in result.stdout
    # node1's ranks got their bytes over node1's NIC: at least one replica (4 MiB) per
    # layout and iteration, warmup included
    assert received >= len(LAYOUTS) * 3 * 2 * 2 * MiB


def test_broadcast_by_node_reads_once_per_node_and_drop_caches_runs_once_per_node(
        nodes: Nodes, tmp_path: Path) -> None:
    """4 replicas of one shard, broadcast_group = node: one storage reader per node (not per
    rank, not one for the job), as the storage host saw it; run.drop_caches by one rank
    of each node, every iteration (the sidecar's count per rank)."""
    job = _job(tmp_path, nodes, "bynode",
               checkpoint={"layout": "broadcast", "replicas": 4, "broadcast_group": "node"},
               run={"cache": "cold", "drop_caches": True})
    nodes.recorder.clear()
    _prepared_and_run(nodes, job, tmp_path)
    shard = f"{nodes.store.bucket}/bynode/{shard_path(0, 1)}"
    gets = Counter(node for node, key in nodes.requests_by_node("GET") if key == shard)
    # 3 iterations (1 warmup) x 2 blocks of 1 MiB, once on each node
    assert gets == {"node0": 6, "node1": 6}
    archive = tmp_path / "results" / "bynode.csv"
    rows = {row["op"]: row for row in read_archive(archive)}
    assert int(rows["open"]["count"]) == 2 * 2          # 2 readers x 2 measured iterations
    assert int(rows["bcast"]["count"]) == 4 * 2
    sidecar = _sidecar(archive, rows["restore"]["run_id"])
    layouts = sidecar["layouts"]
    assert isinstance(layouts, dict)
    assert layouts["broadcast"]["cache_drops_by_rank"] == [3, 0, 3, 0]


def test_rank_shift_by_a_node_reads_what_the_other_node_wrote(nodes: Nodes,
                                                              tmp_path: Path) -> None:
    """run.rank_shift = ranks per node: every shard is read by a node other than the one
    that wrote it (prepare's PUTs and the run's GETs, by the address they came from)."""
    job = _job(tmp_path, nodes, "shifted", checkpoint={"layout": "sharded"},
               run={"rank_shift": 2})
    nodes.recorder.clear()
    nodes.stampede("prepare", str(job), cwd=tmp_path)
    writers = {key: node for node, key in nodes.requests_by_node("PUT")
               if "/sharded/" in key}
    nodes.recorder.clear()
    result = nodes.stampede("run", str(job), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    readers: dict[str, set[str]] = {}
    for node, key in nodes.requests_by_node("GET"):
        if "/sharded/" in key:
            readers.setdefault(key, set()).add(node)
    shards = [f"{nodes.store.bucket}/shifted/{shard_path(s, 4)}" for s in range(4)]
    assert all(shard in writers for shard in shards), writers
    assert {shard: readers.get(shard) for shard in shards} == {
        shard: {"node1" if writers[shard] == "node0" else "node0"} for shard in shards}


def test_read_amplification_per_node_counts_what_a_nodes_ranks_need(nodes: Nodes,
                                                                      tmp_path: Path) -> None:
    """2 shards x 2 replicas on 2 nodes: node h holds both shards (ranks 2h, 2h + 1). Sharded
    reads each shard once per node (2.0x for the job, 1.0x at each node); whole-file reads
    the whole file on every rank (4.0x, 2.0x a node, 2.0x a rank); broadcast by replica
    and owners read each shard once in all (1.0x); node-once reads the whole file once per
    node (2.0x, 1.0x a node, 2.0x at the node's reader, which holds one of its 2 shards).
    A POSIX target the nodes share."""
    job = _job(tmp_path, nodes, "amplified", target={"path": str(tmp_path / "ckpt")},
               checkpoint={"layout": ["sharded", "broadcast", "whole-file", "node-once",
                                      "owners"], "replicas": 2})
    _prepared_and_run(nodes, job, tmp_path)
    rows = read_archive(tmp_path / "results" / "amplified.csv")
    restores = {row["layout"]: row for row in rows if row["op"] == "restore"}
    assert {row["nnodes"] for row in restores.values()} == {"2"}
    found = {layout: (float(row["read_amplification"]), float(row["read_amplification_node_max"]),
                      float(row["read_amplification_rank_max"]))
             for layout, row in restores.items()}
    assert found == {"sharded": (2.0, 1.0, 1.0), "broadcast": (1.0, 1.0, 1.0),
                     "whole-file": (4.0, 2.0, 2.0), "node-once": (2.0, 1.0, 2.0),
                     "owners": (1.0, 1.0, 1.0)}
    assert {row["needed_bytes"] for row in restores.values()} == {str(4 * MiB)}
    # what storage served per iteration is what the traffic model places at 2 nodes of 2
    planned = {item.layout: item.storage_bytes
               for item in layout_bytes(Geometry(4, 2, replicas=2), 2 * MiB)}
    for layout, row in restores.items():
        assert float(row["storage_bytes_per_iteration"]) == planned[layout], layout


def test_a_node_killed_ends_the_job_and_leaves_the_archive_intact(nodes: Nodes,
                                                                  tmp_path: Path) -> None:
    """Every process of node1 is killed while the second layout runs: mpiexec ends, node0's
    ranks too (no hang), and the first layout's rows and sidecar are whole. (A POSIX
    target the nodes share: a node's death, not the object store's, is the subject.)"""
    job = _job(tmp_path, nodes, "killed", target={"path": str(tmp_path / "ckpt")},
               checkpoint={"layout": ["sharded", "broadcast"], "replicas": 2,
                           "size_per_rank": "1MiB"},
               run={"iterations": 40, "warmup": 0, "verify": "none", "jitter": "uniform:0.05"})
    assert nodes.stampede("prepare", str(job), cwd=tmp_path).returncode == 0
    archive = tmp_path / "results" / "killed.csv"
    mpiexec = nodes.launch_process("run", str(job), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (archive.exists() and "sharded" in archive.read_text()):
            assert mpiexec.poll() is None, "the run ended before the first layout was archived"
            assert time.monotonic() < deadline, "the first layout was never archived"
            time.sleep(0.2)
        time.sleep(0.5)                      # into the second layout
        assert nodes.cluster.kill_host("node1", signal.SIGKILL)
        status = mpiexec.wait(timeout=60)
        deadline = time.monotonic() + 60
        while nodes.cluster.processes("node0") and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if mpiexec.poll() is None:
            nodes.cluster.kill_host("head", signal.SIGKILL)
    assert status != 0
    assert nodes.cluster.processes("node1") == [] and nodes.cluster.processes("node0") == []
    rows = read_archive(archive)
    assert rows and {row["layout"] for row in rows} == {"sharded"}
    assert {row["valid"] for row in rows} == {"true"}
    assert int(next(r for r in rows if r["op"] == "restore")["count"]) == 4 * 40
    sidecar = _sidecar(archive, rows[0]["run_id"])
    assert list(sidecar["layouts"]) == ["sharded"]  # type: ignore[call-overload]


def test_a_nodes_ranks_share_one_time_axis(nodes: Nodes, tmp_path: Path) -> None:
    """Each node's ranks are on their node's axis (zero: its first barrier exit), in both
    sample modes: a rank that left late carries its delay; a node that started late as a
    whole does not (across nodes the clocks are taken as unrelated)."""
    script = Path(__file__).parents[1] / "helpers" / "node_axis_check.py"
    result = nodes.launch(sys.executable, str(script), cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["hosts"] == ["node0", "node0", "node1", "node1"]
    # node0: rank 0 at its node's zero, rank 1 left 40 ms after it; node1 alike (its own
    # zero, 100 ms after node0's); each restore 5 ms. Exact, and to the histogram's buckets
    assert found["exact"] == pytest.approx([5, 45, 5, 45], rel=1e-9)
    assert found["histogram"] == pytest.approx([5, 45, 5, 45], rel=BUCKET_ERROR)


def test_startup_across_nodes(tmp_path: Path) -> None:
    """`stampede startup` under the cluster's mpiexec (emulate-cluster -- COMMAND): its
    rows count 2 nodes of 2 ranks and name them."""
    cluster_ready()
    archive = tmp_path / "startup.csv"
    before = set(leftovers())          # other clusters' (this module's fixture)
    command = ('$STAMPEDE_CLUSTER_MPIEXEC -n $STAMPEDE_CLUSTER_NRANKS '
               f'{sys.executable} -m stampede startup --archive {archive}')
    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", "--nodes", "2",
                             "--ranks-per-node", "2", "--no-storage", "--", "sh", "-c", command],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(archive)
    assert {(row["nranks"], row["nnodes"], row["ranks_per_node"], row["hosts"]) for row in rows} \
        == {("4", "2", "2", "node0 node1")}
    assert "4 ranks on 2 node(s) (2/node)" in result.stdout
    assert set(leftovers()) <= before
