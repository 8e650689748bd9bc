"""POSIX targets on a ceph-fuse mount of a real single-node Ceph
(tests/helpers/cephcluster.py), as stampede.filesystems' CephFS kinds meet them: the
MDS's own per-op counts around each layout (asked as the mount was made: the node's Ceph
config, CEPH_CONF here), and target.stripe_* applied to the directories stampede makes,
read back from the files prepare and save wrote (ceph.file.layout)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stampede import cephmds
from tests.backends.test_cephfs import completions, quickstart
from tests.helpers.cephcluster import CephCluster
from tests.helpers.jobs import read_archive, sidecars


@pytest.mark.mpi
def test_the_mds_counts_each_layout_of_a_run_on_a_ceph_fuse_mount(
        stampede, ceph_cluster: CephCluster, tmp_path: Path, no_mount_left: None) -> None:
    """Two ranks restore, then save, shared and sharded on a ceph-fuse mount: rank 0 asks
    the MDS for its perf dump before and after each layout (a libcephfs client of the
    node's config), the sidecar keeps what moved and the report prints it under the
    layout. A restore's opens are answered from the caps ceph-fuse holds (the MDS may
    count nothing); a save's lookups, creates and renames are the MDS's own."""
    archive = tmp_path / "results" / "fuse.csv"
    env = {"CEPH_CONF": str(ceph_cluster.conf)}
    with ceph_cluster.mounted(tmp_path / "mnt") as mountpoint:
        job = quickstart(str(mountpoint / f"mds-ck-{os.getpid()}"), archive)
        said = {}
        for command in ("prepare", "run", "save"):
            result = stampede(command, *job, np=2, env=env)
            assert result.returncode == 0, result.stdout + result.stderr
            said[command] = " ".join(result.stdout.split())
        assert completions(read_archive(archive)) == [
            ("restore", "shared"), ("restore", "sharded"), ("save", "shared"), ("save", "sharded")]
        restore, save = sidecars(archive)
        for layout in ("shared", "sharded"):
            for part, sidecar, command in (("layouts", restore, "run"), ("saves", save, "save")):
                counted = sidecar[part][layout]["mds_requests"]
                assert isinstance(counted, dict), counted
                print(command, layout, json.dumps(counted))
                assert counted["mount"] == str(mountpoint) and counted["requests"] >= 0
                assert f"{layout}: MDS requests (its own counters" in said[command]
            ops = save["saves"][layout]["mds_requests"]["ops"]
            assert ops["create"]["requests"] > 0 and ops["rename"]["requests"] > 0, ops
            assert save["saves"][layout]["mds_requests"]["requests"] > 0
        assert stampede("clean", *job, env=env).returncode == 0


def test_a_cluster_that_does_not_answer_leaves_a_layout_uncounted_with_a_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose monitor is not there (port 1): neither a libcephfs client nor the
    ceph CLI gets a dump within the bound, and the answer is one line saying so."""
    conf = tmp_path / "ceph.conf"
    conf.write_text("[global]\nmon host = v2:127.0.0.1:1\nauth client required = none\n")
    monkeypatch.setenv("CEPH_CONF", str(conf))
    said = cephmds.node_perf_dump(timeout_s=2)
    assert isinstance(said, str) and said.startswith("not counted: the MDS did not answer"), said


@pytest.mark.mpi
@pytest.mark.parametrize(("stripe_count", "stripe_size", "stripe_unit"), [
    (2, "1MiB", 1 << 20),
    # a unit that does not divide the default 4 MiB object: set through an object size
    # that fits both units (CephFS refuses any step leaving object_size % unit != 0)
    (3, "192KiB", 192 << 10),
])
def test_stripes_asked_are_the_layout_prepare_and_save_files_got(
        stampede, ceph_cluster: CephCluster, tmp_path: Path, no_mount_left: None,
        stripe_count: int, stripe_size: str, stripe_unit: int) -> None:
    """target.stripe_count and stripe_size on a ceph-fuse mount: the directories prepare
    and save make get them (ceph.dir.layout.*), and the files written in them show them
    read back (ceph.file.layout) in the run's and the save's sidecars."""
    archive = tmp_path / "results" / "striped.csv"
    with ceph_cluster.mounted(tmp_path / "mnt") as mountpoint:
        job = quickstart(str(mountpoint / f"striped-{os.getpid()}"), archive,
                         "--set", f"target.stripe_count={stripe_count}",
                         "--set", f"target.stripe_size={stripe_size}")
        for command in ("prepare", "run", "save"):
            result = stampede(command, *job, np=2)
            assert result.returncode == 0, result.stdout + result.stderr
        restore, save = sidecars(archive)
        for layout in ("shared", "sharded"):
            for part, sidecar in (("layouts", restore), ("saves", save)):
                read_back = sidecar[part][layout]["file_layouts"]
                assert isinstance(read_back, dict), read_back
                files = read_back["files"]
                print(part, layout, json.dumps(files))
                assert files, read_back
                for path, got in files.items():
                    assert isinstance(got, dict), (path, got)
                    assert (got["stripe_count"], got["stripe_unit"]) == \
                        (stripe_count, stripe_unit), (path, got)
                    assert got["object_size"] % stripe_unit == 0
        assert stampede("clean", *job).returncode == 0
