"""A real headless browser for the HTML report's tests: Debian's chromium, told to load a
local file and to log its console to stderr (a CSP violation, a script error and a
blocked request all land there as CONSOLE lines)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.helpers import requires

BROWSER_TIMEOUT_S = 60
NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; unavailable() (skip, or fail under STAMPEDE_REQUIRE_BROWSER=1)."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    requires.unavailable("no chromium on PATH: apt-get install -y chromium", "BROWSER")


def headless(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """chromium --headless on the file, its console on stderr. --no-sandbox: CI runs as
    root, where chromium refuses its sandbox; the page is our own local file."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
               "--v=0", "--no-first-run", "--disable-extensions", *flags, page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
                          cwd=page.parent)


def console_lines(stderr: str) -> list[str]:
    """What the page said on its console (errors, CSP violations, blocked loads)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]
