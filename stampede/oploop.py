"""The compiled metadata loop (oploop.c, built with the package as the plain C library
stampede/_oploop*.so): a rank's stats, opens and closes of one pass run in one call, each
op stamped in C around its call. What a program is, and when a rank runs one, is
stampede.run.metadata_loop's; this module loads the library and describes the calls.

The library is optional: where the install could not compile it (no C compiler), or with
STAMPEDE_PYTHON_LOOPS=1 in the ranks' environment (to compare, and for the tests that run
both), `run_steps` is None and the pattern runs the same ops in Python. A run's sidecar says
whether the library was there (`node.metadata_loop`: `which`); docs/concepts/measured.md
says what the difference costs.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STAT, OPEN, CLOSE = 0, 1, 2          # a step's op (oploop.c's OP_*)
POSIX, CEPHFS = 0, 1                 # how a call is made (oploop.c's KIND_*)
SKIPPED = -(2**63)                   # a close whose open failed: nothing ran, no sample
LIBRARY_STEM = "_oploop"
PYTHON_LOOPS = "STAMPEDE_PYTHON_LOOPS"   # =1: the library is not loaded (Python's loops run)


class Calls(ctypes.Structure):
    """oploop.c's struct calls: which functions make the calls, with what."""

    _fields_ = [("kind", ctypes.c_int32), ("open_flags", ctypes.c_int32),
                ("stat_want", ctypes.c_uint32), ("stat_flags", ctypes.c_uint32),
                ("context", ctypes.c_void_p), ("open_fn", ctypes.c_void_p),
                ("close_fn", ctypes.c_void_p), ("stat_fn", ctypes.c_void_p)]


class Watched(Protocol):
    """A client whose calls a watchdog bounds (stampede.libcephfs.Mount): `calling` says
    the call in progress, or is a Progress while the loop runs."""

    @property
    def calling(self) -> object: ...

    @calling.setter
    def calling(self, value: Progress | None) -> None: ...


@dataclass
class Compiled:
    """What a backend gives the loop (its `compiled_calls`): how to make the calls, the
    error a failed call's -errno becomes (as the backend's own call raises it: from op,
    code, path), and the object whose `calling` the libcephfs watchdog reads, if any."""

    calls: Calls
    error: Callable[[int, int, bytes], OSError]
    watched: Watched | None = None


@dataclass
class Progress:
    """The step in progress (-1: none) and its start (CLOCK_MONOTONIC ns), written by the
    loop for the libcephfs watchdog; `names[i]`: step i's (what, path)."""

    cells: ctypes.Array[ctypes.c_int64]
    names: list[tuple[str, bytes]]

    def __call__(self) -> tuple[str, bytes, float] | None:
        """The watchdog's note (what, on what, since when in time.monotonic's seconds),
        or None between calls."""
        step, start_ns = self.cells[0], self.cells[1]
        if step < 0:
            return None
        what, path = self.names[step]
        return what, path, start_ns / 1e9


def library_path() -> Path | None:
    """The built library beside this module, if the install built one."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"{LIBRARY_STEM}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _load() -> Callable[..., int] | None:
    """oploop.c's stampede_run_steps with its prototype, or None."""
    path = library_path()
    if path is None or os.environ.get(PYTHON_LOOPS) == "1":
        return None
    try:
        function = ctypes.CDLL(str(path)).stampede_run_steps
    except (OSError, AttributeError):
        return None
    p = ctypes.c_void_p
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.POINTER(Calls), p, p, ctypes.c_int64, p, ctypes.c_int64, p, p, p,
                         p]
    return function


run_steps = _load()   # None where the install built no library: the pattern's Python loops run


def which() -> str:
    """What runs a metadata-only pass, as a run's sidecar records it."""
    if run_steps is not None:
        return "compiled"
    return "python (" + (f"{PYTHON_LOOPS}=1" if os.environ.get(PYTHON_LOOPS) == "1"
                         else "the install built no library") + ")"
