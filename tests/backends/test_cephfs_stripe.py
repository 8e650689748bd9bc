"""target.stripe_count and stripe_size on cephfs:// targets (stampede.backends.cephfs):
the directories prepare and save make through libcephfs get ceph.dir.layout.* (the values
decided by the CephFS striper a ceph-fuse mount's directories get, stampede.filesystems),
and the files written in them show it read back (ceph.file.layout) in the sidecars'
file_layouts, on a real single-node Ceph (tests/helpers/cephcluster.py), 2 ranks."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from stampede.filesystems import backend_striping, stripe_in
from stampede.targets import REGISTRY, Capabilities
from tests.backends.test_cephfs import completions, quickstart
from tests.helpers.cephcluster import CephCluster
from tests.helpers.jobs import read_archive, sidecars

MIB = 1 << 20


@pytest.mark.mpi
@pytest.mark.parametrize(("count", "size", "unit", "objects"), [
    (2, "1MiB", MIB, 4 * MIB),
    # a unit that does not divide the default 4 MiB object: set through an object size
    # that fits both units, then the smallest multiple of the unit not below 4 MiB
    (3, "192KiB", 192 << 10, 4325376),
])
def test_stripes_asked_are_the_layout_prepare_and_save_files_got_through_libcephfs(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path,
        count: int, size: str, unit: int, objects: int) -> None:
    """stripe_count 2, stripe 1 MiB (and 3, 192 KiB): prepare's directories and the save's
    series directory are striped through rank 0's client before any file is made in
    them; every file read back (prepare's in the run's sidecar, the saved version's in
    the save's) has the layout asked, as on a ceph-fuse mount (test_ceph_mount), and the
    directories themselves show it (asked of the cluster apart)."""
    archive = tmp_path / "results" / "striped.csv"
    job = quickstart(cephfs_target, archive, "--set", f"target.stripe_count={count}",
                     "--set", f"target.stripe_size={size}")
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
                assert got == {"stripe_unit": unit, "stripe_count": count,
                               "object_size": objects, "pool": "cephfs_data"}, (path, got)
                counted += 1
    assert counted >= 4   # at least one file per layout, restore and save
    applied = f"stripe_count={count}, stripe_unit={unit} applied to"
    assert f"{applied} {root}/" in said["prepare"]
    series = f"{root}/saves/sharded"
    assert f"{applied} {series}" in said["save"]
    # what was done is the save's note, never a warning (a stripe not applied is one)
    for row in read_archive(archive):
        if row["phase"] == "save":
            done = f"{applied} {root}/saves/{row['layout']}"
            assert done in row["notes"] and applied not in row["warnings"], row
    assert ceph_cluster.get_xattr(series, "ceph.dir.layout.stripe_count") == str(count)
    assert ceph_cluster.get_xattr(series, "ceph.dir.layout.stripe_unit") == str(unit)
    assert ceph_cluster.get_xattr(series, "ceph.dir.layout.object_size") == str(objects)
    # the run's report shows the layouts read back, as a mount's does
    assert f"stripe_count={count} object_size={objects} pool=cephfs_data (ceph.dir.layout)" \
        in said["run"]
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


class Described(NamedTuple):
    """What stampede.filesystems asks of a backend: its name and its capabilities."""

    name: str
    capabilities: Capabilities


@pytest.mark.parametrize("name", ["nfs", "s3"])
def test_a_backend_that_does_not_stripe_says_so_instead_of_ignoring_the_stripes(
        name: str) -> None:
    """stripe_in, as prepare calls it for a target without a local mount: nfs:// and
    s3:// have no striper, and the note says the stripes were not applied."""
    backend = Described(name, REGISTRY[name].capabilities)
    assert backend_striping(backend) is None
    assert stripe_in(backend, "", 2, MIB) == (
        "target.stripe_* (stripe_count=2, stripe_size=1048576) not applied: the "
        f"{name} backend does not stripe (CephFS and Lustre mounts, and cephfs://, do)", False)
    assert REGISTRY["cephfs"].capabilities.stripes
