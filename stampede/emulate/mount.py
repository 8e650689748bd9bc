"""Driving `stampede emulate-mds` from a script or a test: start it, wait for its mount,
stop it, and never leave a mount behind; its summary and its log of requests; and how
many requests an op costs, read from that log.

One copy of this for bench/model_vs_emulator.py and the tests that mount the emulator.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from stampede.emulate.service import Served, read_log

MOUNT_WAIT_S = 60.0     # a loaded machine can take seconds to import mfusepy and mount


def fuse_unavailable() -> str:
    """Why FUSE cannot be used here, or "" when it can (root, /dev/fuse, mfusepy, libfuse 3)."""
    from stampede.emulate.mds import load_fuse
    from stampede.errors import UsageError

    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    try:
        load_fuse()
    except UsageError as error:
        return str(error)
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


def read_summary(mountpoint: Path) -> dict[str, object]:
    """The summary of the emulator that `running` ran at mountpoint, once the block ended:
    {"service_s", "threads", ..., "ops": {op: {"count", "asked_mean_s", "held_p50_s", ...}}}."""
    from stampede.results.readback import read_json

    found = read_json(summary_path(mountpoint), "emulator's summary")
    if found.value is None:
        raise RuntimeError(found.notes[0])
    return found.value


@contextmanager
def running(backing: Path, mountpoint: Path, *options: str) -> Iterator[subprocess.Popen[bytes]]:
    """`stampede emulate-mds` mounted at mountpoint until the block ends, however it ends;
    its stderr goes to mountpoint + '.log', its summary to summary_path(mountpoint) and its
    log of requests to requests_path(mountpoint) (read them with read_summary and
    read_requests after the block). RuntimeError if it does not mount."""
    mountpoint.mkdir(exist_ok=True)
    log = mountpoint.with_suffix(".log")
    summary_path(mountpoint).unlink(missing_ok=True)
    requests_path(mountpoint).unlink(missing_ok=True)
    command = emulate_command(backing, mountpoint, *options, "--summary-json",
                              str(summary_path(mountpoint)), "--log", str(requests_path(mountpoint)))
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


def requests_path(mountpoint: Path) -> Path:
    """Where `running` has the emulator write its log of requests (--log) when it stops."""
    return mountpoint.with_suffix(".requests.jsonl")


def read_requests(mountpoint: Path) -> list[Served]:
    """Every request the emulator that `running` ran at mountpoint served, once the block
    ended (stampede.emulate.service.Served)."""
    return read_log(str(requests_path(mountpoint)))


Window = tuple[float, float]     # (start, stop) on the monotonic clock, the log's


def probe_ops(path: Path) -> dict[str, Window]:
    """One stat and one open+close of `path` through a mount, each between two readings
    of the monotonic clock: the windows in which requests_per_op counts their requests
    in the emulator's log. A first stat comes before, untimed: the kernel serialises a
    name's first lookup, and what a restore's stats meet after its warmup is the
    revalidation of a known name."""
    os.stat(path)
    calls: dict[str, Callable[[], object]] = {
        "stat": lambda: os.stat(path), "open": lambda: os.close(os.open(path, os.O_RDONLY))}
    windows = {}
    for op, call in calls.items():
        start = time.monotonic()
        call()
        windows[op] = (start, time.monotonic())
    return windows


def requests_per_op(log: list[Served], windows: dict[str, Window]) -> dict[str, list[Served]]:
    """The requests that arrived in each probe's window (nothing else may use the mount
    meanwhile): what one stat and one open cost the server, read from its own record."""
    return {op: [served for served in log if start <= served.arrived_s <= stop]
            for op, (start, stop) in windows.items()}
