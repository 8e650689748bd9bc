"""Histogram mode agrees with exact mode within its stated error, on the same samples
(real MPI reductions), and a real run in histogram mode is archived as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi
SCRIPT = Path(__file__).parents[1] / "helpers" / "histogram_check.py"


@pytest.mark.parametrize("nranks", [1, 3])
def test_the_two_modes_agree_on_the_same_samples(nranks: int) -> None:
    result = subprocess.run([find_mpiexec(), "-n", str(nranks), sys.executable, str(SCRIPT)],
                            capture_output=True, text=True, timeout=120, cwd=SCRIPT.parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout and result.stdout.count("exact-fields same") == 5
    assert "restore: ok; timeline: ok" in result.stdout
    assert f"ranks={nranks}" in result.stdout


def test_a_histogram_run_is_marked_and_counts_exactly(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"samples": "histogram", "verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stderr
    assert "from histograms, within 1%" in " ".join(result.stdout.split())
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["samples"] for row in rows} == {"histogram"}
    read = next(row for row in rows if row["layout"] == "sharded" and row["op"] == "read")
    assert int(read["count"]) == 2 * 2 * 8 and int(read["op_bytes"]) == 2 * 2 * 8 * 2**20
    assert "from log buckets (run.samples = histogram): within 1%" in read["warnings"]
