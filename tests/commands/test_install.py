"""What an installed stampede carries, tested on a real wheel built from this tree and
run from outside it: the sbatch templates, the job files and the archive's README
(stampede/bundled links them in; the wheel must hold the files, not the links)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLED = ("stampede/bundled/slurm/restore.sbatch", "stampede/bundled/slurm/sweep.sbatch",
           "stampede/bundled/jobs/quickstart.toml", "stampede/bundled/results-README.md")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built without its dependencies and unpacked where Python finds it first."""
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools works in the tree's build/, which another build (a
    # second suite, an interrupted one) may hold or have left half made
    source = out / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(out), str(source)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(out.glob("stampede-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        missing = [name for name in BUNDLED if name not in names]
        assert not missing, f"the wheel lacks {missing}"
        site = out / "site"
        archive.extractall(site)
    for name in BUNDLED:
        assert (site / name).is_file() and not (site / name).is_symlink()
    return site


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-P", "-m", "stampede", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=environment)


def test_the_installed_package_is_the_one_run(installed: Path, tmp_path: Path) -> None:
    shown = subprocess.run([sys.executable, "-P", "-c", "import stampede; print(stampede.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(installed)})
    assert shown.stdout.strip().startswith(str(installed)), shown.stdout + shown.stderr


def test_jobs_are_listed_and_copied_out_of_an_install(installed: Path, tmp_path: Path) -> None:
    listed = run(installed, tmp_path, "jobs")
    assert listed.returncode == 0, listed.stderr
    assert "quickstart.toml" in listed.stdout and str(installed) in listed.stdout
    copied = run(installed, tmp_path, "jobs", "--copy", "jobs")
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "jobs" / "quickstart.toml").read_text() == \
        (REPO / "jobs" / "quickstart.toml").read_text()
    assert (tmp_path / "jobs" / "results-README.md").is_file()
    again = run(installed, tmp_path, "jobs", "--copy", "jobs")
    assert again.returncode == 0 and "kept" in again.stdout   # never overwrites


def test_slurm_renders_from_the_bundled_templates(installed: Path, tmp_path: Path) -> None:
    assert run(installed, tmp_path, "jobs", "--copy", "jobs").returncode == 0
    for extra in ([], ["--ranks", "1,2"]):
        rendered = run(installed, tmp_path, "slurm", "jobs/quickstart.toml", *extra)
        assert rendered.returncode == 0, rendered.stderr
        assert rendered.stdout.startswith("#!/bin/bash") and "#SBATCH --nodes=" in rendered.stdout
