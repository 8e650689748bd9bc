"""`stampede emulate-mds`: real FUSE mounts, real `stampede run` through them.

The emulator serves every metadata request in one of C slots of S seconds. These tests
check that it mounts and always unmounts (signals, a dead parent), refuses what it should,
and, by the emulator's own log of what it served (--log), what a stat costs it, that one
file's requests queue one at a time, and that stampede's latencies hold at least the
service they met. No assertion rests on how fast this machine was: the wall-clock
agreement with the model is bench/model_vs_emulator.py's.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stampede import cli
from stampede.emulate.mds import MetadataServer
from stampede.emulate.mount import (
    emulate_command,
    force_unmount,
    is_mounted,
    probe_ops,
    read_requests,
    read_summary,
    requests_path,
    requests_per_op,
    running,
)
from stampede.emulate.service import Served
from tests.helpers.jobs import read_archive, small_job

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("no_mount_left")]


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def backing_dir(tmp_path: Path) -> Path:
    backing = tmp_path / "backing"
    (backing / "sharded").mkdir(parents=True)
    (backing / "sharded" / "shard.raw").write_bytes(os.urandom(100_000))
    return backing


# --- lifecycle --------------------------------------------------------------------------------


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_mounted_until_signalled_then_unmounted(fuse_ready: None, tmp_path: Path,
                                                signal_number: int) -> None:
    backing, mountpoint = backing_dir(tmp_path), tmp_path / "mnt"
    with running(backing, mountpoint, "--service-s", "0.001") as daemon:
        assert os.listdir(mountpoint) == ["sharded"]
        shard = mountpoint / "sharded" / "shard.raw"
        assert shard.read_bytes() == (backing / "sharded" / "shard.raw").read_bytes()
        assert os.stat(shard).st_size == 100_000
        with pytest.raises(OSError):                     # read-only
            os.open(mountpoint / "sharded" / "new", os.O_WRONLY | os.O_CREAT)
        daemon.send_signal(signal_number)
        assert daemon.wait(timeout=10) == 0
        assert not is_mounted(mountpoint)
    log = mountpoint.with_suffix(".log").read_text()
    assert "mounted" in log and f"unmounted {mountpoint}" in log
    assert "metadata request(s) served, at most 1 at once: getattr" in log
    assert "Traceback" not in log
    summary = read_summary(mountpoint)
    assert summary["service_s"] == 0.001 and summary["peak_in_service"] == 1
    assert summary["ops"]["getattr"]["held_p50_s"] >= 0.001


def test_unmounted_when_its_parent_dies(fuse_ready: None, tmp_path: Path) -> None:
    backing, mountpoint = backing_dir(tmp_path), tmp_path / "mnt"
    mountpoint.mkdir()
    parent_script = ("import subprocess, sys, time\n"
                     "child = subprocess.Popen(sys.argv[2:], stderr=open(sys.argv[1], 'wb'))\n"
                     "print(child.pid, flush=True)\n"
                     "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_script, str(tmp_path / "mnt.log"),
                               *emulate_command(backing, mountpoint)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert wait_for(lambda: is_mounted(mountpoint)), (tmp_path / "mnt.log").read_text()
        parent.kill()                                   # SIGKILL: the parent cannot clean up
        parent.wait()
        assert wait_for(lambda: not is_mounted(mountpoint), timeout=10)
        assert wait_for(lambda: not alive(child), timeout=10)
        assert f"unmounted {mountpoint}" in (tmp_path / "mnt.log").read_text()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if alive(child):
            os.kill(child, signal.SIGKILL)
        force_unmount(mountpoint)


def test_an_emulator_whose_parent_exited_before_it_started_mounts_nothing(fuse_ready: None,
                                                                          tmp_path: Path) -> None:
    """`( stampede emulate-mds ... & )`: the subshell exits before Python has started, so
    the parent-death signal comes too late and the emulator was adopted at once. The
    subshell has a session of its own, as a terminal's has (see `orphaned`)."""
    backing, mountpoint, log = backing_dir(tmp_path), tmp_path / "mnt", tmp_path / "mnt.log"
    mountpoint.mkdir()
    command = shlex.join(emulate_command(backing, mountpoint))
    started = subprocess.run(["sh", "-c", f"{command} >/dev/null 2>{shlex.quote(str(log))} & echo $!"],
                             capture_output=True, text=True, timeout=30, start_new_session=True)
    emulator = int(started.stdout)
    try:
        assert wait_for(lambda: not alive(emulator), timeout=20), log.read_text()
        assert not is_mounted(mountpoint)
        assert "the process that started emulate-mds exited" in log.read_text()
    finally:
        if alive(emulator):
            os.kill(emulator, signal.SIGKILL)
        force_unmount(mountpoint)


