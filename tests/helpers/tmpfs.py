"""A small file system of its own for a test (tmpfs, as root): a disk that fills up."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import requires


@contextmanager
def small_disk(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted at `where` (created), unmounted afterwards."""
    if os.geteuid() != 0:
        requires.unavailable("mounting a small tmpfs needs root", "ROOT")
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755",
                              "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode:
        requires.unavailable(f"cannot mount a tmpfs: {mounted.stderr.strip()}", "ROOT")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(disk: Path, leave_bytes: int) -> Path:
    """Fill the file system with one file until about `leave_bytes` are free."""
    status = os.statvfs(disk)
    free = status.f_bavail * status.f_frsize
    filler = disk / "filler"
    with open(filler, "wb") as stream:
        stream.write(b"\0" * max(free - leave_bytes, 0))
    return filler
