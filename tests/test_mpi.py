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


ABORTING = """
import sys
from mpi4py import MPI
from stampede.mpi import SHM_PREFIX, abort
comm = MPI.COMM_WORLD
comm.Barrier()
with open("/proc/self/maps") as maps:   # this job's segments, as MPICH mapped them
    mine = sorted({line.split(None, 5)[5].strip() for line in maps if SHM_PREFIX in line})
print("mapped", " ".join(mine), flush=True)
comm.Barrier()
if comm.Get_rank() == 1:
    abort(comm, "failing alone", 1)   # the CLI's path for an error on one rank
comm.Barrier()   # rank 0 waits here until the abort ends it
"""


def test_an_aborted_job_leaves_no_mpich_segment_and_touches_no_other(tmp_path: Path) -> None:
    """MPI_Abort once left each job's mpich_shm_* in /dev/shm (16 files from 7 jobs): the
    aborting rank unlinks the segments it has mapped, and no other file there."""
    mpiexec = find_mpiexec()
    assert mpiexec, "mpiexec missing: pip install -r requirements/test.txt"
    other = Path("/dev/shm") / f"mpich_shm_stampede_test_{tmp_path.name}"   # another job's
    other.write_bytes(b"x")
    try:
        result = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", ABORTING],
                                capture_output=True, text=True, timeout=120,
                                cwd=Path(__file__).parents[1])
        assert result.returncode != 0, result.stdout + result.stderr
        assert "rank 1: failing alone; aborting the MPI job" in result.stderr
        mapped = {path for line in result.stdout.splitlines() if line.startswith("mapped")
                  for path in line.split()[1:]}
        assert mapped, result.stdout   # MPICH's shared memory was in use: the test can fail
        assert not [path for path in mapped if Path(path).exists()], mapped
        assert other.read_bytes() == b"x"
    finally:
        other.unlink()