ORPHAN_CHECK = ("import os, sys, time\n"
                "started_by = os.getppid()\n"
                "time.sleep(0.5)\n"
                "from stampede.emulate.mds import orphaned\n"
                "open(sys.argv[1], 'w').write(str(orphaned(started_by)))\n")


@pytest.mark.parametrize(("how", "expected"), [("child", "False"), ("subshell", "True"),
                                               ("setsid in a subshell", "False")])
def test_who_counts_as_orphaned(tmp_path: Path, how: str, expected: str) -> None:
    """A child of a living parent is not; one adopted by a reaper is, even when it was adopted
    before its first line ran; a session leader (setsid: meant to run detached) is not.
    The subshells run in a session of their own, as a terminal's do, so the reaper that
    adopts (init, a subreaper) is outside it wherever the suite runs (see `orphaned`)."""
    answer = tmp_path / "answer"
    check = shlex.join([sys.executable, "-c", ORPHAN_CHECK, str(answer)])
    shell = {"child": check, "subshell": f"{check} &", "setsid in a subshell": f"setsid {check} &"}
    if how == "setsid in a subshell" and shutil.which("setsid") is None:
        pytest.skip("setsid (util-linux) is not installed")
    subprocess.run(["sh", "-c", shell[how]], timeout=30, check=True,
                   start_new_session=how != "child")
    assert wait_for(lambda: answer.exists() and answer.read_text() != "", timeout=20)
    assert answer.read_text() == expected


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie its new parent has yet to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as status:
            return status.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_non_empty_mountpoint_is_refused(stampede, fuse_ready: None, tmp_path: Path) -> None:
    backing, mountpoint = backing_dir(tmp_path), tmp_path / "mnt"
    mountpoint.mkdir()
    (mountpoint / "precious").write_text("keep me")
    result = stampede("emulate-mds", str(mountpoint), "--backing", str(backing), timeout=30)
    assert result.returncode == 2, result.stderr
    assert "not empty" in result.stderr
    assert not is_mounted(mountpoint)
    assert (mountpoint / "precious").read_text() == "keep me"


