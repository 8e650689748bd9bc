"""What the process launcher says about this process, read without initialising MPI; and
how the commands that launch processes of their own (assess, sweep, demo, startup) stop
them.

Errors found before MPI starts (a bad job file) are printed by rank 0 only; the rank is
taken from the variables mpiexec, mpirun or srun set. The demo finds the venv's mpiexec.

A command that owns children treats SIGTERM and SIGHUP (a batch system's time limit,
`timeout`, `kill`, a closed terminal) as Ctrl-C: its clean-up runs (`finally`), and the
child it waits for is told first (SIGTERM: its ranks stop at the end of their iteration
and archive what they measured), waited for, and killed only after INTERRUPT_GRACE_S. It
once exited 143 at once, its mpiexec writing on as an orphan and its checkpoint left.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                  "SLURM_PROCID")


def launcher_rank() -> int:
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


# SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: the latter is also set in the batch script
# itself, outside any srun step, where this process is one rank alone.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def launcher_size() -> int | None:
    """How many ranks the launcher started, or None outside a launcher."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def suggested_command(nranks: int, *words: str) -> str:
    """A stampede command line to suggest in a message that works as printed, pasted into
    a shell: the venv's own mpiexec (another MPI's launcher cannot start these ranks) and
    the stampede of this Python."""
    import shlex

    beside = Path(sys.executable).parent / "stampede"
    stampede = [str(beside)] if beside.exists() else [sys.executable, "-m", "stampede"]
    mpiexec = find_mpiexec() if nranks > 1 else None
    launch = [mpiexec, "-n", str(nranks)] if mpiexec else (["mpiexec", "-n", str(nranks)]
                                                            if nranks > 1 else [])
    return shlex.join([*launch, *stampede, *words])


def find_mpiexec() -> str | None:
    """The mpiexec next to this Python (PyPI's MPICH), else the first one on PATH.

    The venv's own comes first: an mpiexec from another MPI cannot start ranks that
    load this venv's MPI library.
    """
    import shutil  # here, not at the top (as subprocess below): every rank imports this module

    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


INTERRUPT_GRACE_S = 60.0    # a child told to stop ends at its iteration's end, then archives


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as Ctrl-C is: the signal's number kept for the exit status."""

    def __init__(self, number: int) -> None:
        super().__init__(signal.Signals(number).name)
        self.signal = number


def _raise_interrupted(number: int, frame: FrameType | None) -> None:
    raise Interrupted(number)


def signals_stop_children() -> None:
    """From now on in this process, SIGTERM and SIGHUP interrupt as Ctrl-C does."""
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _raise_interrupted)


def call(argv: list[str], **options: Any) -> int:
    """subprocess.call, but a signal that interrupts the wait is passed on to the child
    (SIGTERM; a terminal's Ctrl-C reached it already), the child waited for (killed after
    INTERRUPT_GRACE_S), and the interrupt raised again."""
    import subprocess

    process = subprocess.Popen(argv, **options)
    try:
        return process.wait()
    except KeyboardInterrupt as interrupt:
        if isinstance(interrupt, Interrupted):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise

