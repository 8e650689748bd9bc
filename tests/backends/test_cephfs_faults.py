"""What a cephfs:// target does when the cluster fails it (a real single-node Ceph,
tests/helpers/cephcluster.py, under a real mpiexec): a save into a full pool, a full OSD
or past a directory's quota, and a client evicted by the MDS mid-restore and mid-save.
Each ends in one clear error naming the rank, the file and what happened, exit status
non-zero, no hang; the version published before stays published and restores; what was
archived stays. The session's cluster is whole again after each (quota lifted, ratios
back, blocklist cleared). (The MDS killed: tests/backends/test_cephfs.py.)"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from stampede.backends import open_backend
from tests.helpers.cephcluster import CephCluster, rank_pid, while_running
from tests.helpers.jobs import read_archive, small_job
from tests.run.test_save_faults import restores_verified

pytestmark = pytest.mark.mpi
MiB = 2**20
FULL = "No space left on device: the cluster is full: an OSD past its full ratio, or the " \
       "file's data pool at its quota"
EVICTED = "Cannot send after transport endpoint shutdown: this client was evicted by the MDS"


def said(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


def one_save_job(tmp_path: Path, target: str, iterations: int = 1) -> Path:
    """Sharded, 8 MiB in 1 MiB blocks, one version kept: each save command one version."""
    return small_job(tmp_path, target={"path": target},
                     checkpoint={"size": "8MiB", "layout": ["sharded"], "block_size": "1MiB"},
                     run={"iterations": iterations, "warmup": 0, "verify": "none"},
                     save={"keep": 1})


def in_fs(target: str, relpath: str = "") -> str:
    """A path of the file system ("/dir/...") from the target's URL."""
    return urlsplit(target).path.rstrip("/") + (f"/{relpath}" if relpath else "")


def published(target: str) -> tuple[str, dict[int, str]]:
    """The version `latest` names, and each version's state in the journal."""
    backend = open_backend(target)
    try:
        pointer = (backend.get_bytes("saves/sharded/latest") or b"").decode().strip()
        journal = json.loads(backend.get_bytes("stampede-saves.json") or b"{}")
    finally:
        backend.client.release()
    versions = journal["layouts"]["sharded"]["versions"]
    return pointer, {entry["version"]: entry["state"] for entry in versions}


def names(target: str) -> list[str]:
    backend = open_backend(target)
    try:
        return backend.names()
    finally:
        backend.client.release()


def cleaned_away(stampede, job: Path, target: str) -> None:
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert names(target) == []


def test_a_save_into_a_full_pool_names_rank_and_file_and_the_previous_version_stays(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path) -> None:
    """Version 1 saved; then the files of the layout's series go to a pool of their own,
    full (its quota reached, flagged by the monitors). Version 2's writes fail at once
    (ENOSPC) on both ranks, each said with its file and what it means; v2 is never
    published, v1 stays published and restores, and clean removes everything."""
    job = one_save_job(tmp_path, cephfs_target)
    first = stampede("save", str(job), np=2)
    assert first.returncode == 0, first.stdout + first.stderr
    with ceph_cluster.full_pool(in_fs(cephfs_target, "saves/sharded")):
        failed = stampede("save", str(job), np=2)
        text = said(failed)
        assert failed.returncode == 1, text
        for rank in (0, 1):
            assert (f"rank {rank}: write saves/sharded/v000002/sharded/.shard-0000{rank}"
                    in text), text
        assert FULL in text and "Traceback" not in text, text
        assert "save finished with errors, archived as invalid" in failed.stderr
        assert published(cephfs_target) == ("v000001", {1: "complete", 2: "invalid"})
        saves = [row for row in read_archive(tmp_path / "results" / "job.csv")
                 if row["op"] == "save"]
        assert [row["valid"] for row in saves] == ["true", "false"]
        restores_verified(stampede, job, "v000001")     # reading a full pool is allowed
        cleaned_away(stampede, job, cephfs_target)


def test_a_full_osd_refuses_the_save_before_it_writes_and_the_version_stays(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path) -> None:
    """The OSD itself full (its full ratio under what it holds: every pool full): the
    save cannot even write its lock's record and says so in one line, exit 2, nothing
    written. Once the OSD has room again, v1 is still the published version and restores.
    (Ceph 16 also fails a new client's reads while the OSD is full, with EIO: a restore
    then fails its reads, as it would on such a cluster.)"""
    job = one_save_job(tmp_path, cephfs_target)
    first = stampede("save", str(job), np=2)
    assert first.returncode == 0, first.stdout + first.stderr
    before = names(cephfs_target)
    with ceph_cluster.osd_full():
        refused = stampede("save", str(job), np=2)
    text = said(refused)
    assert refused.returncode == 2, text
    assert "cannot create its lock stampede-lock" in text and FULL in text, text
    assert "Traceback" not in text, text
    assert names(cephfs_target) == before
    assert published(cephfs_target) == ("v000001", {1: "complete"})
    restores_verified(stampede, job, "v000001")
    cleaned_away(stampede, job, cephfs_target)