def test_other_users_get_what_the_modes_allow(fuse_ready: None, tmp_path: Path) -> None:
    """allow_other without the kernel's permission checks: the emulator checks the modes."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to act as another user")
    # pytest's own tmp directories are root-only: mount where another user can walk to
    outer = Path(tempfile.mkdtemp(prefix="stampede-emulate-test-"))
    try:
        backing, mountpoint = backing_dir(outer), outer / "mnt"
        (backing / "secret").write_text("root only")
        (backing / "secret").chmod(0o600)
        (backing / "sharded" / "shard.raw").chmod(0o644)
        for directory in (outer, backing, backing / "sharded"):
            directory.chmod(0o755)
        nobody = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        with running(backing, mountpoint, "--service-s", "0.001"):
            secret = subprocess.run([*nobody, "cat", str(mountpoint / "secret")],
                                    capture_output=True, text=True)
            shard = subprocess.run([*nobody, "wc", "-c", str(mountpoint / "sharded" / "shard.raw")],
                                   capture_output=True, text=True)
            assert (mountpoint / "secret").read_text() == "root only"        # root may
        assert secret.returncode == 1 and "Permission denied" in secret.stderr
        assert shard.returncode == 0 and shard.stdout.startswith("100000 "), shard.stderr
    finally:
        if not is_mounted(outer / "mnt"):          # never delete through a live mount
            shutil.rmtree(outer)


@pytest.mark.parametrize("threads", [1, 4])
def test_slots_serve_requests_in_parallel(fuse_ready: None, tmp_path: Path, threads: int) -> None:
    backing, mountpoint, service_s = tmp_path / "backing", tmp_path / "mnt", 0.1
    backing.mkdir()
    for index in range(4):
        (backing / f"file{index}").write_bytes(b"x")
    files = [mountpoint / f"file{index}" for index in range(4)]
    with running(backing, mountpoint, "--service-s", str(service_s), "--threads", str(threads)):
        for path in files:
            # The kernel learns each name first; later stats revalidate it, as every stat
            # after a restore's warmup does
            os.stat(path)
        # 4 stats at once, each a LOOKUP and a GETATTR (files in the mount's root): 8 requests,
        # 2 rounds of service with 4 slots, 8 rounds with one.
        start = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(os.stat, files))
        elapsed = time.perf_counter() - start
    rounds = 8 // threads
    assert elapsed >= rounds * service_s, f"{elapsed * 1e3:.1f} ms"   # the slots bind
    # ... and serve at once as many as they are: the emulator's own record, not the clock
    assert read_summary(mountpoint)["peak_in_service"] == threads


# --- refusals that need no FUSE (in-process, nothing is mounted) ------------------------------


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    return capsys.readouterr().err


HINT = "pip install 'stampede[emulate]' and apt-get install fuse3"


def test_refusals_before_anything_is_is_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    backing, mountpoint = backing_dir(tmp_path), tmp_path / "mnt"
    mountpoint.mkdir()
    base = ["emulate-mds", str(mountpoint), "--backing", str(backing)]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "--threads 0: must be at least 1" in refusal([*base, "--threads", "0"], capsys)
    assert "--service-s -1.0" in refusal([*base, "--service-s", "-1"], capsys)
    assert "not a directory" in refusal([*base[:3], str(tmp_path / "nowhere")], capsys)
    assert "mountpoint" in refusal(["emulate-mds", str(tmp_path / "nowhere"), "--backing",
                                    str(backing)], capsys)
    # what it writes at exit, checked before it serves (it once served a whole experiment
    # and then lost the summary to /proc)
    assert "--summary-json /proc/x.json: cannot write in /proc" in refusal(
        [*base, "--summary-json", "/proc/x.json"], capsys)
    same = str(tmp_path / "same.json")
    assert "--log " + same + ": is the --summary-json output" in refusal(
        [*base, "--summary-json", same, "--log", same], capsys)
    assert "--log-limit 0: must be at least 1" in refusal([*base, "--log", same, "--log-limit", "0"],
                                                          capsys)
    (backing / "inner").mkdir()
    assert "inside --backing" in refusal(["emulate-mds", str(backing / "inner"), "--backing",
                                          str(backing)], capsys)
    monkeypatch.setitem(sys.modules, "mfusepy", None)    # mfusepy not installed
    message = refusal(base, capsys)
    assert message.count("\n") == 1, message             # one line
    assert "needs mfusepy" in message and HINT in message
    if importlib.util.find_spec("mfusepy") is not None:  # mfusepy there, libfuse 3 not
        monkeypatch.delitem(sys.modules, "mfusepy")
        monkeypatch.setenv("FUSE_LIBRARY_PATH", str(tmp_path / "nowhere" / "libfuse3.so.3"))
        message = refusal(base, capsys)
        assert message.count("\n") == 1, message
        assert "needs the libfuse 3 library" in message and HINT in message
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root only" in refusal(base, capsys)
    assert not is_mounted(mountpoint)


def storm(server: MetadataServer, path: str, callers: int = 4) -> float:
    """`callers` threads stat path at once (a barrier lets them go together): seconds."""
    together = threading.Barrier(callers)

    def call(_: int) -> None:
        together.wait()
        server.getattr(path)

    start = time.monotonic()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(call, range(callers)))
    return time.monotonic() - start


def test_the_service_model_without_fuse(tmp_path: Path) -> None:
    """MetadataServer alone: the lock per file (not per directory), the slots, a negative
    lookup, jitter. Checked on the server's own record (how many were in service at once,
    what each held) and on lower bounds, which a busy machine cannot break."""
    backing, service_s = backing_dir(tmp_path), 0.1
    serial = MetadataServer(str(backing), service_s, threads=2, serialize=True)
    assert storm(serial, "/sharded/shard.raw") >= 4 * service_s
    assert serial.tally.peak_in_service == 1             # one file: one at a time, 2 slots or not
    slots = MetadataServer(str(backing), service_s, threads=2, serialize=True)
    assert storm(slots, "/sharded") >= 2 * service_s     # a directory is never serialized ...
    assert slots.tally.peak_in_service == 2              # ... so both slots serve, never more
    for server in (serial, slots):
        served = server.tally.summaries()["getattr"]
        assert served["count"] == 4 and served["asked_mean_s"] == service_s
        assert served["held_p50_s"] >= service_s and served["over_p50_s"] >= 0
    with pytest.raises(FileNotFoundError):               # a negative lookup costs too
        serial.getattr("/missing")
    assert serial.tally.summaries()["getattr"]["count"] == 5
    jittery = MetadataServer(str(backing), 0.0, threads=1, jitter_s=0.01)
    for _ in range(20):
        jittery.getattr("/sharded")
    served = jittery.tally.summaries()["getattr"]
    assert 0 < served["asked_mean_s"] < 0.01             # S + uniform [0, J)
    assert len(jittery.tally.ops["getattr"].held_us) > 1  # not one service time for all


def test_the_operation_runs_inside_the_service_time(tmp_path: Path) -> None:
    """A slot is held until take-time + S: the real operation's own time is part of S."""
    server = MetadataServer(str(backing_dir(tmp_path)), 0.3, threads=1)
    start = time.monotonic()
    server._serve("getattr", "/sharded", False, lambda: time.sleep(0.2))
    elapsed = time.monotonic() - start
    held = server.tally.summaries()["getattr"]["held_mean_s"]
    assert 0.3 <= held <= elapsed < 0.3 + 0.2    # S, not S + the operation's 0.2 s


