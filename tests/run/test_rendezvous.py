"""stampede.run.rendezvous: torch.distributed's store served by rank 0 on a port the kernel
chose, never a number picked free and handed over (the race that failed CI). Two jobs on
one node at once, each making its process groups: both finish, both hold their bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers import requires
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job, write_job

pytestmark = pytest.mark.mpi


def at_once(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Start every command, then wait for each: they run side by side."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.fail("mpiexec not found: pip install -r requirements/test.txt")
    started = [subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", *command],
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for command in commands]
    finished = []
    for process, command in zip(started, commands, strict=True):
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        finished.append(subprocess.CompletedProcess(command, process.returncode, stdout, stderr))
    return finished


def test_two_torch_exchanges_on_one_node_at_once(stampede, tmp_path: Path) -> None:
    """run.exchange = "torch": a process group per iteration, in two jobs at once (six
    rendezvous each side by side); every member of both verified what it holds."""
    requires.module("torch", "TORCH")
    jobs = []
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        job = small_job(directory, checkpoint={"layout": ["broadcast", "striped"], "replicas": 2},
                        run={"verify": "xxh3", "iterations": 2, "exchange": "torch"})
        assert stampede("prepare", str(job), np=2).returncode == 0
        jobs.append(job)
    for job, result in zip(jobs, at_once([["run", str(job)] for job in jobs], tmp_path)):
        assert result.returncode == 0, result.stdout + result.stderr
        rows = read_archive(job.parent / "results" / "job.csv")
        assert {row["valid"] for row in rows} == {"true"}
        assert {row["op"] for row in rows} >= {"pg_init", "bcast_first", "allgather_first"}
        assert {row["errors"] for row in rows if row["op"] == "verify"} == {"0"}


def test_two_dcp_loads_on_one_node_at_once(tmp_path: Path, dcp_dir: Path) -> None:
    """`stampede loaders … --loaders dcp`: each job's gloo group of its ranks, at once."""
    archives = []
    commands = []
    for name in ("a", "b"):
        directory = tmp_path / name
        directory.mkdir()
        archive = directory / "loaders.csv"
        job = write_job(directory, "loaders", target={"path": "set-by-checkpoint"},
                        checkpoint={"assign": ["saved"], "block_size": "1MiB"},
                        run={"iterations": 2, "warmup": 1, "cache": "warm"},
                        archive={"path": str(archive)})
        commands.append(["loaders", str(job), "--checkpoint", str(dcp_dir), "--loaders", "dcp"])
        archives.append(archive)
    for archive, result in zip(archives, at_once(commands, tmp_path)):
        assert result.returncode == 0, result.stdout + result.stderr
        restores = [row for row in read_archive(archive)
                    if row["op"] == "restore" and row["tool"] == "dcp"]
        assert [row["valid"] for row in restores] == ["true"]
