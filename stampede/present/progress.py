"""What rank 0 says while a run or a prepare goes on: on an interactive terminal (the
launcher's too: under mpiexec rank 0 writes to the controlling terminal, /dev/tty) one
live line, rewritten in place; elsewhere (batch logs, Slurm output files) a line per
step on stderr, no more often than every LINE_EVERY_S seconds but for the final steps
(the end of a layout). The stdlib only: rank 0 of every run imports this."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from stampede.units import BYTES_PER_GB, format_plain

LINE_EVERY_S = 5.0        # batch logs: at most one line per this many seconds
LIVE_EVERY_S = 0.2        # the live line: at most this often


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


def _terminal() -> tuple[TextIO, bool] | None:
    """(a stream to the user's terminal, whether stampede opened it), or None."""
    if sys.stderr.isatty():
        return sys.stderr, False
    try:
        return open("/dev/tty", "w"), True   # noqa: SIM115 - closed by Progress.close
    except OSError:
        return None


class Progress:
    """Steps of a long piece of work, with elapsed time and an ETA from the share done."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.started = time.monotonic()
        self.last_line = -math.inf
        found = _terminal() if enabled else None
        self.live: TextIO | None = found[0] if found else None
        self._opened = bool(found and found[1])

    def step(self, text: str, done: float, total: float, final: bool = False) -> None:
        """`done` of `total` (any unit) is done; `final`: always say it (a batch line)."""
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.started
        eta = elapsed / done * (total - done) if 0 < done < total else \
            (0.0 if done >= total else math.nan)
        line = f"{text} (elapsed {_clock(elapsed)}, ETA {_clock(eta)})"
        if self.live is not None:
            if final or now - self.last_line >= LIVE_EVERY_S:
                width = self._width()
                self.live.write("\r\x1b[2K" + line[:width - 1])
                self.live.flush()
                self.last_line = now
        elif final or now - self.last_line >= LINE_EVERY_S:
            print(f"stampede: {line}", file=sys.stderr, flush=True)
            self.last_line = now

    def close(self) -> None:
        if self.live is not None:
            self.live.write("\r\x1b[2K")
            self.live.flush()
            if self._opened:
                self.live.close()
            self.live = None

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.live.fileno()).columns if self.live else 80
        except OSError:
            return 80


@contextmanager
def progress_bar(total: int, description: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(nbytes)` function that reports `description` with bytes done of
    `total`, their rate and the ETA; a no-op unless enabled."""
    from stampede.units import format_bytes

    progress = Progress(enabled and total > 0)
    done = 0

    def advance(nbytes: int) -> None:
        nonlocal done
        done += nbytes
        seconds = time.monotonic() - progress.started
        rate = f", {format_plain(done / seconds / BYTES_PER_GB)} GB/s" if seconds > 0 else ""
        progress.step(f"{description}: {format_bytes(done)} of {format_bytes(total)} "
                      f"({done / total:.0%}){rate}", done, total, final=done >= total)
    try:
        yield advance
    finally:
        progress.close()
