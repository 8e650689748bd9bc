"""stampede.emulate.mount: the emulator's driver, on a real mount."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stampede.emulate.mount import requests_per_op, running

pytestmark = [pytest.mark.usefixtures("no_mount_left")]


def test_requests_per_op_are_counted_with_time_on_top_of_the_service(fuse_ready: None,
                                                                    tmp_path: Path) -> None:
    """Up to 8 ms on top of each 20 ms request (jitter standing in for a busy machine): a
    stat of sharded/shard.raw is still 3 requests (LOOKUP sharded, LOOKUP the file, GETATTR),
    an open too (the two LOOKUPs and OPEN). A median rounded would count 4 (3 x 24 ms);
    the fastest of 5 tries leaves ~15 ms for the machine's own delays (10 ms requests left
    ~2 ms, and a loaded 2-core machine took more)."""
    backing = tmp_path / "backing"
    (backing / "sharded").mkdir(parents=True)
    (backing / "sharded" / "shard.raw").write_bytes(os.urandom(1000))
    mountpoint = tmp_path / "mnt"
    with running(backing, mountpoint, "--service-s", "0.02", "--jitter-s", "0.008"):
        counted = requests_per_op(mountpoint / "sharded" / "shard.raw", 0.02)
    assert counted == {"stat": 3, "open": 3}
