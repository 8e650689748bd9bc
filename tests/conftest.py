"""Shared fixtures: the real stampede command, under the venv's own mpiexec."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stampede.emulate.mount import fuse_unavailable as fuse_missing  # noqa: F401 - for the FUSE tests
from stampede.launcher import find_mpiexec
from tests import checkpoints

RUN_TIMEOUT_S = 180  # a hung run fails the test instead of the whole suite


def toml_value(value: object) -> str:
    """A Python value as TOML: strings, booleans, numbers, lists and inline tables."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return f"[{', '.join(toml_value(item) for item in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def write_job(directory: Path, name: str = "job", **sections: dict[str, object]) -> Path:
    """A TOML job file from keyword sections: write_job(d, target={"path": ...}, ...)."""
    lines = []
    for section, table in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def read_archive(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


@pytest.fixture
def stampede(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """stampede(*args, np=N): run the CLI, under mpiexec -n N when N > 1 (or N given)."""

    def launch(*args: str, np: int | None = None, timeout: float = RUN_TIMEOUT_S,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "stampede", *args]
        if np is not None:
            mpiexec = find_mpiexec()
            if mpiexec is None:
                pytest.fail("mpiexec not found: pip install -e '.[mpi,test]'")
            command = [mpiexec, "-n", str(np), *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or tmp_path)

    return launch


def small_job(tmp_path: Path, **overrides: dict[str, object]) -> Path:
    """A quick job: 16 MiB per layout, 1 MiB blocks, both layouts, sha256 verify."""
    sections: dict[str, dict[str, object]] = {
        "target": {"path": str(tmp_path / "ckpt")},
        "checkpoint": {"size": "16MiB", "layout": ["shared", "sharded"], "block_size": "1MiB"},
        "run": {"iterations": 2, "warmup": 1, "verify": "sha256"},
        "archive": {"path": str(tmp_path / "results" / "job.csv")},
    }
    for section, table in overrides.items():
        sections.setdefault(section, {}).update(table)
    return write_job(tmp_path, **sections)


# --- real checkpoints that stampede did not write (tests/checkpoints.py), made once ---

@pytest.fixture(scope="session")
def published() -> Path:
    return checkpoints.published_safetensors()


@pytest.fixture(scope="session")
def sharded(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.reshard_safetensors(published, tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="session")
def hdf5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("h5py")
    return checkpoints.write_hdf5(tmp_path_factory.mktemp("hdf5")).parent


@pytest.fixture(scope="session")
def dcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.write_dcp(tmp_path_factory.mktemp("dcp"))
