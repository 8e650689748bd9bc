"""`stampede sweep`: --prepare-path prepares into a directory and runs through another view
of it (a read-only emulate-mds mount), and is checked before anything is launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede import cli
from stampede.emulate.mount import read_summary, running
from tests.helpers.jobs import read_archive, small_job


@pytest.mark.mpi
@pytest.mark.usefixtures("no_mount_left")
def test_a_sweep_through_a_read_only_emulator_mount(stampede, fuse_ready: None,
                                                    tmp_path: Path) -> None:
    backing, mountpoint = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    job = small_job(tmp_path, target={"path": str(backing / "ck")},
                    checkpoint={"size": "4MiB", "layout": ["sharded"]},
                    pattern={"ops": ["stat", "open", "read", "close"]})
    with running(backing, mountpoint, "--service-s", "0.001", "--threads", "2"):
        # without the flag, prepare meets the read-only mount: that is what the flag is for
        refused = stampede("sweep", str(job), "--ranks", "1", "--set",
                           f"target.path={mountpoint / 'ck'}", timeout=120)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused.stderr
        swept = stampede("sweep", str(job), "--ranks", "1,2", "--set",
                         f"target.path={mountpoint / 'ck'}", "--prepare-path", str(backing / "ck"),
                         "--clean", timeout=300)
        assert swept.returncode == 0, swept.stderr
    rows = [row for row in read_archive(tmp_path / "results" / "job.csv") if row["op"] == "restore"]
    assert sorted(int(row["nranks"]) for row in rows) == [1, 2]
    for row in rows:
        assert row["valid"] == "true", row
        assert row["fs_type"] == "fuse" and row["target"] == str(mountpoint / "ck")
    assert read_summary(mountpoint)["ops"]["open"]["count"] > 0      # the runs went through it
    assert not list((backing / "ck").glob("sharded/*"))               # --clean, in the backing dir


def test_a_bad_prepare_path_is_refused_before_any_launch(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    job = small_job(tmp_path)
    base = ["sweep", str(job), "--ranks", "1,2"]
    assert cli.main([*base, "--prepare-path", ""]) == 2
    assert "--prepare-path ''" in capsys.readouterr().err
    assert cli.main([*base, "--prepare-path", "s3://me:hunter2@host/bucket/ck"]) == 2
    message = capsys.readouterr().err
    assert "--prepare-path" in message and "password" in message and "hunter2" not in message
    assert not (tmp_path / "results").exists()                       # nothing ran