def test_a_save_past_a_directory_quota_names_rank_and_file_and_the_previous_version_stays(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path) -> None:
    """Version 1 (8 MiB) saved; then a CephFS quota of 9 MiB on its series' directory,
    once the MDS counts v1's bytes there (the clients check a write against that count).
    Version 2's first writes pass the quota: EDQUOT on both ranks, said with the file and
    what it means; v2 never published, v1 stays published and restores."""
    job = one_save_job(tmp_path, cephfs_target)
    first = stampede("save", str(job), np=2)
    assert first.returncode == 0, first.stdout + first.stderr
    series = in_fs(cephfs_target, "saves/sharded")
    deadline = time.monotonic() + 30
    while int(ceph_cluster.get_xattr(series, "ceph.dir.rbytes")) < 8 * MiB:
        assert time.monotonic() < deadline, "the MDS never counted v1's bytes"
        time.sleep(0.25)
    ceph_cluster.set_xattr(series, "ceph.quota.max_bytes", str(9 * MiB))
    failed = stampede("save", str(job), np=2)
    text = said(failed)
    assert failed.returncode == 1, text
    for rank in (0, 1):
        assert f"rank {rank}: write saves/sharded/v000002/sharded/.shard-0000{rank}" in text, text
    assert ("Disk quota exceeded: a CephFS quota is reached (ceph.quota.max_bytes or "
            "max_files of this directory or one above it)") in text, text
    assert "Traceback" not in text, text
    assert published(cephfs_target) == ("v000001", {1: "complete", 2: "invalid"})
    restores_verified(stampede, job, "v000001")
    cleaned_away(stampede, job, cephfs_target)


@pytest.fixture
def blocklist_cleared(ceph_cluster: CephCluster) -> Iterator[None]:
    yield
    ceph_cluster.clear_blocklist()


def test_a_client_evicted_mid_restore_ends_the_run_in_one_line_naming_the_eviction(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path,
        blocklist_cleared: None) -> None:
    """Two ranks restore iteration after iteration; rank 1's client is evicted. Its next
    call fails (ESHUTDOWN: the MDS closed its session, the OSDs refuse its address): the
    run stops at that iteration, archived invalid with the iterations before it, the line
    naming rank 1, the op, the file and the eviction; exit 1; the run archived before
    stays as it was."""
    job = small_job(tmp_path, target={"path": cephfs_target},
                    checkpoint={"size": "16MiB", "layout": ["sharded"], "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 0, "verify": "none"})
    for command in ("prepare", "run"):
        result = stampede(command, str(job), np=2)
        assert result.returncode == 0, result.stdout + result.stderr
    archive = tmp_path / "results" / "job.csv"
    archived = read_archive(archive)
    evicted: list[int] = []
    status, out, err = while_running(
        ["run", str(job), "--set", "run.iterations=20000"], tmp_path,
        lambda running: evicted.extend(ceph_cluster.evict_process(rank_pid(running.pid, 1))))
    text = " ".join((out + err).split())
    assert evicted, "rank 1 had no client of the MDS"
    assert status == 1, text
    assert "rank 1: " in text and EVICTED in text and "Traceback" not in text, text
    assert "run finished with errors, archived as invalid" in err, err
    rows = read_archive(archive)
    assert rows[:len(archived)] == archived
    restore = [row for row in rows[len(archived):] if row["op"] == "restore"]
    assert len(restore) == 1 and restore[0]["valid"] == "false", restore
    assert 1 <= int(restore[0]["iterations"]) < 20000   # the iterations before it kept
    cleaned_away(stampede, job, cephfs_target)


def test_a_client_evicted_mid_save_leaves_the_published_version(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path,
        blocklist_cleared: None) -> None:
    """Two ranks save version after version (one kept); rank 1's client is evicted. Its
    next call fails, said with the eviction; the version it was writing is never
    published, the last complete one stays published and restores (new clients)."""
    job = one_save_job(tmp_path, cephfs_target)
    first = stampede("save", str(job), np=2)
    assert first.returncode == 0, first.stdout + first.stderr
    evicted: list[int] = []
    status, out, err = while_running(
        ["save", str(job), "--set", "run.iterations=20000"], tmp_path,
        lambda running: evicted.extend(ceph_cluster.evict_process(rank_pid(running.pid, 1))))
    text = " ".join((out + err).split())
    assert evicted and status == 1, text
    assert "rank 1: " in text and EVICTED in text and "Traceback" not in text, text
    pointer, states = published(cephfs_target)
    assert states[int(pointer.removeprefix("v"))] == "complete"
    # the version it was writing, if the eviction came before the next one was recorded
    # (not while the ranks released an old one after a publish), is not complete
    newest = int(pointer.removeprefix("v"))
    assert all(state != "complete" for version, state in states.items() if version > newest)
    restores_verified(stampede, job, pointer)
    cleaned_away(stampede, job, cephfs_target)
