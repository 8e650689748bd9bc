"""One writer per target (stampede.checkpoint.lock): prepare, save and clean each hold the
target's lock while they write; whoever comes second is refused at once, told who holds
it, and the target is left as it was. A lock dies with its holder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stampede.checkpoint.lock import LOCK_NAME, TargetLock
from stampede.errors import CheckpointError
from stampede.launcher import find_mpiexec
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job
from tests.helpers.processes import pids_of


def holder_pid(target: Path) -> int:
    """The pid the target's lock file names (0: none yet)."""
    try:
        return int(json.loads((target / LOCK_NAME).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return 0


def flock_holders(path: Path) -> list[int]:
    """The pids the kernel says hold an flock on `path` (/proc/locks, by inode)."""
    inode = os.stat(path).st_ino
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and fields[-3].endswith(f":{inode}"):
            holders.append(int(fields[-4]))
    return holders


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def test_the_second_holder_is_refused_and_told_who_holds_it(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    first = TargetLock(str(target), "stampede save")
    first.take()
    assert first.created_root and target.is_dir()
    holder = json.loads((target / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["command"] == "stampede save"
    second = TargetLock(str(target), "stampede clean")
    with pytest.raises(CheckpointError, match=f"is in use: stampede save by pid {os.getpid()} on "):
        second.take()
    first.release()                        # gone with its holder: the next one takes it
    second.take()
    second.release()
    third = TargetLock(str(tmp_path / "new"), "stampede prepare")
    third.take()
    third.abandon()                        # refused before writing: nothing of it stays
    assert not (tmp_path / "new").exists()


def test_a_lock_dies_with_its_holder(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time\nfrom stampede.checkpoint.lock import TargetLock\n"
                               f"TargetLock({str(target)!r}, 'stampede save').take()\n"
                               "print('held', flush=True)\ntime.sleep(300)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(CheckpointError, match=f"pid {holder.pid}"):
            TargetLock(str(target), "stampede clean").take()
    finally:
        holder.kill()                      # SIGKILL: no chance to let go itself
        holder.wait()
    TargetLock(str(target), "stampede clean").take()


@pytest.mark.mpi
def test_writers_refuse_a_target_in_use_and_leave_it_as_it_was(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"size": "4MiB", "layout": ["sharded"]},
                    run={"iterations": 1, "warmup": 0, "verify": "none"}, save={"keep": 1})
    target = tmp_path / "ckpt"
    assert stampede("save", str(job), np=2).returncode == 0
    before = files_under(target)
    held = TargetLock(str(target), "stampede save")
    held.take()
    try:
        for command in (["save", str(job)], ["prepare", str(job)], ["clean", str(job)]):
            result = stampede(*command, np=2 if command[0] != "clean" else None)
            assert result.returncode == 2, (command, result.stdout + result.stderr)
            said = " ".join(result.stderr.split())
            assert f"is in use: stampede save by pid {os.getpid()}" in said, said
            assert "Traceback" not in result.stderr
            assert files_under(target) == before
    finally:
        held.release()
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not target.exists()             # the lock file went with the rest


@contextmanager
def held_still(job: Path, target: Path, also: Path | None = None
               ) -> Iterator[subprocess.Popen[str]]:
    """A 30-save job running, its ranks stopped (SIGSTOP) once rank 0 holds the target
    (and the file `also` exists), for the block; then let go on (SIGCONT). The running
    save's Popen."""
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    saving = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", "save",
                               str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=job.parent)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120     # the save holds the target once it names itself
        while (not ranks or holder_pid(target) not in ranks
               or (also is not None and not also.exists())):
            assert saving.poll() is None and time.monotonic() < deadline, saving.communicate()
            ranks = [pid for pid in pids_of(f"-m stampede save {job}") if pid != saving.pid]
            time.sleep(0.01)
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        assert holder_pid(target) in flock_holders(target / LOCK_NAME)   # held, right now
        try:
            yield saving
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
    finally:
        if saving.poll() is None:
            try:
                saving.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                saving.kill()


def long_save(tmp_path: Path) -> Path:
    return small_job(tmp_path, checkpoint={"size": "4MiB", "layout": ["sharded"]},
                     run={"iterations": 30, "warmup": 0, "verify": "none"}, save={"keep": 1})


@pytest.mark.mpi
def test_a_clean_or_a_second_save_during_a_save_is_refused_and_the_save_finishes(
        stampede, tmp_path: Path) -> None:
    """They once collided: clean removed a running save's files (it died on an
    AssertionError), two saves lost a version from the journal. The running save is held
    still while the others try."""
    job, target = long_save(tmp_path), tmp_path / "ckpt"
    with held_still(job, target) as saving:
        for command in (["clean", str(job)], ["save", str(job)]):
            result = stampede(*command, np=2 if command[0] == "save" else None)
            assert result.returncode == 2, (command, result.stdout + result.stderr)
            assert "is in use: stampede save by pid" in " ".join(result.stderr.split())
    out, err = saving.communicate(timeout=RUN_TIMEOUT_S)
    assert saving.returncode == 0, out + err
    journal = json.loads((target / "stampede-saves.json").read_text())
    states = [entry["state"] for entry in journal["layouts"]["sharded"]["versions"]]
    assert states[-1] == "complete" and set(states[:-1]) <= {"released"}
    assert [row["valid"] for row in read_archive(tmp_path / "results" / "job.csv")
            if row["op"] == "save"] == ["true"]


@pytest.mark.mpi
def test_a_journal_removed_by_hand_mid_save_is_one_clear_error(tmp_path: Path) -> None:
    """The lock keeps stampede's clean out, not a hand's rm: the save then stops with
    one line saying the journal vanished (it once died on an AssertionError)."""
    job, target = long_save(tmp_path), tmp_path / "ckpt"
    journal = target / "stampede-saves.json"     # written after the lock is taken
    with held_still(job, target, also=journal) as saving:
        journal.unlink()
    out, err = saving.communicate(timeout=RUN_TIMEOUT_S)
    assert saving.returncode in (1, 2), out + err
    assert "stampede-saves.json vanished while the save ran" in " ".join(err.split())
    assert "Traceback" not in err and "AssertionError" not in err
