"""`stampede emulate-mds --writable`: the save's requests held in slots of their own
service times, the directory's lock, who may write; then `stampede save` through it,
and the create storm of one directory against fan-out, told apart by the service time.

Wall-clock only bounds from below (a service time is a floor); the rest is checked on
what the server records: its log of every request (the locks it queued on, when it took
and left its slot) and its summary (what each held, how many were in service at once).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stampede import cli
from stampede.emulate.mount import read_requests, read_summary, running
from stampede.emulate.service import Served, ServiceLog
from stampede.emulate.writable import WritableServer
from tests.helpers.jobs import read_archive, small_job

pytestmark = [pytest.mark.usefixtures("no_mount_left")]

SERVICE_S = 0.1


def at_once(calls: list[Callable[[], object]]) -> float:
    """Every call in its own thread, released together by a barrier: seconds for all."""
    together = threading.Barrier(len(calls))

    def call(index: int) -> None:
        together.wait()
        calls[index]()

    start = time.monotonic()
    with ThreadPoolExecutor(len(calls)) as pool:
        list(pool.map(call, range(len(calls))))
    return time.monotonic() - start


def creating(server: WritableServer, path: str) -> Callable[[], object]:
    return lambda: os.close(server.create(path, 0o640))


def server_on(tmp_path: Path, **options: object) -> WritableServer:
    backing = tmp_path / "backing"
    for name in ("one", "d0", "d1", "d2", "d3"):
        (backing / name).mkdir(parents=True, exist_ok=True)
    return WritableServer(str(backing), 0.0, threads=4, op_s={"create": SERVICE_S,
                                                              "rename": SERVICE_S},
                          log=ServiceLog(), **options)


@pytest.mark.parametrize("serialize_dir", [True, False], ids=["--serialize-dir", "without"])
def test_the_directory_lock_without_fuse(tmp_path: Path, serialize_dir: bool) -> None:
    """The server alone (FUSE's kernel would queue one directory's creates itself), read
    by its log: with --serialize-dir, 4 creates in one directory queue on its lock and go
    one at a time in arrival order, 4 in four directories each take a lock of their own;
    without it, none queues, and the 4 slots serve them together."""
    server = server_on(tmp_path, serialize_dir=serialize_dir)
    one = at_once([creating(server, f"/one/f{index}") for index in range(4)])
    log = server.log.entries() if server.log else []
    assert [item.locks for item in log] == [("dir:/one",) if serialize_dir else ()] * 4
    assert all(item.left_s - item.taken_s >= SERVICE_S for item in log)   # each held S
    if serialize_dir:
        assert never_overlap(log) and one >= 4 * SERVICE_S     # one at a time: 4 S at least
        assert [item.taken_s for item in sorted(log, key=lambda item: item.arrived_s)] == \
            sorted(item.taken_s for item in log)               # in arrival order
    assert server.tally.summaries()["create"]["peak_in_service"] == (1 if serialize_dir else 4)
    spread = server_on(tmp_path / "spread", serialize_dir=serialize_dir)
    assert at_once([creating(spread, f"/d{index}/f") for index in range(4)]) >= SERVICE_S
    spread_log = spread.log.entries() if spread.log else []
    assert sorted(item.locks for item in spread_log) == \
        ([(f"dir:/d{index}",) for index in range(4)] if serialize_dir else [()] * 4)
    assert spread.tally.summaries()["create"]["peak_in_service"] == 4
    served = spread.tally.summaries()["create"]
    assert served["count"] == 4 and served["asked_mean_s"] == SERVICE_S
    assert served["held_p50_s"] >= SERVICE_S
    assert sorted(os.listdir(tmp_path / "backing" / "one")) == ["f0", "f1", "f2", "f3"]


def never_overlap(served: list[Served]) -> bool:
    """One at a time: each request took its slot after the previous one left it."""
    spans = sorted((item.taken_s, item.left_s) for item in served)
    return all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:]))


def test_a_rename_waits_for_both_directories(tmp_path: Path) -> None:
    """A rename from d0 to d1 takes both directories' locks, in path order; while a create
    in d1 holds d1's, the two never hold their slots at once, whichever came first."""
    server = server_on(tmp_path, serialize_dir=True)
    os.close(server.create("/d0/x", 0o640))
    holding = threading.Thread(target=creating(server, "/d1/busy"))
    holding.start()
    server.rename("/d0/x", "/d1/y")
    holding.join()
    log = server.log.entries() if server.log else []
    renamed = [item for item in log if item.op == "rename"]
    assert [(item.paths, item.locks) for item in renamed] == \
        [(("/d0/x", "/d1/y"), ("dir:/d0", "dir:/d1"))]
    assert never_overlap([item for item in log if "dir:/d1" in item.locks])
    assert sorted(os.listdir(tmp_path / "backing" / "d1")) == ["busy", "y"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")
def test_who_may_write_and_who_owns_what_is_created(tmp_path: Path) -> None:
    caller = (4321, 4321, 0)
    server = WritableServer(str(tmp_path), 0.0, threads=2, caller=lambda: caller)
    (tmp_path / "theirs").mkdir(mode=0o755)          # root's
    (tmp_path / "mine").mkdir()
    os.chown(tmp_path / "mine", 4321, 4321)
    (tmp_path / "theirs" / "file").write_text("root's")
    for refused in (lambda: server.create("/theirs/new", 0o644),
                    lambda: server.mkdir("/theirs/new", 0o755),
                    lambda: server.unlink("/theirs/file"),
                    lambda: server.rename("/theirs/file", "/mine/file"),
                    lambda: server.open("/theirs/file", os.O_WRONLY),
                    lambda: server.truncate("/theirs/file", 0)):
        with pytest.raises(PermissionError):
            refused()
    with pytest.raises(PermissionError):
        server.chmod("/theirs/file", 0o777)
    os.close(server.create("/mine/new", 0o640))
    server.mkdir("/mine/sub", 0o750)
    for name, mode in (("new", 0o640), ("sub", 0o750)):
        status = os.stat(tmp_path / "mine" / name)
        assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (4321, 4321, mode)
    assert (tmp_path / "theirs" / "file").read_text() == "root's"


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


def test_write_flags_are_refused_without_writable(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = ["emulate-mds", str(tmp_path / "mnt"), "--backing", str(tmp_path)]
    assert "--create-s: only with --writable" in refusal([*base, "--create-s", "0.01"], capsys)
    assert "--serialize-dir: only with --writable" in refusal([*base, "--serialize-dir"], capsys)
    assert "--fsync-s -1.0: must be a finite number >= 0" in refusal(
        [*base, "--writable", "--fsync-s", "-1"], capsys)


# --- stampede save through it ---------------------------------------------------------------


@pytest.mark.mpi
def test_every_layout_saves_through_it_and_restores_verified(stampede, fuse_ready: None,
                                                             tmp_path: Path) -> None:
    backing, mountpoint = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    layouts = ["shared", "sharded", "fan-out", "metadata-first"]
    job = small_job(tmp_path, target={"path": str(mountpoint)},
                    checkpoint={"size": "4MiB", "layout": layouts, "fanout": 2},
                    run={"iterations": 2, "warmup": 1, "verify": "sha256"},
                    save={"validate": "sha256"})
    with running(backing, mountpoint, "--writable", "--service-s", "0", "--threads", "4"):
        saved = stampede("save", str(job), np=2)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        restored = stampede("run", str(job), np=2)
        assert restored.returncode == 0, restored.stdout + restored.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    for layout in layouts:
        (save,) = [row for row in rows if row["layout"] == layout and row["op"] == "save"]
        (restore,) = [row for row in rows if row["layout"] == layout and row["op"] == "restore"]
        assert save["valid"] == restore["valid"] == "true", (layout, save["invalid_reason"])
        assert save["fs_type"] == "fuse" and restore["restored_from"] == f"saves/{layout}/v000003"
        assert (backing / "saves" / layout / "latest").read_text() == "v000003\n"
        assert int(save["count"]) == 2 * 2                 # 2 writing ranks x 2 saves
    served = read_summary(mountpoint)["ops"]
    # 3 saves, keep 2: the first released (unlink, rmdir)
    assert {"create", "mkdir", "rename", "fsync", "fsyncdir", "unlink", "rmdir"} <= set(served)
    assert not [path for path in backing.rglob("*.partial")]


@pytest.mark.mpi
def test_a_create_storm_queues_in_one_directory_and_spreads_over_fan_out(
        stampede, fuse_ready: None, tmp_path: Path) -> None:
    """4 ranks, each creating its shard's file: `sharded` puts the 4 in one directory,
    `fan-out` (fanout 4) one in each of four. Creates hold S, the rest nothing, and the
    directory's lock queues one directory's creates (on one mount the kernel holds it too,
    as --serialize-dir does at the server). The emulator's log shows it: each save's
    sharded creates on one directory's lock, one at a time, so that save's create op
    lasted at least N S; fan-out's on four locks, one each. How close the clock comes to
    N S against S is bench/model_vs_emulator.py's kind of question, not this test's."""
    ranks = 4
    job = small_job(tmp_path, checkpoint={"size": "4MiB", "fanout": ranks},
                    run={"iterations": 3, "warmup": 1, "verify": "none"},
                    save={"validate": "none"})
    rows, mounts = save_through(stampede, tmp_path, job, ranks, SERVICE_S)
    for layout, row in rows.items():
        assert int(row["count"]) == 3 * ranks and row["valid"] == "true"
        assert float(row["lat_min_s"]) >= SERVICE_S                 # a service time is a floor
        creates = [item for item in read_requests(mounts[layout]) if item.op == "create"
                   and item.paths[0].endswith(".raw.partial")]      # the shards' (not the journal's)
        assert len(creates) == 4 * ranks                            # warmup + 3 saves
        assert all(item.left_s - item.taken_s >= SERVICE_S for item in creates)
        by_lock: dict[tuple[str, ...], list[Served]] = {}
        for item in creates:
            by_lock.setdefault(item.locks, []).append(item)
        assert all(never_overlap(served) for served in by_lock.values())
        if layout == "sharded":         # one directory per save: its 4 creates queued there
            assert sorted(len(served) for served in by_lock.values()) == [ranks] * 4
        else:                           # fan-out: every create a directory of its own
            assert sorted(len(served) for served in by_lock.values()) == [1] * (4 * ranks)
    assert float(rows["sharded"]["elapsed_s"]) >= ranks * SERVICE_S   # back to back
    for mountpoint in mounts.values():
        assert read_summary(mountpoint)["ops"]["create"]["asked_mean_s"] == pytest.approx(SERVICE_S)


def save_through(stampede, where: Path, job: Path, ranks: int, create_s: float
                 ) -> tuple[dict[str, dict[str, str]], dict[str, Path]]:
    """Each layout's save through a writable emulator of its own holding creates
    create_s: the create rows by layout, the mountpoints (whose emulators' summaries and
    logs read_summary and read_requests read)."""
    options = ("--writable", "--service-s", "0", "--create-s", str(create_s), "--threads",
               str(ranks), "--serialize-dir")
    mounts = {layout: where / f"mnt-{layout}" for layout in ("sharded", "fan-out")}
    for layout in mounts:
        (where / f"backing-{layout}").mkdir(parents=True)
    archive = where / "results.csv"
    with running(where / "backing-sharded", mounts["sharded"], *options), \
            running(where / "backing-fan-out", mounts["fan-out"], *options):
        for layout, mountpoint in mounts.items():
            saved = stampede("save", str(job), "--set", f"target.path={mountpoint}", "--set",
                             f'checkpoint.layout=["{layout}"]', "--set",
                             f"archive.path={archive}", np=ranks)
            assert saved.returncode == 0, saved.stdout + saved.stderr
    rows = {row["layout"]: row for row in read_archive(archive) if row["op"] == "create"}
    return rows, mounts
