"""One writer per target, on every backend (stampede.checkpoint.lock): every command that
touches a target holds its lock (writers exclusive, run shared with other runs); whoever
comes second is refused at once (exit 2), told who holds it, and the target is left as it
was. A POSIX lock dies with its holder; a lock file whose holder is gone is said to be
stale and taken over. Every registered command that takes a job file declares how it
uses the target, and is run here against a held one."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from stampede.backends import open_backend
from stampede.backends.base import missing_root
from stampede.checkpoint.lock import LOCK_NAME, READERS_DIR, TargetLock
from stampede.cli import build_parser
from stampede.errors import CheckpointError
from stampede.launcher import find_mpiexec
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job, write_job
from tests.helpers.processes import pids_of
from tests.helpers.s3server import S3Server


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
    with pytest.raises(CheckpointError, match=f"is in use by stampede save, pid {os.getpid()} "
                                              f"on host {socket.gethostname()} since "):
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
            assert f"is in use by stampede save, pid {os.getpid()} on host" in said, said
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
            assert "is in use by stampede save, pid" in " ".join(result.stderr.split())
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


def test_runs_share_the_lock_and_writers_are_refused_while_one_reads(tmp_path: Path) -> None:
    """A restore must not have its files removed under it (clean during a run once failed
    the run half-way): run's lock is shared with other runs, exclusive of writers."""
    target = tmp_path / "ck"
    target.mkdir()
    first, second = (TargetLock(str(target), "stampede run", "read") for _ in range(2))
    first.take()
    second.take()                          # two restores at once: both go on
    with pytest.raises(CheckpointError, match=f"in use by stampede run, pid {os.getpid()}"):
        TargetLock(str(target), "stampede clean").take()
    first.release()
    second.release()
    writer = TargetLock(str(target), "stampede save")
    writer.take()
    with pytest.raises(CheckpointError, match="in use by stampede save"):
        TargetLock(str(target), "stampede run", "read").take()
    writer.release()
    TargetLock(str(tmp_path / "missing"), "stampede run", "read").take()   # run says why
    assert not (tmp_path / "missing").exists()


def test_a_store_without_an_exclusive_create_is_said_to_be_not_locked() -> None:
    target = f"memory://stampede-lock/{uuid.uuid4().hex}"
    lock = TargetLock(target, "stampede run", "read", open_backend(target))
    lock.take()
    assert not lock.held
    assert lock.note == (f"target.path = {target!r}: not locked: the memory backend has no "
                         "exclusive create, so one writer at a time is not enforced here")


# --- every command that takes a job file: declared, and holding the lock ------------------

def job_commands() -> dict[str, argparse.ArgumentParser]:
    """Every registered command with a `job` positional (add_job_arguments), by name."""
    parser = build_parser(["--help"])
    action = next(action for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction))
    return {name: sub for name, sub in action.choices.items()
            if any(not option.option_strings and option.dest == "job" for option in sub._actions)}


def test_every_job_command_declares_how_it_uses_the_target() -> None:
    commands = job_commands()
    declared = {name: sub.get_default("target_access") for name, sub in commands.items()}
    assert set(declared.values()) <= {"write", "read", "none"}, declared
    # the ones that touch a target, as lock.py's docstring lists them
    assert {name for name, access in declared.items() if access == "write"} == \
        {"prepare", "save", "cycle", "rejoin", "clean"}
    assert {name for name, access in declared.items() if access == "read"} == {"run"}


def test_every_command_that_touches_a_target_is_refused_while_another_holds_it(
        stampede, tmp_path: Path) -> None:
    """Each registered command that declares write or read access, run (one process)
    against a target a save holds: exit 2, the holder named, the target as it was."""
    job = small_job(tmp_path, checkpoint={"size": "4MiB", "layout": ["sharded"]},
                    run={"iterations": 1, "warmup": 0, "verify": "none"}, save={"keep": 1})
    target = tmp_path / "ckpt"
    assert stampede("prepare", str(job)).returncode == 0
    before = files_under(target)
    touching = [name for name, sub in job_commands().items()
                if sub.get_default("target_access") != "none"]
    held = TargetLock(str(target), "stampede save")
    held.take()
    try:
        for command in [[name] for name in touching] + [["rejoin", "--clean"]]:
            result = stampede(*command, str(job))
            said = " ".join(result.stderr.split())
            assert result.returncode == 2, (command, said)
            assert f"is in use by stampede save, pid {os.getpid()} on host" in said, said
            assert "did not finish" not in said and "Traceback" not in said, said
            assert files_under(target) == before, command
    finally:
        held.release()
    print(f"checked against a held target: {', '.join(touching)}, rejoin --clean")