# --- what stampede measures through it, checked by the emulator's own log ------------------

SERVICE_S = 0.02
SHARD = "/sharded/shard-00000-of-00001.raw"


def never_overlap(served: list[Served]) -> bool:
    """One at a time: each request took its slot after the previous one left it."""
    spans = sorted((item.taken_s, item.left_s) for item in served)
    return all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:]))


def test_a_stat_is_the_requests_the_log_shows_and_stampede_measures_at_least_their_service(
        stampede, fuse_ready: None, tmp_path: Path) -> None:
    """One stat(2) of MOUNT/sharded/shard-….raw with the kernel's entry and attribute caches
    off is three requests, each a service time: LOOKUP "sharded" (the entry is revalidated
    on every path walk; the mount's root never is), LOOKUP the shard's name, GETATTR of
    the shard (its attributes expired at once); the emulator's log shows them. stampede's
    stats then each took at least those three service times (a floor no load can break),
    and the log holds every one of its requests."""
    job = small_job(tmp_path, checkpoint={"layout": "sharded", "size": "1MiB"},
                    pattern={"ops": ["stat"], "stat_count": 20}, run={"verify": "none"})
    assert stampede("prepare", str(job)).returncode == 0       # into the backing dir directly
    mountpoint = tmp_path / "mnt"
    with running(tmp_path / "ckpt", mountpoint, "--service-s", str(SERVICE_S), "--threads", "4"):
        windows = probe_ops(mountpoint / SHARD.lstrip("/"))
        result = stampede("run", str(job), "--set", f"target.path={mountpoint}", timeout=60)
        assert result.returncode == 0, result.stderr
    log = read_requests(mountpoint)
    one_stat = requests_per_op(log, windows)["stat"]
    assert [(item.op, item.paths) for item in one_stat] == [
        ("getattr", ("/sharded",)), ("getattr", (SHARD,)), ("getattr", (SHARD,))]
    [row] = [row for row in read_archive(tmp_path / "results" / "job.csv") if row["op"] == "stat"]
    assert int(row["count"]) == 40 and row["fs_type"] == "fuse"
    # every stat of the run: its directory's LOOKUP, the file's LOOKUP and GETATTR
    on_file = [item for item in log if item.paths == (SHARD,) and item.arrived_s > windows["open"][1]]
    assert len(on_file) >= 2 * 40
    assert all(item.left_s - item.taken_s >= SERVICE_S for item in log)      # each held S
    assert float(row["lat_min_s"]) >= len(one_stat) * SERVICE_S              # the floor
    assert float(row["lat_p50_s"]) < 3 * len(one_stat) * SERVICE_S           # generous: 3x
    assert read_summary(mountpoint)["log"] == {"path": str(requests_path(mountpoint)),
                                               "requests": len(log), "dropped": 0}


