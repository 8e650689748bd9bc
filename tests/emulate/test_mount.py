"""stampede.emulate.mount: the emulator's driver, on a real mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stampede.emulate.mount import requests_per_op, running

pytestmark = [pytest.mark.usefixtures("no_mount_left")]


def test_requests_per_op_are_counted_with_time_on_top_of_the_service(fuse_ready: None,
                                                                    tmp_path: Path) -> None:
    """Up to 4 ms on top of each 10 ms request (jitter standing in for a busy machine): a
    stat of sharded/shard.raw is still 3 requests (LOOKUP sharded, LOOKUP the file, GETATTR),
    an open too (the two LOOKUPs and OPEN). A median rounded would count 4."""
    backing = tmp_path / "backing"
    (backing / "sharded").mkdir(parents=True)
    (backing / "sharded" / "shard.raw").write_bytes(os.urandom(1000))
    mountpoint = tmp_path / "mnt"
    with running(backing, mountpoint, "--service-s", "0.01", "--jitter-s", "0.004"):
        counted = requests_per_op(mountpoint / "sharded" / "shard.raw", 0.01)
    assert counted == {"stat": 3, "open": 3}
