"""SIGTERM (Slurm's time limit, scancel) and SIGINT (Ctrl-C) during a run: a request to
stop at the next iteration boundary, where every rank learns of it through the end-of-
phase reduction and all stop together; the layouts already measured are archived by then
(each as it completes). A second signal ends the process at once, as the first would
have without stampede."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupts:
    """The signal this process received (0: none), with stampede's handlers installed
    between install() and restore()."""

    def __init__(self) -> None:
        self.received = 0
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def install(self) -> Interrupts:
        for number in SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self.received:   # the second: what the signal would have done
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        self.received = number
