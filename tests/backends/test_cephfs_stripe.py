"""target.stripe_count and stripe_size on cephfs:// targets (stampede.backends.cephfs):
the directories prepare and save make through libcephfs get ceph.dir.layout.* (the values
decided by the CephFS striper a ceph-fuse mount's directories get, stampede.filesystems),
and the files written in them show it read back (ceph.file.layout) in the sidecars'
file_layouts, on a real single-node Ceph (tests/helpers/cephcluster.py), 2 ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backends.test_cephfs import completions, quickstart
from tests.helpers.cephcluster import CephCluster
from tests.helpers.jobs import read_archive

MIB = 1 << 20


def sidecars(archive: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text())
            for path in sorted((archive.parent / f"{archive.stem}.runs").glob("*.json"))]


@pytest.mark.mpi
def test_stripes_asked_are_the_layout_prepare_and_save_files_got_through_libcephfs(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path) -> None:
    """stripe_count 2, stripe 1 MiB: prepare's directories and the save's series directory
    are striped through rank 0's client before any file is made in them; every file read
    back (4 per layout: prepare's in the run's sidecar, the saved version's in the
    save's) has stripe_count=2 stripe_unit=1048576 object_size=4194304, and the
    directories themselves show the layout set (asked of the cluster apart)."""
    archive = tmp_path / "results" / "striped.csv"
    job = quickstart(cephfs_target, archive, "--set", "target.stripe_count=2",
                     "--set", "target.stripe_size=1MiB")
    said = {}
    for command in ("prepare", "run", "save"):
        result = stampede(command, *job, np=2)
        assert result.returncode == 0, result.stdout + result.stderr
        said[command] = " ".join(result.stdout.split())
    assert completions(read_archive(archive)) == [
        ("restore", "shared"), ("restore", "sharded"), ("save", "shared"), ("save", "sharded")]
    root = "/" + cephfs_target.split("/", 3)[3]
    restore, save = sidecars(archive)
    counted = 0
    for layout in ("shared", "sharded"):
        for part, sidecar in (("layouts", restore), ("saves", save)):
            said_there = sidecar[part][layout]   # type: ignore[index]
            assert "mds_requests" in said_there   # the MDS's counts kept beside them
            read_back = said_there["file_layouts"]
            assert isinstance(read_back, dict), read_back
            assert read_back["how"] == "ceph.dir.layout"
            files = read_back["files"]
            assert files, read_back
            for path, got in files.items():
                assert path.startswith(root + "/"), path   # a path in the file system
                assert got == {"stripe_unit": MIB, "stripe_count": 2,
                               "object_size": 4 * MIB, "pool": "cephfs_data"}, (path, got)
                counted += 1
    assert counted >= 4   # at least one file per layout, restore and save
    assert f"stripe_count=2, stripe_unit=1048576 applied to {root}/" in said["prepare"]
    series = f"{root}/saves/sharded"
    assert f"stripe_count=2, stripe_unit=1048576 applied to {series}" in said["save"]
    assert ceph_cluster.get_xattr(series, "ceph.dir.layout.stripe_count") == "2"
    assert ceph_cluster.get_xattr(series, "ceph.dir.layout.stripe_unit") == str(MIB)
    # the run's report shows the layouts read back, as a mount's does
    assert "stripe_count=2 object_size=4194304 pool=cephfs_data (ceph.dir.layout)" in \
        said["run"]
    assert stampede("clean", *job).returncode == 0


@pytest.mark.parametrize(("setting", "said"), [
    ("target.stripe_count=-1", "target.stripe_count = -1 on 'cephfs://"),
    ("target.stripe_size=100KiB", "must be a multiple of 64 KiB"),
])
def test_a_stripe_cephfs_cannot_take_is_refused_before_any_io(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path,
        setting: str, said: str) -> None:
    """Lustre's "every OST" (-1) on cephfs://, or a stripe that is not a multiple of
    64 KiB: one line, exit 2, the target never made (the cluster asked apart)."""
    archive = tmp_path / "results" / "refused.csv"
    refused = stampede("prepare", *quickstart(cephfs_target, archive, "--set", setting))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert said in " ".join(refused.stderr.split())
    with ceph_cluster.client() as mount, pytest.raises(FileNotFoundError):
        mount.stat(("/" + cephfs_target.split("/", 3)[3]).encode())
    assert not archive.exists()
