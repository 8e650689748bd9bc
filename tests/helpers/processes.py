"""Finding a test's processes: by command line, or as another process's descendants."""

from __future__ import annotations

import subprocess
from pathlib import Path


def pids_of(pattern: str) -> list[int]:
    """The processes whose command line holds `pattern` (pgrep -f)."""
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (four generations), from /proc."""
    found: list[int] = []
    parents = {pid}
    for _ in range(4):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if parent in parents and int(entry.name) not in found:
                    found.append(int(entry.name))
        parents |= set(found)
    return found
