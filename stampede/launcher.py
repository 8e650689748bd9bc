"""What the process launcher says about this process, read without initialising MPI.

Errors found before MPI starts (a bad job file) are printed by rank 0 only; the rank is
taken from the variables mpiexec, mpirun or srun set. The demo finds the venv's mpiexec.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

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
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")
