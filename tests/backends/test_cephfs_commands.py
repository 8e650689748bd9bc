"""The commands beyond prepare, run, save and clean on a cephfs:// target (a real
single-node Ceph, tests/helpers/cephcluster.py; one libcephfs client per rank): `cycle`
(saves, then the published versions restored by other ranks), an existing checkpoint
(a published safetensors model put on CephFS, restored with --checkpoint cephfs://...),
and `rejoin` with CephFS as its storage tier (three named nodes: the spare from its peer,
the restart from CephFS). (prepare/run/save/clean: tests/backends/test_cephfs.py.)"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.existing.scan import scan
from tests.backends.test_cephfs_faults import names
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, write_job
from tests.run.test_rejoin import environment, rejoin_command

pytestmark = pytest.mark.mpi
MiB = 2**20


def test_a_cycle_saves_then_restores_the_published_versions_through_cephfs(
        stampede, cephfs_target: str, tmp_path: Path) -> None:
    """`stampede cycle`: each layout saved twice (one version kept), then the
    published version restored with the ranks shifted (rank 0 reads rank 1's shard),
    every byte checked; then cleaned away."""
    job = write_job(tmp_path, "cycle", target={"path": cephfs_target},
                    checkpoint={"size": "8MiB", "layout": ["shared", "sharded"],
                                "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 0, "verify": "xxh3"},
                    save={"keep": 1, "validate": "xxh3"},
                    archive={"path": str(tmp_path / "results" / "cycle.csv")})
    result = stampede("cycle", str(job), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "cycle.csv")
    done = [(row["op"], row["layout"], row["valid"], row["backend"]) for row in rows
            if row["op"] in ("save", "restore")]
    assert done == [("save", "shared", "true", "cephfs"), ("save", "sharded", "true", "cephfs"),
                    ("restore", "shared", "true", "cephfs"),
                    ("restore", "sharded", "true", "cephfs")]
    restores = [row for row in rows if row["op"] == "restore"]
    assert {row["restored_from"] for row in restores} == \
        {"saves/shared/v000002", "saves/sharded/v000002"}
    assert {row["rank_shift"] for row in restores} == {"1"}
    reads = [row for row in rows if row["op"] == "read"]
    # 2 restores of 8 MiB in 1 MiB blocks per layout
    assert [(row["count"], row["op_bytes"]) for row in reads] == [("16", str(16 * MiB))] * 2
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert names(cephfs_target) == []


def test_an_existing_safetensors_checkpoint_restored_from_cephfs(
        stampede, cephfs_target: str, tmp_path: Path, published: Path) -> None:
    """The published model.safetensors put on CephFS as it is; scanned there as locally
    (but for its root); restored at 2 ranks whole files and tensor slices, every tensor
    byte read once, each rank's hashes those of the local file's bytes."""
    backend = open_backend(cephfs_target)
    try:
        with backend.writer("model.safetensors") as writer:
            writer.write_at(0, memoryview(bytearray(published.read_bytes())))
    finally:
        backend.client.release()
    found = scan(cephfs_target)
    assert dataclasses.replace(found, root=str(published.parent)) == scan(str(published.parent))
    job = write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["files", "tensor-slices"], "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 1, "verify": "sha256"},
                    archive={"path": str(tmp_path / "results" / "existing.csv")})
    result = stampede("run", str(job), "--checkpoint", cephfs_target, np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {(row["backend"], row["format"], row["checkpoint_source"], row["valid"])
            for row in rows} == {("cephfs", "safetensors", "existing", "true")}
    total = scan(str(published.parent)).total_bytes
    for policy, recorded in read_digests(tmp_path).items():
        assert recorded, policy
        accounted(published.parent, recorded, str(published.parent))
        restore = next(row for row in rows if row["layout"] == policy and row["op"] == "restore")
        assert int(restore["bytes_total"]) == total
    assert names(cephfs_target) == ["model.safetensors"]     # read, never written to


# three named nodes: tests/run/test_rejoin.py's command (hydra's ssh launcher through a
# script that runs each node's ranks in a UTS namespace of its own: MPI sees three hosts)


def test_rejoin_with_cephfs_as_the_storage_tier(cephfs_target: str, tmp_path: Path) -> None:
    """`stampede rejoin` on nodeA, nodeB, nodeC (one rank each): the save in tiers with
    CephFS as its storage tier, node B lost, the spare on C from its peer; the full
    restart from CephFS beside it; every shard checked; nothing left on CephFS or on the
    local tiers."""
    job = write_job(tmp_path, "tiers", target={"path": cephfs_target},
                    checkpoint={"size_per_rank": "4MiB", "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 1, "verify": "xxh3"},
                    tiers={"local_dir": str(tmp_path / "local")},
                    archive={"path": str(tmp_path / "results" / "tiers.csv")})
    result = subprocess.run(rejoin_command(tmp_path, str(job)), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=environment())
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    done = {(row["op"], row["layout"]): row for row in rows if row["op"] in ("save", "restore")}
    assert sorted(done) == [("restore", "rejoin"), ("restore", "restart"),
                            ("save", "tier-local"), ("save", "tier-peer"),
                            ("save", "tier-storage")]
    assert all(row["valid"] == "true" and row["backend"] == "cephfs" for row in done.values())
    # the restart: both working ranks' 4 MiB from CephFS, 2 iterations, in 1 MiB reads
    restart_reads = next(row for row in rows if row["op"] == "read" and row["layout"] == "restart")
    assert (restart_reads["count"], restart_reads["op_bytes"]) == ("16", str(16 * MiB))
    storage_writes = next(row for row in rows
                          if row["op"] == "write" and row["layout"] == "tier-storage")
    assert int(storage_writes["op_bytes"]) == 2 * 4 * MiB     # the measured version's shards
    assert names(cephfs_target) == []
    assert not (tmp_path / "local").exists() or not any((tmp_path / "local").rglob("*"))
