"""The job commands' own decisions, before any I/O: which rank count `plan` plans for,
and what a job needs installed (the command's error, never the job's validation)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from stampede.checkpoint.formats import require_packages
from stampede.errors import UsageError
from stampede.spec import build_job

REPO = Path(__file__).resolve().parents[2]


def test_plan_plans_for_the_launchers_rank_count_not_the_batch_scripts(
        stampede, monkeypatch: pytest.MonkeyPatch) -> None:
    job = str(REPO / "jobs" / "quickstart.toml")
    # In an sbatch script, outside any srun step, SLURM_NTASKS is the allocation's: this
    # process is one rank (SLURM_STEP_NUM_TASKS is the step's, set only inside srun).
    for name in [name for name in os.environ if name.startswith(("SLURM_", "PMI_", "OMPI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_NTASKS", "64")
    alone = stampede("plan", job)
    assert alone.returncode == 0, alone.stderr
    assert "1 rank(s)" in alone.stdout and "64 rank(s)" not in alone.stdout
    assert "16 rank(s)" in stampede("plan", job, "--np", "16").stdout


def test_validation_is_the_same_without_h5py(monkeypatch: pytest.MonkeyPatch) -> None:
    document = {"target": {"path": "/tmp/x"}, "checkpoint": {"size": "1MiB", "format": "hdf5"}}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "h5py" else real(name, *args))
    spec = build_job("h5", "h5.toml", document)   # a valid job on every machine
    with pytest.raises(UsageError, match="needs h5py") as caught:
        require_packages(spec)                    # the command's check, before any I/O
    assert caught.value.exit_status == 2
