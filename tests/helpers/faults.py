"""The fault-injecting FUSE file system (tests/helpers/faultfs.py), mounted for a test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import requires

FAULTFS = Path(__file__).with_name("faultfs.py")


@contextmanager
def mounted(backing: Path, mountpoint: Path, *options: str) -> Iterator[Path]:
    """BACKING shown at MOUNTPOINT with the faults `options` ask for; always unmounted."""
    requires.fuse()
    mountpoint.mkdir()
    # its stderr to a file: a pipe nobody reads fills up with mfusepy's log (every injected
    # fault is one), and the daemon, blocked writing, stops serving
    log = mountpoint.with_suffix(".faultfs.log")
    with open(log, "wb") as stream:
        daemon = subprocess.Popen([sys.executable, str(FAULTFS), str(backing), str(mountpoint),
                                   *options], stderr=stream)
    try:
        deadline = time.monotonic() + 60
        while not os.path.ismount(mountpoint):
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"faultfs did not mount: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield mountpoint
    finally:
        unmount = shutil.which("fusermount") or shutil.which("fusermount3") or "umount"
        subprocess.run([unmount, "-u", str(mountpoint)] if "fuser" in unmount else
                       [unmount, str(mountpoint)], capture_output=True)
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
