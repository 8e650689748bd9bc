"""A save that goes wrong never costs the checkpoint already saved: a byte corrupted on its
way to the disk, a disk that fills up, an I/O error, a rank killed mid-save. The new
version is never published, the previous one stays published and `run` restores it
(verified), and the next save and `clean` remove exactly what stampede wrote."""

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
from tests.helpers.jobs import read_archive, small_job
from tests.helpers.tmpfs import small_disk

pytestmark = pytest.mark.mpi
MiB = 2**20


def said(result: subprocess.CompletedProcess[str]) -> str:
    """What a command printed, its lines unwrapped (the report wraps at its width)."""
    return " ".join((result.stdout + result.stderr).split())


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def one_save_job(tmp_path: Path, target: Path, size: str = "8MiB") -> Path:
    """One save per command (no warmup), so each command writes one known version."""
    return small_job(tmp_path, target={"path": str(target)},
                     checkpoint={"size": size, "layout": ["sharded"], "block_size": "1MiB"},
                     run={"iterations": 1, "warmup": 0, "verify": "none"},
                     save={"keep": 1})


def published(target: Path) -> str:
    return (target / "saves" / "sharded" / "latest").read_text().strip()


def states(target: Path) -> dict[int, str]:
    journal = json.loads((target / "stampede-saves.json").read_text())
    return {entry["version"]: entry["state"] for entry in journal["layouts"]["sharded"]["versions"]}


def restores_verified(stampede, job: Path, version: str) -> None:
    restored = stampede("run", str(job), "--set", "run.verify=xxh3", np=2)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    restore = [row for row in read_archive(job.parent / "results" / "job.csv")
               if row["op"] == "restore"][-1]
    assert restore["valid"] == "true" and restore["restored_from"] == f"saves/sharded/{version}"


def test_a_corrupted_write_is_named_never_published_and_the_previous_version_stays(
        stampede, tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "mine").write_bytes(b"not stampede's")
    # the FUSE file system flips one byte of version 2's shard of rank 1, at 3 MiB + 7
    with mounted(backing, tmp_path / "mnt", "--corrupt-write", "v000002/sharded/.shard-00001",
                 "--corrupt-at", str(3 * MiB + 7)) as mountpoint:
        target = mountpoint / "ckpt"
        job = one_save_job(tmp_path, target)
        first = stampede("save", str(job), np=2)
        assert first.returncode == 0, first.stdout + first.stderr
        second = stampede("save", str(job), np=2)
        assert second.returncode == 1, second.stdout + second.stderr
        assert ("rank 1: validate saves/sharded/v000002/sharded/shard-00001-of-00002.raw bytes "
                "0..4194304: xxh3 differs from what it wrote; 1 byte(s) differ, first at file "
                f"offset {3 * MiB + 7}, last at {3 * MiB + 7}") in said(second)
        assert "v000002 not published; v000001 stays published" in said(second)
        assert "Traceback" not in second.stderr
        assert published(target) == "v000001" and states(target) == {1: "complete", 2: "invalid"}
        rows = [row for row in read_archive(tmp_path / "results" / "job.csv")
                if row["phase"] == "save"]
        last = {row["op"]: row for row in rows if row["run_id"] == rows[-1]["run_id"]}
        assert last["save"]["valid"] == "false" and last["validate"]["errors"] == "1"
        assert last["published"]["count"] == "0" and "publish" not in last
        restores_verified(stampede, job, "v000001")
        # the next save removes what the failed one wrote, and its publish releases v1
        third = stampede("save", str(job), np=2)
        assert third.returncode == 0, third.stdout + third.stderr
        assert published(target) == "v000003"
        assert [name for name in files_under(target) if "/v0" in name] == [
            "saves/sharded/v000003/sharded/shard-00000-of-00002.raw",
            "saves/sharded/v000003/sharded/shard-00001-of-00002.raw"]
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
    assert files_under(backing) == ["mine"] and not (backing / "ckpt").exists()


@pytest.mark.parametrize(("errno_name", "says"), [("ENOSPC", "No space left on device"),
                                                   ("EIO", "Input/output error")])