# --- the pairs, on every backend -------------------------------------------------------

@pytest.fixture(params=["posix", "nfs", "s3"])
def locked_target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, Any]]:
    """(kind, target.path, storage_options) of a fresh target of each kind."""
    kind = request.param
    if kind == "posix":
        return kind, str(tmp_path / "ckpt"), {}
    if kind == "nfs":
        return kind, request.getfixturevalue("nfs_target"), {"timeout_ms": 5000}
    server: S3Server = request.getfixturevalue("s3_env")
    return kind, f"s3://{server.bucket}/lock-{uuid.uuid4().hex[:12]}", \
        {"endpoint_url": server.endpoint_url, "max_attempts": 2}


def holder(target: str, options: dict[str, Any], command: str, access: str) -> TargetLock:
    """The lock taken from this process through the same API the commands use."""
    backend = None if "://" not in target else open_backend(target, options)
    lock = TargetLock(target, command, access, backend)   # type: ignore[arg-type]
    lock.take()
    return lock


def dead_pid() -> int:
    """A pid no process has now (a child that ran and was reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_prepare_save_clean_rejoin_and_run_in_pairs_on_every_backend(
        stampede, tmp_path: Path, locked_target: tuple[str, str, dict[str, Any]]) -> None:
    """A first command holds the target (a save, then a run); each second one is refused
    (exit 2) naming it, and nothing on the target changes; a run beside a run goes on.
    Then, the holder gone, its lock is said to be stale and taken over."""
    kind, target, options = locked_target
    job = small_job(tmp_path, target={"path": target, "storage_options": options},
                    checkpoint={"size": "4MiB", "layout": ["sharded"]},
                    run={"iterations": 1, "warmup": 0, "verify": "none"}, save={"keep": 1})
    backend = open_backend(target, options)
    prepared = stampede("prepare", str(job))
    assert prepared.returncode == 0, prepared.stderr
    def checkpoint() -> list[str]:   # what the target holds, its locks aside
        return [name for name in backend.names()
                if name != LOCK_NAME and not name.startswith(READERS_DIR + "/")]

    before = checkpoint()
    writers = ("prepare", "save", "clean", "rejoin")
    for command, access in (("stampede save", "write"), ("stampede run", "read")):
        held = holder(target, options, command, access)
        try:
            for second in (*writers, *(("run",) if access == "write" else ())):
                result = stampede(second, str(job))
                said = " ".join(result.stderr.split())
                assert result.returncode == 2, (kind, command, second, said)
                assert f"is in use by {command}, pid {os.getpid()} on host " \
                       f"{socket.gethostname()} since " in said, (second, said)
                assert "did not finish" not in said
                assert checkpoint() == before
            if access == "read":            # runs share it
                beside = stampede("run", str(job))
                assert beside.returncode == 0, beside.stderr
        finally:
            held.release()
    if kind == "posix":                     # an flock dies with its holder: never stale
        return
    record = {"command": "stampede save", "pid": dead_pid(), "host": socket.gethostname(),
              "since": "2026-12-03T09:00:00+0000", "started": None, "nonce": "gone"}
    backend.create_new(LOCK_NAME, json.dumps(record).encode())   # type: ignore[attr-defined]
    elsewhere = {**record, "pid": 1, "host": "another-node", "nonce": "far"}
    backend.create_new(f"{READERS_DIR}/far", json.dumps(elsewhere).encode())  # type: ignore[attr-defined]
    refused = stampede("save", str(job))    # the writer's lock is stale; the reader's is not
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, said
    assert "is in use by stampede save, pid 1 on host another-node" in said, said
    assert f"remove {target.rstrip('/')}/{READERS_DIR}/far by hand" in said, said
    assert backend.get_bytes(LOCK_NAME) is None     # the stale one was taken over, then let go
    backend.remove(f"{READERS_DIR}/far")
    backend.create_new(LOCK_NAME, json.dumps(record).encode())   # type: ignore[attr-defined]
    cleaned = stampede("clean", str(job))
    said = " ".join(cleaned.stderr.split())
    assert cleaned.returncode == 0, said
    assert missing_root(backend) or kind == "s3"    # the directory prepare made: gone too
    assert f"the lock left by stampede save, pid {record['pid']} on host " \
           f"{socket.gethostname()} since 2026-12-03T09:00:00+0000, which is gone (a run " \
           "that did not finish), taken over" in said, said
    assert backend.names() == []


def test_a_refusal_before_the_first_phase_leaves_nothing(stampede, tmp_path: Path) -> None:
    """--trace past its limit is refused before the first phase: no lock file, no
    journal, no directory (they were once left behind)."""
    job = small_job(tmp_path, checkpoint={"size": "4MiB", "layout": ["sharded"]},
                    run={"iterations": 1, "warmup": 0, "verify": "none"}, save={"keep": 1})
    result = stampede("save", str(job), "--trace", "--trace-limit", "1")
    assert result.returncode == 2, result.stderr
    assert "more than --trace-limit" in " ".join(result.stderr.split())
    assert not (tmp_path / "ckpt").exists()


def test_clean_names_rejoin_clean_for_what_a_rejoin_left(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"size": "4MiB", "layout": ["sharded"]})
    left = tmp_path / "ckpt" / "tiers-job"
    left.mkdir(parents=True)
    (left / "shard-000000.raw").write_bytes(b"x")
    result = stampede("clean", str(job))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2, said
    assert f"{left}/ holds what a rejoin of this job left (1 file(s)): `stampede rejoin " \
           f"--clean {job}` removes it" in said, said
    assert (left / "shard-000000.raw").exists()


NODES_LAUNCHER = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
exec unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def rejoin_command(tmp_path: Path, *args: str) -> list[str]:
    """stampede rejoin on nodeA, nodeB, nodeC (a UTS namespace each), one rank each."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("named nodes need root and unshare (a UTS namespace per node)")
    launcher = tmp_path / "launcher"
    launcher.write_text(NODES_LAUNCHER)
    launcher.chmod(0o755)
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    return [mpiexec, "-launcher", "ssh", "-launcher-exec", str(launcher), "-hosts",
            "nodeA:1,nodeB:1,nodeC:1", "-n", "3", sys.executable, "-m", "stampede", "rejoin",
            *args]


