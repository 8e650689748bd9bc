"""Faults from the file system itself, injected by a FUSE pass-through (tests/helpers/faultfs.py):
an I/O error on read, a permission refused on open. Each ends in a report that names the
rank and file, a non-zero exit, an archive marked invalid, and no hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import requires
from tests.helpers.faults import mounted
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi


@pytest.fixture
def prepared(stampede, tmp_path: Path) -> Path:
    requires.fuse()
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    return job


@pytest.mark.parametrize(("option", "message"), [
    ("--fail-read", "rank 1: read sharded/shard-00001-of-00002.raw at 0: Input/output error"),
    ("--fail-open", "rank 1: open sharded/shard-00001-of-00002.raw: Permission denied"),
])
def test_file_system_errors_are_reported_and_archived_invalid(stampede, prepared: Path,
                                                               tmp_path: Path, option: str,
                                                               message: str) -> None:
    with mounted(tmp_path / "ckpt", tmp_path / "mnt", option, "shard-00001"):
        result = stampede("run", str(prepared), "--set", f"target.path={tmp_path / 'mnt'}",
                          np=2, timeout=60)
    assert result.returncode == 1, result.stderr
    assert message in result.stdout
    assert "rank 0:" not in result.stdout.split("error:", 1)[-1]  # rank 0's shard was fine
    assert "archived as invalid" in result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert rows and {row["valid"] for row in rows} == {"false"}
    assert {row["fs_type"] for row in rows} == {"fuse"}
