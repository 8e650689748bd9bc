"""Driving `stampede emulate-mds` from a script or a test: start it, wait for its mount,
stop it, and never leave a mount behind; plus how many emulator requests an op costs.

One copy of this for bench/model_vs_emulator.py and the tests that mount the emulator.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MOUNT_WAIT_S = 15.0


def fuse_unavailable() -> str:
    """Why FUSE cannot be used here, or "" when it can (root, /dev/fuse, fusepy, libfuse2)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if importlib.util.find_spec("fuse") is None:
        return "fusepy is not installed (pip install -e '.[emulate]')"
    try:
        import fuse  # type: ignore[import-untyped]  # noqa: F401 - loads libfuse.so.2
    except OSError as error:
        return f"libfuse 2 is missing ({error}; apt-get install -y libfuse2)"
    if os.geteuid() != 0:
        return "mounting FUSE file systems needs root here"
    return ""


def is_mounted(mountpoint: Path) -> bool:
    """From the mount table (os.path.ismount says False for a stale FUSE mount)."""
    with open("/proc/self/mounts") as table:
        return any(line.split()[1] == str(mountpoint) for line in table)


def force_unmount(mountpoint: Path) -> None:
    """The last resort: a lazy unmount, whatever state the emulator is in."""
    if is_mounted(mountpoint):
        unmount = shutil.which("fusermount") or shutil.which("fusermount3")
        command = [unmount, "-u", "-z", str(mountpoint)] if unmount else ["umount", "-l", str(mountpoint)]
        subprocess.run(command, capture_output=True)


def emulate_command(backing: Path, mountpoint: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "stampede", "emulate-mds", str(mountpoint), "--backing",
            str(backing), *options]


def summary_path(mountpoint: Path) -> Path:
    """Where `running` has the emulator write its summary (--summary-json) when it stops."""
    return mountpoint.with_suffix(".summary.json")


def read_summary(mountpoint: Path) -> dict[str, Any]:
    """The summary of the emulator that `running` ran at mountpoint, once the block ended:
    {"service_s", "threads", ..., "ops": {op: {"count", "asked_mean_s", "held_p50_s", ...}}}."""
    document: dict[str, Any] = json.loads(summary_path(mountpoint).read_text())
    return document


@contextmanager
def running(backing: Path, mountpoint: Path, *options: str) -> Iterator[subprocess.Popen[bytes]]:
    """`stampede emulate-mds` mounted at mountpoint until the block ends, however it ends;
    its stderr goes to mountpoint + '.log', its summary to summary_path(mountpoint) (read it
    with read_summary after the block). RuntimeError if it does not mount."""
    mountpoint.mkdir(exist_ok=True)
    log = mountpoint.with_suffix(".log")
    summary_path(mountpoint).unlink(missing_ok=True)
    command = emulate_command(backing, mountpoint, *options, "--summary-json",
                              str(summary_path(mountpoint)))
    with open(log, "wb") as stream:
        daemon = subprocess.Popen(command, stderr=stream)
    try:
        deadline = time.monotonic() + MOUNT_WAIT_S
        while not is_mounted(mountpoint) and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not is_mounted(mountpoint):
            raise RuntimeError(f"emulate-mds did not mount {mountpoint}: {log.read_text()}")
        yield daemon
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        force_unmount(mountpoint)


def requests_per_op(path: Path, service_s: float, repeats: int = 5) -> dict[str, int]:
    """Emulator requests of one stat and one open+close of `path`: the fastest of `repeats`
    over S, rounded down. Each request holds its slot S at least, so r requests never take
    less than r S; what comes on top (the FUSE round trip, a busy machine) must stay under
    one S in the fastest try alone (a median, rounded, miscounted when it passed S / 2)."""
    os.stat(path)                      # the kernel serializes a name's first lookup

    def timed(call: Callable[[], object]) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    stat = min(timed(lambda: os.stat(path)) for _ in range(repeats))
    opened = min(timed(lambda: os.close(os.open(path, os.O_RDONLY))) for _ in range(repeats))
    return {"stat": math.floor(stat / service_s), "open": math.floor(opened / service_s)}
