"""`stampede emulate-s3` started as a user starts it, for the tests that go through it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.s3server import S3Server

START_LINE_PREFIX = "emulate-s3: serving "


@contextmanager
def emulator(upstream: S3Server, log: Path, *flags: str) -> Iterator[str]:
    """The command as a user runs it; its endpoint URL while it runs; stopped by SIGTERM."""
    command = [sys.executable, "-m", "stampede", "emulate-s3", "--upstream",
               upstream.endpoint_url, "--log", str(log), *flags]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.startswith(START_LINE_PREFIX), line + process.stderr.read()
        yield line.removeprefix(START_LINE_PREFIX).split()[0]
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
        assert process.returncode == 0, rest
        assert "logged" in rest