def test_a_failing_disk_mid_save_keeps_the_previous_version(stampede, tmp_path: Path,
                                                            errno_name: str, says: str) -> None:
    """The disk filled up (or failed) after 3 MiB of version 2's bytes."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with mounted(backing, tmp_path / "mnt", "--fail-write", "v000002/", "--write-errno",
                 errno_name, "--write-after", str(3 * MiB)) as mountpoint:
        target = mountpoint / "ckpt"
        job = one_save_job(tmp_path, target)
        assert stampede("save", str(job), np=2).returncode == 0
        failed = stampede("save", str(job), np=2)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "write saves/sharded/v000002/sharded/.shard-0000" in said(failed)
        assert says in said(failed) and "Traceback" not in failed.stderr
        assert "run finished with errors" not in failed.stderr
        assert "save finished with errors, archived as invalid" in failed.stderr
        assert published(target) == "v000001" and states(target)[2] == "invalid"
        restores_verified(stampede, job, "v000001")
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
    assert files_under(backing) == []


def test_a_disk_full_for_everything_still_archives_the_failed_save_and_says_why(
        stampede, tmp_path: Path) -> None:
    """The disk fills for every file 3 MiB into version 2: its ranks' writes fail, and so
    does the journal's update. The failure is archived (invalid, each rank's write error
    said), not lost to the journal's ENOSPC as it once was; v1 stays published, the entry of
    v2 stays "writing", which the next save and clean remove."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with mounted(backing, tmp_path / "mnt", "--fail-write", "/", "--write-errno", "ENOSPC",
                 "--write-after", str(11 * MiB)) as mountpoint:
        target = mountpoint / "ckpt"
        job = one_save_job(tmp_path, target)
        assert stampede("save", str(job), np=2).returncode == 0      # ~8 MiB of the 11
        failed = stampede("save", str(job), np=2)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert "write saves/sharded/v000002/sharded/.shard-0000" in said(failed)
        assert "No space left on device" in said(failed) and "Traceback" not in failed.stderr
        assert "journal entry not updated" in said(failed)
        assert "save finished with errors, archived as invalid" in failed.stderr
        rows = read_archive(tmp_path / "results" / "job.csv")
        saves = [row for row in rows if row["op"] == "save"]
        assert [row["valid"] for row in saves] == ["true", "false"]
        assert published(target) == "v000001" and states(target)[2] == "writing"
        restores_verified(stampede, job, "v000001")
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
    assert files_under(backing) == []