@pytest.mark.mpi
def test_rejoin_clean_during_a_live_rejoin_is_refused_and_the_rejoin_finishes(
        tmp_path: Path) -> None:
    """A rejoin once held no lock, and the hint it printed for a live run ("left by a
    rejoin that did not finish: `rejoin --clean` removes it") removed that run's files."""
    target, local = tmp_path / "target", tmp_path / "local"
    job = write_job(tmp_path, "tiers", target={"path": str(target)},
                    checkpoint={"size_per_rank": "4MiB", "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 1, "verify": "xxh3"},
                    tiers={"local_dir": str(local)},
                    archive={"path": str(tmp_path / "results" / "tiers.csv")})
    live = subprocess.Popen(rejoin_command(tmp_path, str(job)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 120   # stopped once it holds the target and wrote a tier
        while not ranks or holder_pid(target) not in ranks or \
                not any(path.is_file() for path in local.rglob("*")):
            assert live.poll() is None and time.monotonic() < deadline, live.communicate()
            ranks = [pid for pid in pids_of(f"-m stampede rejoin {job}")
                     if pid != live.pid and pid not in descendants_of_launcher(live.pid)]
            time.sleep(0.01)
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        written = sorted(str(path) for path in local.rglob("*") if path.is_file())
        try:
            for args in (["--clean"], []):
                refused = subprocess.run(rejoin_command(tmp_path, str(job), *args),
                                         capture_output=True, text=True, cwd=tmp_path,
                                         timeout=RUN_TIMEOUT_S)
                said = " ".join((refused.stdout + refused.stderr).split())
                assert refused.returncode == 2, said
                assert f"is in use by stampede rejoin, pid {holder_pid(target)} on host nodeA" \
                       in said, said
                assert "did not finish" not in said, said
                assert sorted(str(path) for path in local.rglob("*")
                              if path.is_file()) == written
        finally:
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
        out, err = live.communicate(timeout=RUN_TIMEOUT_S)
        assert live.returncode == 0, out + err
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert not target.exists()             # the run removed all it made, its lock too


def descendants_of_launcher(pid: int) -> list[int]:
    """The launcher's own processes (mpiexec, its proxies, the unshare shells), which carry
    the same command line as the ranks: only the Python ranks are stopped."""
    return [found for found in pids_of("-m stampede rejoin")
            if not Path(f"/proc/{found}/exe").exists()
            or "python" not in os.path.basename(os.readlink(f"/proc/{found}/exe"))]
