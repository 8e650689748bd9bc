"""Lustre, as a client sees it: striping applied with `lfs setstripe` on a directory
(files created in it inherit the layout), read back with `lfs getstripe`, and the
client's own per-op counters (llite `stats`). A stripe count of 1 or of every OST
changes a shared-file restore's bandwidth by an order of magnitude, so what each file
got is recorded, parsed, in the sidecar.

Where `lfs` does not exist (not a Lustre client) nothing is applied and the note says
so. The parsers take the text the commands print (tested on real clients' output in
tests/data/lustre/); lines starting with '#' are skipped, so a saved sample can say
where it came from.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from pathlib import Path, PurePath

LFS_TIMEOUT_S = 30
# The llite counters' files: /proc before Lustre 2.12, debugfs after (lctl reads either).
LLITE_STATS = ("/proc/fs/lustre/llite/{fs}-*/stats", "/sys/kernel/debug/lustre/llite/{fs}-*/stats")
# An llite line's sum is bytes for these (the others count calls, or microseconds).
BYTE_COUNTERS = ("read_bytes", "write_bytes")


def apply_stripe(directory: PurePath, count: int, size_bytes: int | None) -> tuple[str, bool]:
    """`lfs setstripe` on an empty directory, so files created in it inherit the layout.
    Returns a line for the user saying what was done (or why not), and whether it was."""
    lfs = shutil.which("lfs")
    wanted = f"stripe_count={count or 'default'}, stripe_size={size_bytes or 'default'}"
    if lfs is None:
        return (f"target.stripe_* ({wanted}) not applied: no `lfs` command here (not a Lustre "
                "client)", False)
    command = [lfs, "setstripe"]
    if count:
        command += ["-c", str(count)]
    if size_bytes:
        command += ["-S", str(size_bytes)]
    result = subprocess.run([*command, str(directory)], capture_output=True, text=True,
                            timeout=LFS_TIMEOUT_S)
    if result.returncode:
        return f"lfs setstripe {wanted} on {directory} failed: {result.stderr.strip()}", False
    return f"lfs setstripe {wanted} applied to {directory}", True


def read_layouts(paths: list[PurePath]) -> dict[str, object]:
    """`lfs getstripe` of each path, parsed (the caller bounds the list); {} where there
    is no lfs. A failed call is kept as its error's text."""
    lfs = shutil.which("lfs")
    if lfs is None:
        return {}
    layouts: dict[str, object] = {}
    for path in paths:
        result = subprocess.run([lfs, "getstripe", str(path)], capture_output=True, text=True,
                                timeout=LFS_TIMEOUT_S)
        layouts[str(path)] = parse_getstripe(result.stdout) if result.returncode == 0 \
            else f"lfs getstripe failed: {result.stderr.strip()}"
    return layouts


def _number(text: str) -> int | str:
    try:
        return int(text, 0)
    except ValueError:
        return text   # a pattern's name (raid0, mdt), or EOF


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def parse_getstripe(text: str) -> dict[str, object]:
    """One path's `lfs getstripe` output: stripe_count, stripe_size, pattern,
    stripe_offset and, for a file, the OST index of each stripe (osts). A composite
    (PFL) layout's components are listed under "components", each with its extent
    (start, end) and the same keys. A directory's default layout prints its keys on one
    line (stripe_count: 4 stripe_size: ...), a file's one per line with an lmm_ prefix:
    both read the same."""
    layout: dict[str, object] = {}
    components: list[dict[str, object]] = []
    current = layout
    in_objects = False
    for index, line in enumerate(_lines(text)):
        words = line.split()
        if not words:
            continue
        if index == 0 and ":" not in words[0]:
            layout["path"] = line.strip()
            continue
        if words[0] == "lcme_id:":   # a component of a composite layout begins
            current = {}
            components.append(current)
            in_objects = False
            continue
        if words[0] == "obdidx":     # the table of stripes: OST index, object ids, group
            in_objects = True
            current["osts"] = []
            continue
        if in_objects and words[0].isdigit() and ":" not in line:
            osts = current["osts"]
            assert isinstance(osts, list)
            osts.append(int(words[0]))
            continue
        for key, value in zip(words[::2], words[1::2]):
            name = key.rstrip(":").removeprefix("lmm_").removeprefix("lcme_extent.e_")
            if key.endswith(":") and name in ("stripe_count", "stripe_size", "pattern",
                                              "stripe_offset", "layout_gen", "start", "end"):
                current[name] = _number(value)
    if components:
        layout["components"] = components
    return layout


def parse_llite_stats(text: str) -> dict[str, dict[str, int]]:
    """An llite `stats` file (or `lctl get_param -n llite.*.stats`): each op's count of
    samples and, for read_bytes and write_bytes, the bytes they moved (the sum). The
    time stamps (snapshot_time, start_time, elapsed_time) carry no sample count and are
    left out."""
    counters: dict[str, dict[str, int]] = {}
    for line in _lines(text):
        words = line.split()
        if len(words) < 3 or words[2] != "samples" or not words[1].isdigit():
            continue
        entry = {"count": int(words[1])}
        # name count samples [unit] min max sum [sumsq]
        if words[0] in BYTE_COUNTERS and len(words) >= 7:
            entry["sum"] = int(words[6])
        counters[words[0]] = entry
    return counters


def read_llite_stats(device: str) -> dict[str, dict[str, int]] | None:
    """The llite counters of the Lustre file system a mount's device names
    (mgsnode@tcp:/fsname): lctl's, else the stats file itself. None where neither can
    be read (not a Lustre client, or not allowed)."""
    fs = device.rpartition(":/")[2] or device
    lctl = shutil.which("lctl")
    if lctl is not None:
        result = subprocess.run([lctl, "get_param", "-n", f"llite.{fs}-*.stats"],
                                capture_output=True, text=True, timeout=LFS_TIMEOUT_S)
        if result.returncode == 0 and result.stdout.strip():
            return parse_llite_stats(result.stdout)
    for pattern in LLITE_STATS:
        for path in sorted(glob.glob(pattern.format(fs=fs))):
            try:
                return parse_llite_stats(Path(path).read_text())
            except OSError:
                continue
    return None


def llite_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
                ) -> dict[str, dict[str, int]]:
    """What the client did between two readings: per op that moved, each number's increase."""
    delta = {}
    for name, now in after.items():
        was = before.get(name, {})
        moved = {key: value - was.get(key, 0) for key, value in now.items()}
        if any(moved.values()):
            delta[name] = moved
    return delta
