"""stampede.emulate.mount: the emulator's driver, on a real mount, and its log of requests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stampede.emulate.mount import probe_ops, read_requests, read_summary, requests_per_op, running

pytestmark = [pytest.mark.usefixtures("no_mount_left")]


def test_requests_per_op_are_read_from_the_emulators_log(fuse_ready: None, tmp_path: Path) -> None:
    """A stat of sharded/shard.raw is 3 requests (LOOKUP sharded, LOOKUP the file, GETATTR),
    an open too (the two LOOKUPs and OPEN): counted in the log the emulator keeps, however
    long the machine took around them (jitter stands in for a busy one)."""
    backing = tmp_path / "backing"
    (backing / "sharded").mkdir(parents=True)
    (backing / "sharded" / "shard.raw").write_bytes(os.urandom(1000))
    mountpoint = tmp_path / "mnt"
    with running(backing, mountpoint, "--service-s", "0.02", "--jitter-s", "0.008"):
        windows = probe_ops(mountpoint / "sharded" / "shard.raw")
    log = read_requests(mountpoint)
    counted = requests_per_op(log, windows)
    assert {op: [(s.op, s.paths) for s in served] for op, served in counted.items()} == {
        "stat": [("getattr", ("/sharded",)), ("getattr", ("/sharded/shard.raw",)),
                 ("getattr", ("/sharded/shard.raw",))],
        "open": [("getattr", ("/sharded",)), ("getattr", ("/sharded/shard.raw",)),
                 ("open", ("/sharded/shard.raw",))]}
    for served in log:          # each held its service time at least, in a slot of its own
        assert served.arrived_s <= served.taken_s and served.left_s - served.taken_s >= 0.02
        assert served.slot in range(4) and served.locks == ()
    summary = read_summary(mountpoint)
    assert summary["log"]["requests"] == len(log) == sum(op["count"] for op in summary["ops"].values())
    assert summary["log"]["dropped"] == 0