def test_a_shared_files_requests_queue_one_at_a_time_in_arrival_order(stampede, fuse_ready: None,
                                                                      tmp_path: Path) -> None:
    """4 ranks stat the shared file 10 times each through an emulator that serializes
    requests per file: its log shows every request on the file queued on the file's lock,
    served one at a time in arrival order, each shard's on a lock of its own; so the shared
    layout's stat phase lasted at least all of the file's requests back to back (the hot
    spot: N times the service a rank alone needs), where sharded's stats only each cost
    their own three. How much longer shared's stats take on a real clock is
    bench/model_vs_emulator.py's."""
    ranks, service_s, stats = 4, 0.01, 10
    job = small_job(tmp_path, checkpoint={"size": "4MiB"},
                    pattern={"ops": ["stat"], "stat_count": stats},
                    run={"verify": "none", "iterations": 1})
    assert stampede("prepare", str(job), np=ranks).returncode == 0
    mountpoint, archive = tmp_path / "mnt", tmp_path / "stat.csv"
    with running(tmp_path / "ckpt", mountpoint, "--service-s", str(service_s), "--threads",
                 str(ranks), "--serialize-inode"):
        result = stampede("run", str(job), "--set", f"target.path={mountpoint}", "--set",
                          f"archive.path={archive}", np=ranks)
        assert result.returncode == 0, result.stderr
    log = read_requests(mountpoint)
    shared = "/shared/checkpoint.raw"
    on_shared = [item for item in log if item.paths == (shared,)]
    assert all(item.locks == (f"file:{shared}",) for item in on_shared)
    assert never_overlap(on_shared)
    by_arrival = sorted(on_shared, key=lambda item: item.arrived_s)
    assert [item.taken_s for item in by_arrival] == sorted(item.taken_s for item in on_shared)
    timed = 2 * ranks * stats                    # the file's LOOKUP and GETATTR per stat
    assert len(on_shared) >= timed
    # each shard's requests on its own file's lock, that no other rank's stats queue on;
    # the directories' lookups on none (a directory is never serialized)
    for item in log:
        directory = item.paths[0] in ("/", "/shared", "/sharded")
        assert item.locks == (() if directory else (f"file:{item.paths[0]}",)), item
    rows = {row["layout"]: row for row in read_archive(archive) if row["op"] == "stat"}
    assert {layout: int(row["count"]) for layout, row in rows.items()} == \
        {"shared": ranks * stats, "sharded": ranks * stats}
    assert float(rows["shared"]["elapsed_s"]) >= timed * service_s
    for row in rows.values():
        assert float(row["lat_min_s"]) >= 3 * service_s


def test_a_dead_mount_is_named_a_stale_mount_not_a_missing_directory(stampede, fuse_ready: None,
                                                                     tmp_path: Path) -> None:
    """An emulator SIGKILLed leaves its mount dead ("Transport endpoint is not connected"):
    mounting there again says so, with the fusermount that clears it (it once said "not a
    directory" and suggested mkdir)."""
    backing, mountpoint = backing_dir(tmp_path), tmp_path / "mnt"
    mountpoint.mkdir()
    daemon = subprocess.Popen(emulate_command(backing, mountpoint), stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: is_mounted(mountpoint))
        daemon.kill()
        daemon.wait()
        result = stampede("emulate-mds", str(mountpoint), "--backing", str(backing), timeout=30)
        assert result.returncode == 2, result.stderr
        assert "Transport endpoint is not connected (a stale mount?)" in result.stderr
        assert f"fusermount -u {mountpoint}" in result.stderr
    finally:
        if daemon.poll() is None:
            daemon.kill()
        force_unmount(mountpoint)
