"""The HTML report's verdict, and the same answer from `stampede project` and `stampede
mttr` run by hand; the real stampede CLI run as a user runs it, wide enough for rich's
tables to keep a row on one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.jobs import RUN_TIMEOUT_S

# a src or href that leaves the file: http:, https: or protocol-relative
URL = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def cli(*args: str, cwd: Path, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The CLI; it must succeed."""
    environment = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "stampede", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=environment)
    assert done.returncode == 0, done.stderr
    return done


DURATION = r"[0-9.,]+ (?:ns|µs|ms|s|min|h|days)"


def verdict_of(page: str) -> tuple[str, str]:
    """(the restore layout the verdict names, its measured T_MTTR as printed) from the
    HTML."""
    layout = re.search(r"<b>restore: use ([\w-]+)</b>", page)
    mttr = re.search(rf"<b>T_MTTR as measured[^:<]*: ({DURATION})</b>", page)
    assert layout and mttr, page[:3000]
    return layout.group(1), mttr.group(1)


def mttr_total(*args: str, cwd: Path) -> str:
    """`stampede mttr ARGS`: its T_MTTR as printed."""
    printed = cli("mttr", *args, cwd=cwd).stdout
    total = re.search(rf"T_MTTR\s+({DURATION})\s+100%", printed)
    assert total, printed
    return total.group(1)


def saved_with(page: str) -> str:
    """The save layout the verdict names."""
    layout = re.search(r"<b>save: use ([\w-]+)</b>", page)
    assert layout, page[:3000]
    return layout.group(1)


def hand_best(archive: Path, target_ranks: int = 16384, phase: str = "restore") -> str:
    """`stampede project ARCHIVE --target-ranks N --phase P`: its ranking's first."""
    projected = cli("project", str(archive), "--target-ranks", str(target_ranks), "--phase", phase,
                    cwd=archive.parent).stdout
    ranked = re.search(rf"ranked at {target_ranks} ranks: ([\w-]+) ", projected)
    assert ranked, projected
    return ranked.group(1)


def hand_verdict(archive: Path, target_ranks: int = 16384) -> tuple[str, str]:
    """`stampede project ARCHIVE --target-ranks N` (its ranking's first) and `stampede mttr ARCHIVE
    --layout L` (its T_MTTR as printed)."""
    layout = hand_best(archive, target_ranks)
    return layout, mttr_total(str(archive), "--layout", layout, cwd=archive.parent)
