"""Every layout's restore time means the same thing when run.verify is on: the rank
holds its bytes AND has checked them. Layouts that read into a reused block check between
reads; those that exchange check the held shard after the exchange; both inside the
restore (the ranking once compared a broadcast that hashed outside its restore with
layouts that hashed inside theirs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec

SCRIPT = Path(__file__).parents[1] / "helpers" / "verify_inside_check.py"


@pytest.mark.mpi
def test_every_layouts_checks_lie_inside_its_restore() -> None:
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    result = subprocess.run([mpiexec, "-n", "4", sys.executable, str(SCRIPT)],
                            capture_output=True, text=True, timeout=180, cwd=SCRIPT.parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": OK") == 5, result.stdout