def test_a_save_that_cannot_start_after_a_warmup_archives_that_warmup_as_evidence(
        stampede, tmp_path: Path) -> None:
    """The published pointer unreadable (EIO) once the first of two warmups published it:
    the second cannot start (its setup reads the pointer), so no phase of it ran. The run
    is archived invalid with the first warmup's samples as the evidence and the failure
    named, never an IndexError from a layout with no rows (as CI once found, when an NFS
    server hung between two warmups)."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with mounted(backing, tmp_path / "mnt", "--fail-read", "latest") as mountpoint:
        job = small_job(tmp_path, target={"path": str(mountpoint / "ckpt")},
                        checkpoint={"size": "8MiB", "layout": ["sharded"]},
                        run={"iterations": 2, "warmup": 2, "verify": "none"},
                        save={"keep": 1, "validate": "none"})
        failed = stampede("save", str(job), np=2)
        text = said(failed)
        assert failed.returncode == 1, text
        assert "Traceback" not in text, text
        assert "INVALID: warmup iteration 2 of 2: starting a sharded save: [Errno 5] " \
            "Input/output error" in text, text
        assert "no measured iteration: the samples are the failed warmup's" in text, text
        saves = [row for row in read_archive(tmp_path / "results" / "job.csv")
                 if row["op"] == "save"]
        assert [(row["valid"], row["count"]) for row in saves] == [("false", "2")], saves


def test_a_rank_killed_mid_save_leaves_the_published_version_and_nothing_clean_misses(
        stampede, tmp_path: Path) -> None:
    """Through FUSE, so that a 128 MiB save takes long enough to be caught mid-write."""
    backing = tmp_path / "backing"
    backing.mkdir()
    with mounted(backing, tmp_path / "mnt") as mountpoint:
        target = mountpoint / "ckpt"
        job = one_save_job(tmp_path, target, size="128MiB")
        assert stampede("save", str(job), np=2).returncode == 0
        mpiexec = find_mpiexec()
        assert mpiexec is not None
        running = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", "save",
                                    str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=tmp_path)
        partials = target / "saves" / "sharded" / "v000002" / "sharded"
        deadline = time.monotonic() + 60
        while not any(path.stat().st_size for path in partials.glob(".*.partial")):
            assert running.poll() is None and time.monotonic() < deadline, running.communicate()
            time.sleep(0.01)
        rank = subprocess.run(["pgrep", "-f", "-n", f"stampede save {job}"],
                              capture_output=True, text=True).stdout.split()
        os.kill(int(rank[-1]), signal.SIGKILL)
        running.communicate(timeout=60)
        assert running.returncode != 0
        assert published(target) == "v000001" and states(target) == {1: "complete", 2: "writing"}
        restores_verified(stampede, job, "v000001")
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
    assert files_under(backing) == [] and not (backing / "ckpt").exists()


def test_a_larger_save_into_a_target_of_smaller_versions_is_refused_before_it_writes(
        stampede, tmp_path: Path) -> None:
    """On a 20 MiB disk, two 1 MiB versions kept: a 12 MiB save (keep 2, three saves) would
    hold 2 + 12, then 13 + 12 MiB at once. Refused before its first byte (it once passed,
    counting the kept versions at the new size, and filled the disk); a 6 MiB one, whose
    peak is 2 + 6, then 7 + 6, then 12 + 6 = 18 MiB, fits."""
    with small_disk(tmp_path / "disk", 20 * MiB) as disk:
        target = disk / "ck"
        job = small_job(tmp_path, target={"path": str(target)},
                        checkpoint={"size": "1MiB", "layout": ["sharded"], "block_size": "1MiB"},
                        run={"iterations": 2, "warmup": 0, "verify": "none"}, save={"keep": 2})
        assert stampede("save", str(job), np=2).returncode == 0
        before = files_under(target)
        refused = stampede("save", str(job), "--set", "checkpoint.size=12MiB",
                           "--set", "run.iterations=3", np=2)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "save adds, at the most, 34 MiB" in said(refused) and "does not fit" in said(refused)
        assert files_under(target) == before and "Traceback" not in refused.stderr
        fits = stampede("save", str(job), "--set", "checkpoint.size=6MiB",
                        "--set", "run.iterations=3", np=2)
        assert fits.returncode == 0, fits.stdout + fits.stderr


def test_a_save_counts_the_space_a_killed_saves_leftovers_will_free(stampede, tmp_path: Path) -> None:
    """A version left half written (state "writing", as a killed save leaves it) is removed
    before the next save's first byte: its space is counted free, not refused."""
    with small_disk(tmp_path / "disk", 20 * MiB) as disk:
        target = disk / "ck"
        job = one_save_job(tmp_path, target, size="8MiB")
        assert stampede("save", str(job), np=2).returncode == 0
        journal_path = target / "stampede-saves.json"
        journal = json.loads(journal_path.read_text())
        versions = journal["layouts"]["sharded"]["versions"]
        wreck = json.loads(json.dumps(versions[-1]).replace("v000001", "v000002"))
        wreck.update(version=2, state="writing")
        for record in wreck["files"]:                  # 8 MiB left on disk by the "killed" save
            path = target / record["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"w" * record["bytes"])
        journal["layouts"]["sharded"]["versions"].append(wreck)
        journal["layouts"]["sharded"]["next"] = 3
        journal_path.write_text(json.dumps(journal))
        # 16 MiB used of 20: the next 8 MiB save (v1 kept) fits once the wreck is gone
        saved = stampede("save", str(job), np=2)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        assert not (target / "saves" / "sharded" / "v000002").exists()
