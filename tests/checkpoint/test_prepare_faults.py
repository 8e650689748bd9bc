"""stampede can always undo what it wrote: a prepare records the files it is about to
create before it writes one, so an interrupted, killed or disk-full prepare leaves
nothing `clean` cannot remove and nothing `run` mistakes for a checkpoint; a prepare
that cannot fit is refused before it writes anything; a file that is not the one
prepare wrote is reported, as a missing one is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers.faults import mounted
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job

pytestmark = pytest.mark.mpi
MiB = 2**20


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def start_prepare(job: Path, cwd: Path) -> subprocess.Popen[str]:
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    return subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", "prepare",
                             str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd)


def wait_for_data(ckpt: Path, running: subprocess.Popen[str]) -> None:
    """Until the prepare has written into a shard (so it is stopped mid-write)."""
    deadline = time.monotonic() + 60
    while not any(path.stat().st_size for path in ckpt.glob("sharded/*.raw")):
        assert running.poll() is None and time.monotonic() < deadline, running.communicate()
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["interrupt", "kill a rank"])
def test_a_prepare_stopped_mid_write_is_undone_by_clean(stampede, tmp_path: Path,
                                                        how: str) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded", "size": "2GiB",
                                          "block_size": "4MiB"})
    ckpt = tmp_path / "ckpt"
    running = start_prepare(job, tmp_path)
    wait_for_data(ckpt, running)
    if how == "interrupt":
        running.send_signal(signal.SIGINT)   # Ctrl-C: mpiexec passes it to the ranks
    else:
        rank = subprocess.run(["pgrep", "-f", "-n", f"stampede prepare {job}"],
                              capture_output=True, text=True).stdout.split()
        os.kill(int(rank[-1]), signal.SIGKILL)
    running.communicate(timeout=60)
    assert running.returncode != 0
    manifest = json.loads((ckpt / "stampede-manifest.json").read_text())
    entry = manifest["layouts"]["sharded"]
    assert entry["complete"] is False and entry["slices"] == []
    assert {record["path"] for record in entry["files"]} == {
        "sharded/shard-00000-of-00002.raw", "sharded/shard-00001-of-00002.raw"}
    refused = stampede("run", str(job), np=2)
    assert refused.returncode == 2 and "was not prepared to the end" in refused.stderr
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not ckpt.exists() or files_under(ckpt) == []


def test_a_disk_that_fills_up_mid_prepare_fails_in_one_line_and_is_undone(
        stampede, tmp_path: Path) -> None:
    """The free space was there when prepare checked; the disk filled up while it wrote
    (another job's files, say): ENOSPC from the file system after 6 MiB of shard bytes."""
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "mine").write_bytes(b"mine")   # not stampede's: never touched
    with mounted(backing, tmp_path / "mnt", "--fail-write", "shard-", "--write-errno",
                 "ENOSPC", "--write-after", str(6 * MiB)) as mountpoint:
        job = small_job(tmp_path, target={"path": str(mountpoint / "ckpt")},
                        checkpoint={"layout": "sharded", "size": "16MiB"})
        result = stampede("prepare", str(job), np=2)
        assert result.returncode == 1, result.stderr
        assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
        # 2 shards, the manifest, sharded/, ckpt/
        assert "removed 5 path(s)" in cleaned.stdout, cleaned.stdout + cleaned.stderr
    assert files_under(backing) == ["mine"] and not (backing / "ckpt").exists()


def test_a_prepare_that_cannot_fit_is_refused_before_it_writes(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"size": "100000TiB"})
    planned = stampede("plan", str(job))
    assert planned.returncode == 0 and "it does not fit" in planned.stdout
    refused = stampede("prepare", str(job), np=2)
    assert refused.returncode == 2
    assert "prepare writes 195.3 PiB (219,902,325,555,200,000 bytes)" in refused.stderr
    assert "it does not fit" in refused.stderr
    assert not (tmp_path / "ckpt").exists()   # nothing created, not even the directory


def test_a_shard_replaced_by_a_link_is_reported_as_not_prepares(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    shard = tmp_path / "ckpt" / "sharded" / "shard-00001-of-00002.raw"
    outside = tmp_path / "elsewhere.raw"
    shard.rename(outside)
    shard.symlink_to(outside)   # the same bytes, but not the file prepare wrote
    result = stampede("run", str(job), np=2, timeout=RUN_TIMEOUT_S)
    assert result.returncode == 1
    assert ("rank 1: open sharded/shard-00001-of-00002.raw: a symbolic link, not the file "
            "prepare wrote") in result.stdout
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert rows and all(row["valid"] == "false" for row in rows)
