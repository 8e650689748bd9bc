"""File-system kinds as data (stampede.filesystems): what each mount type means, asked of
its entry; striping where the kind does not stripe; the mount facts the sidecar keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stampede.filesystems import (
    KERNEL_NFS_RPCS,
    OTHER,
    TABLE,
    _ceph_steps,
    kind_for,
    kind_of,
    mount_facts,
    parse_ceph_layout,
    stripe,
)
from stampede.ops import OPS
from stampede.results.stats import layout_stats
from stampede.results.warnings import warnings_for
from stampede.sysinfo import mount_of


def test_every_kind_the_table_names_answers_for_itself() -> None:
    assert kind_of("lustre").striper is not None and kind_of("lustre").counters is not None
    assert kind_of("lustre").striper.how == "lfs setstripe"
    for ceph in ("ceph", "fuse.ceph-fuse"):
        assert kind_of(ceph).striper is not None and kind_of(ceph).striper.how == "ceph.dir.layout"
        counters = kind_of(ceph).counters
        assert counters is not None and counters.key == "mds_requests"   # the MDS's own
    for nfs in ("nfs", "nfs4"):
        counters = kind_of(nfs).counters
        assert counters is not None and counters.key == KERNEL_NFS_RPCS
        assert kind_of(nfs).options is not None and kind_of(nfs).striper is None
    for memory in ("tmpfs", "ramfs"):
        assert not kind_of(memory).evictable and not kind_of(memory).durable_fsync
    assert not kind_of("gpfs").evictable and kind_of("gpfs").durable_fsync
    assert not kind_of("fuse.ceph-fuse").evictable and kind_of("ceph").evictable
    for disk in ("ext4", "xfs", "btrfs"):
        kind = kind_of(disk)
        assert kind.evictable and kind.durable_fsync and kind.striper is kind.counters is None
    assert not kind_of("proc").holds_files and kind_of("ext4").holds_files
    assert kind_of("zfs") is OTHER and kind_of("") is OTHER and OTHER.evictable
    assert all(name == kind.name for name, kind in TABLE.items())


def test_a_path_is_asked_through_its_mount(tmp_path: Path) -> None:
    kind, mount = kind_for(tmp_path)
    assert mount == mount_of(tmp_path) and kind is kind_of(mount.fs_type)
    assert kind_for("/proc/self")[0].holds_files is False


def test_stripes_asked_where_the_kind_does_not_stripe_are_not_applied(tmp_path: Path) -> None:
    fs_type = mount_of(tmp_path).fs_type
    assume_no_striping(fs_type)
    assert stripe(tmp_path, 4, 1 << 20) == (
        f"target.stripe_* (stripe_count=4, stripe_size=1048576) not applied: {tmp_path} is "
        f"on {fs_type}, which does not stripe (Lustre and CephFS do)", False)
    assert stripe(tmp_path, -1, None).text.startswith(
        "target.stripe_* (stripe_count=-1, stripe_size=default) not applied")


def assume_no_striping(fs_type: str) -> None:
    if kind_of(fs_type).striper is not None:
        pytest.skip(f"the test directory is on {fs_type}, which stripes")


def test_the_lustre_kinds_striper_without_lfs_says_so(tmp_path: Path) -> None:
    """The striper of a Lustre mount, called as prepare and save call it, where there is no
    Lustre client: its own note, nothing applied."""
    striper = kind_of("lustre").striper
    assert striper is not None
    text, applied = striper.apply(tmp_path, 2, None)
    assert text.endswith("not applied: no `lfs` command here (not a Lustre client)")
    assert not applied
    assert striper.read([tmp_path]) == {}


def test_a_ceph_file_layout_value() -> None:
    assert parse_ceph_layout("stripe_unit=4194304 stripe_count=1 object_size=4194304 "
                             "pool=cephfs_data") == {
        "stripe_unit": 4194304, "stripe_count": 1, "object_size": 4194304, "pool": "cephfs_data"}


def test_mount_facts_keep_the_mount_and_no_facts_for_an_object_store(tmp_path: Path) -> None:
    facts = mount_facts(str(tmp_path))
    assert facts["target_mount"]["fs_type"] == mount_of(tmp_path).fs_type   # type: ignore[index]
    assert mount_facts("s3://bucket/ckpt") == {}


@pytest.mark.parametrize(("fs_type", "said"), [
    ("tmpfs", "cache=cold on tmpfs: pages cannot be evicted, the run is warm"),
    ("gpfs", "cache=cold on gpfs: GPFS's pagepool is not the page cache fadvise empties, "
             "the run is warm"),
    ("fuse.ceph-fuse", "cache=cold on fuse.ceph-fuse: ceph-fuse's own object cache cannot be "
                       "evicted, the run is warm"),
])
def test_a_cold_run_where_nothing_can_be_evicted_is_said_warm(fs_type: str, said: str) -> None:
    # one rank restoring 100 bytes in 0.1 s: the stats every warning is asked of
    stats = layout_stats("shared", np.array([[0, OPS.index("restore"), 0, 10**8, 100, 1, 0]]),
                         nranks=1)
    assert said in warnings_for(stats, "cold", 1, 1, fs_type, True)
    assert not [note for note in warnings_for(stats, "cold", 1, 1, "ext4", True)
                if "cache=cold" in note]


def test_cephs_stripe_unit_steps_keep_the_object_a_multiple_of_the_unit(tmp_path: Path) -> None:
    """The order of CephFS's xattrs (no cluster here: the directory has no ceph.dir.layout,
    so CephFS's defaults, 4 MiB units and objects, are the starting point): each step
    leaves object_size a multiple of stripe_unit, as CephFS demands of every one."""
    mib = 1 << 20
    assert _ceph_steps(tmp_path, mib) == [("object_size", 4 * mib), ("stripe_unit", mib)]
    assert _ceph_steps(tmp_path, 8 * mib) == [("object_size", 8 * mib), ("stripe_unit", 8 * mib)]
    assert _ceph_steps(tmp_path, 3 * mib) == [
        ("object_size", 12 * mib), ("stripe_unit", 3 * mib), ("object_size", 6 * mib)]
    assert _ceph_steps(tmp_path, None) == []
