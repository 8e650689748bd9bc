"""CephFS targets (stampede.backends.cephfs) on a real single-node Ceph
(tests/helpers/cephcluster.py): the URL, the cluster's own helpers (a ceph-fuse mount, the
MDS's counters), a prepare, run, save, restore and clean through one libcephfs client per
rank under a real mpiexec, and a POSIX target on a ceph-fuse mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.backends.cephfs import parse_target
from stampede.errors import UsageError
from tests.helpers.cephcluster import CephCluster, is_mounted


@pytest.mark.parametrize(("target", "options", "parsed"), [
    ("cephfs://10.0.0.5/ck", {}, ("10.0.0.5", None, "/ck", None)),
    ("cephfs://admin@mon1:3300/a/b/", {}, ("mon1:3300", "admin", "/a/b", None)),
    ("cephfs://h:6789/ck?fs=second", {}, ("h:6789", None, "/ck", "second")),
    ("cephfs://h/ck", {"fs": "third", "timeout_s": 5}, ("h", None, "/ck", "third")),
    ("cephfs://[::1]:3300/ck", {}, ("[::1]:3300", None, "/ck", None)),
])
def test_the_url_names_the_monitor_user_directory_and_file_system(
        target: str, options: dict[str, object],
        parsed: tuple[str, str | None, str, str | None]) -> None:
    assert parse_target(target, options) == parsed


@pytest.mark.parametrize(("target", "options", "said"), [
    ("cephfs:///ck", {}, "names no monitor"),
    ("cephfs://h/", {}, "names no directory"),
    ("cephfs://h:port/ck", {}, "the port is not a number"),
    ("cephfs://u:secret@h/ck", {}, "a secret in the URL is refused"),
    ("cephfs://h/ck?fss=a", {}, "the query key 'fss' is not one of fs (did you mean \"fs\"?)"),
    ("cephfs://h/ck", {"timeout": 5},
     "storage_options: timeout do not apply to cephfs:// (it takes conf, keyring, fs, "
     "timeout_s) (did you mean \"timeout_s\"?)"),
    ("cephfs://h/ck", {"timeout_s": 0}, "timeout_s = 0: a whole number of seconds >= 1"),
    ("cephfs://h/ck", {"conf": "/nonexistent/ceph.conf"},
     "conf = '/nonexistent/ceph.conf': the path of a readable file"),
])
def test_a_target_that_cannot_be_is_refused_before_any_io(
        target: str, options: dict[str, object], said: str) -> None:
    """Refused before the library is asked anything (the monitor is not even reachable)."""
    with pytest.raises(UsageError, match="^.*" + _escaped(said)):
        open_backend(target, options)


def _escaped(text: str) -> str:
    import re
    return re.escape(text)


def test_a_dead_monitor_is_an_error_within_the_timeout_not_a_hang() -> None:
    """Nothing listens on port 1: the mount fails (ETIMEDOUT) after timeout_s."""
    with pytest.raises(OSError) as raised:
        open_backend("cephfs://127.0.0.1:1/ck", {"timeout_s": 2})
    assert raised.value.errno is not None


def test_the_cluster_serves_a_ceph_fuse_mount_and_the_mds_counts_its_requests(
        ceph_cluster: CephCluster, tmp_path: Path) -> None:
    """What a libcephfs client writes, a ceph-fuse mount reads; the MDS counted the
    creates, in its admin socket's perf dump and over the wire alike."""
    before = ceph_cluster.mds_perf()["req_create_latency"]["avgcount"]
    backend = open_backend(ceph_cluster.url(f"fuse-{os.getpid()}"))
    try:
        backend.ensure_root()
        for name in ("a.raw", "b.raw"):
            with backend.writer(name) as writer:
                writer.write_at(0, memoryview(bytearray(b"ceph" * 1024)))
        remote = backend.mds_perf()["mds_server"]
    finally:
        backend.client.release()
    after = ceph_cluster.mds_perf()["req_create_latency"]["avgcount"]
    assert after - before >= 2
    assert remote["req_create_latency"]["avgcount"] == after   # one MDS, one count
    mountpoint = tmp_path / "mnt"
    with ceph_cluster.mounted(mountpoint) as mounted:
        assert is_mounted(mounted)
        fs_types = {line.split()[1]: line.split()[2]
                    for line in Path("/proc/self/mounts").read_text().splitlines()}
        assert fs_types[str(mounted)] == "fuse.ceph-fuse"
        assert (mounted / f"fuse-{os.getpid()}" / "b.raw").read_bytes() == b"ceph" * 1024
    assert not is_mounted(mountpoint)
