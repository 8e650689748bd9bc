"""stampede.mpi on a real MPICH communicator, 1 and 3 ranks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec

pytestmark = pytest.mark.mpi
SCRIPT = Path(__file__).parent / "helpers" / "mpi_primitives_check.py"


@pytest.mark.parametrize("nranks", [1, 3])
def test_collectives_on_a_real_communicator(nranks: int) -> None:
    mpiexec = find_mpiexec()
    assert mpiexec, "mpiexec missing: pip install -r requirements/test.txt"
    result = subprocess.run([mpiexec, "-n", str(nranks), sys.executable, str(SCRIPT)],
                            capture_output=True, text=True, timeout=120,
                            cwd=SCRIPT.parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ranks={nranks}" in result.stdout
    assert "FAILED" not in result.stdout
    assert result.stdout.count(": ok") == 6
