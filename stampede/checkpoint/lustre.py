"""Lustre striping: applied with `lfs setstripe` before prepare writes, read back with
`lfs getstripe` into the sidecar, since a stripe count of 1 or of every OST changes a
shared-file restore's bandwidth by an order of magnitude.

Where `lfs` does not exist (not a Lustre client) nothing is applied and the note says so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

LFS_TIMEOUT_S = 30


def apply_stripe(directory: Path, count: int, size_bytes: int | None) -> str:
    """`lfs setstripe` on an empty directory, so files created in it inherit the layout.
    Returns a line for the user saying what was done (or why not)."""
    lfs = shutil.which("lfs")
    wanted = f"stripe_count={count or 'default'}, stripe_size={size_bytes or 'default'}"
    if lfs is None:
        return f"target.stripe_* ({wanted}) not applied: no `lfs` command here (not a Lustre client)"
    command = [lfs, "setstripe"]
    if count:
        command += ["-c", str(count)]
    if size_bytes:
        command += ["-S", str(size_bytes)]
    result = subprocess.run([*command, str(directory)], capture_output=True, text=True,
                            timeout=LFS_TIMEOUT_S)
    if result.returncode:
        return f"lfs setstripe {wanted} on {directory} failed: {result.stderr.strip()}"
    return f"lfs setstripe {wanted} applied to {directory}"


def stripe_layout(paths: list[Path]) -> dict[str, str]:
    """`lfs getstripe` of each path (the caller bounds the list); {} where there is no lfs."""
    lfs = shutil.which("lfs")
    if lfs is None:
        return {}
    layouts = {}
    for path in paths:
        result = subprocess.run([lfs, "getstripe", str(path)], capture_output=True, text=True,
                                timeout=LFS_TIMEOUT_S)
        layouts[str(path)] = (result.stdout if result.returncode == 0 else result.stderr).strip()
    return layouts
