"""CephFS targets (stampede.backends.cephfs) on a real single-node Ceph
(tests/helpers/cephcluster.py): the URL, the cluster's own helpers (a ceph-fuse mount, the
MDS's counters), a prepare, run, save, restore and clean through one libcephfs client per
rank under a real mpiexec, and a POSIX target on a ceph-fuse mount."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.backends.cephfs import parse_target
from stampede.errors import UsageError
from stampede.libcephfs import failed, no_answer_line
from stampede.oploop import PYTHON_LOOPS
from stampede.run.outcome import describe
from tests.helpers.cephcluster import CephCluster, is_mounted, while_running
from tests.helpers.jobs import read_archive, sidecars

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("target", "options", "parsed"), [
    ("cephfs://10.0.0.5/ck", {}, ("10.0.0.5", None, "/ck", None)),
    ("cephfs://admin@mon1:3300/a/b/", {}, ("mon1:3300", "admin", "/a/b", None)),
    ("cephfs://h:6789/ck?fs=second", {}, ("h:6789", None, "/ck", "second")),
    ("cephfs://h/ck", {"fs": "third", "timeout_s": 5}, ("h", None, "/ck", "third")),
    ("cephfs://[::1]:3300/ck", {}, ("[::1]:3300", None, "/ck", None)),
])
def test_the_url_names_the_monitor_user_directory_and_file_system(
        target: str, options: dict[str, object],
        parsed: tuple[str, str | None, str, str | None]) -> None:
    assert parse_target(target, options) == parsed


@pytest.mark.parametrize(("target", "options", "said"), [
    ("cephfs:///ck", {}, "names no monitor"),
    ("cephfs://h/", {}, "names no directory"),
    ("cephfs://h:port/ck", {}, "the port is not a number"),
    ("cephfs://u:secret@h/ck", {}, "a secret in the URL is refused"),
    ("cephfs://h/ck?fss=a", {}, "the query key 'fss' is not one of fs (did you mean \"fs\"?)"),
    ("cephfs://h/ck", {"timeout": 5},
     "storage_options: timeout do not apply to cephfs:// (it takes conf, keyring, fs, "
     "timeout_s) (did you mean \"timeout_s\"?)"),
    ("cephfs://h/ck", {"timeout_s": 0}, "timeout_s = 0: a whole number of seconds >= 1"),
    ("cephfs://h/ck", {"conf": "/nonexistent/ceph.conf"},
     "conf = '/nonexistent/ceph.conf': the path of a readable file"),
])
def test_a_target_that_cannot_be_is_refused_before_any_io(
        target: str, options: dict[str, object], said: str) -> None:
    """Refused before the library is asked anything (the monitor is not even reachable)."""
    with pytest.raises(UsageError, match="^.*" + _escaped(said)):
        open_backend(target, options)


def _escaped(text: str) -> str:
    import re
    return re.escape(text)


@pytest.mark.parametrize(("number", "said"), [
    (errno.ENOSPC, "No space left on device: the cluster is full: an OSD past its full ratio"),
    (errno.EDQUOT, "Disk quota exceeded: a CephFS quota is reached (ceph.quota.max_bytes"),
    (errno.ESHUTDOWN, "Cannot send after transport endpoint shutdown: this client was "
                      "evicted by the MDS"),
    (errno.EIO, "Input/output error"),
])
def test_a_full_cluster_a_quota_and_an_eviction_are_said_once_in_a_phases_message(
        number: int, said: str) -> None:
    """libcephfs's -errno as the OSError a phase describes: the system's words, then what
    they mean on CephFS, never the system's words twice."""
    text = describe(failed(-number, "write"), direct=False)
    assert text.startswith(said) and text.count(os.strerror(number)) == 1, text
    assert describe(OSError(errno.ETIMEDOUT, "Connection timed out (no answer)"), False) == \
        "Connection timed out (no answer)"


def test_a_dead_monitor_is_an_error_within_the_timeout_not_a_hang() -> None:
    """Nothing listens on port 1: the mount fails (ETIMEDOUT) after timeout_s."""
    with pytest.raises(OSError) as raised:
        open_backend("cephfs://127.0.0.1:1/ck", {"timeout_s": 2})
    assert raised.value.errno is not None


def test_the_cluster_serves_a_ceph_fuse_mount_and_the_mds_counts_its_requests(
        ceph_cluster: CephCluster, tmp_path: Path) -> None:
    """What a libcephfs client writes, a ceph-fuse mount reads; the MDS counted the
    creates, in its admin socket's perf dump and over the wire alike."""
    before = ceph_cluster.mds_perf()["req_create_latency"]["avgcount"]
    backend = open_backend(ceph_cluster.url(f"fuse-{os.getpid()}"))
    try:
        backend.ensure_root()
        for name in ("a.raw", "b.raw"):
            with backend.writer(name) as writer:
                writer.write_at(0, memoryview(bytearray(b"ceph" * 1024)))
        remote = backend.mds_perf()["mds_server"]
    finally:
        backend.client.release()
    after = ceph_cluster.mds_perf()["req_create_latency"]["avgcount"]
    assert after - before >= 2
    assert remote["req_create_latency"]["avgcount"] == after   # one MDS, one count
    mountpoint = tmp_path / "mnt"
    with ceph_cluster.mounted(mountpoint) as mounted:
        assert is_mounted(mounted)
        fs_types = {line.split()[1]: line.split()[2]
                    for line in Path("/proc/self/mounts").read_text().splitlines()}
        assert fs_types[str(mounted)] == "fuse.ceph-fuse"
        assert (mounted / f"fuse-{os.getpid()}" / "b.raw").read_bytes() == b"ceph" * 1024
    assert not is_mounted(mountpoint)


QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.toml"


def quickstart(target: str, archive: Path, *more: str) -> list[str]:
    """jobs/quickstart.toml made small (16 MiB, 1 MiB blocks, 2 iterations + a warmup,
    every byte checked) on `target`, archived to `archive`."""
    return [str(QUICKSTART), "--set", f"target.path={target}", "--set", "checkpoint.size=16MiB",
            "--set", "checkpoint.block_size=1MiB", "--set", "run.iterations=2",
            "--set", "run.warmup=1", "--set", "run.verify=sha256",
            "--set", f"archive.path={archive}", *more]


def completions(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(row["op"], row["layout"]) for row in rows if row["op"] in ("restore", "save")]


@pytest.mark.mpi
def test_prepare_run_save_restore_and_clean_through_cephfs(
        stampede, ceph_cluster: CephCluster, cephfs_target: str, tmp_path: Path) -> None:
    """Two ranks, each a libcephfs client of its own: quickstart's shared and sharded
    prepared, restored, saved, the saved version restored, then cleaned away."""
    archive = tmp_path / "results" / "ck.csv"
    job = quickstart(cephfs_target, archive)
    for command in ("prepare", "run", "save", "run"):
        result = stampede(command, *job, np=2)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "backend cephfs (cephfs (libcephfs))" in " ".join(result.stdout.split())
    rows = read_archive(archive)
    assert completions(rows) == [
        ("restore", "shared"), ("restore", "sharded"), ("save", "shared"), ("save", "sharded"),
        ("restore", "shared"), ("restore", "sharded")]
    done = [row for row in rows if row["op"] in ("restore", "save")]
    assert all(row["valid"] == "true" and row["backend"] == "cephfs" and
               row["fs_type"] == "cephfs (libcephfs)" and row["nranks"] == "2" for row in done)
    reads = [row for row in rows if row["op"] == "read"]
    # 2 measured iterations of 16 MiB, in 1 MiB blocks: 32 reads of 1 MiB per layout
    assert [(row["count"], row["op_bytes"], row["errors"]) for row in reads] == \
        [("32", str(32 * 2**20), "0")] * 4
    writes = [row for row in rows if row["op"] == "write"]
    assert {int(row["op_bytes"]) for row in writes} == {2 * 16 * 2**20}
    # the MDS's own counts around each layout, in the sidecar and under the report
    restore, save = sidecars(archive)[:2]
    for layout in ("shared", "sharded"):
        saved = save["saves"][layout]["mds_requests"]
        # each rank's new file (one shared file: created once, opened by the other)
        assert saved["ops"]["create"]["requests"] >= (1 if layout == "shared" else 2)
        assert saved["requests"] > 0 and saved["scope"].startswith("the MDS")
        assert restore["layouts"][layout]["mds_requests"]["requests"] >= 0
    assert "sharded: MDS requests (its own counters" in result.stdout
    cleaned = stampede("clean", *job)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    backend = open_backend(cephfs_target)
    try:
        assert backend.names() == []
    finally:
        backend.client.release()


@pytest.mark.mpi
def test_four_ranks_restore_shared_and_sharded_through_cephfs(
        stampede, cephfs_target: str, tmp_path: Path) -> None:
    """Four clients of one MDS: every rank's bytes restored and checked, both layouts."""
    archive = tmp_path / "results" / "ck.csv"
    job = quickstart(cephfs_target, archive)
    for command in ("prepare", "run"):
        result = stampede(command, *job, np=4)
        assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(archive)
    assert completions(rows) == [("restore", "shared"), ("restore", "sharded")]
    restores = [row for row in rows if row["op"] == "restore"]
    assert [(row["nranks"], row["valid"], row["bytes_total"]) for row in restores] == \
        [("4", "true", str(16 * 2**20))] * 2
    assert [row["count"] for row in rows if row["op"] == "read"] == ["32", "32"]
    assert stampede("clean", *job).returncode == 0


@pytest.mark.mpi
def test_a_posix_target_on_a_ceph_fuse_mount_is_said_to_be_one(
        stampede, ceph_cluster: CephCluster, tmp_path: Path, no_mount_left: None) -> None:
    """The plain path backend on a ceph-fuse mount: shared and sharded at two ranks, the
    archive's fs_type the mount's own (/proc/mounts: fuse.ceph-fuse)."""
    archive = tmp_path / "results" / "fuse.csv"
    with ceph_cluster.mounted(tmp_path / "mnt") as mountpoint:
        target = mountpoint / f"fuse-ck-{os.getpid()}"
        job = quickstart(str(target), archive)
        for command in ("prepare", "run"):
            result = stampede(command, *job, np=2)
            assert result.returncode == 0, result.stdout + result.stderr
        rows = read_archive(archive)
        assert completions(rows) == [("restore", "shared"), ("restore", "sharded")]
        assert {(row["backend"], row["fs_type"], row["valid"]) for row in rows
                if row["op"] == "restore"} == {("posix", "fuse.ceph-fuse", "true")}
        assert [row["count"] for row in rows if row["op"] == "read"] == ["32", "32"]
        cleaned = stampede("clean", *job)
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert not target.exists()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[CephCluster]:
    """A cluster of the test's own (its MDS is killed: the session's must stay whole)."""
    from tests.helpers.cephcluster import require, running_cluster

    require()
    with running_cluster(tmp_path / "cluster") as cluster:
        yield cluster


def killed_mds(cluster: CephCluster, back_after_s: float | None = None
               ) -> Callable[[subprocess.Popen[str]], None]:
    """The fault: the MDS SIGKILLed, and started again `back_after_s` later (None: never)."""
    def fault(running: subprocess.Popen[str]) -> None:
        cluster.kill_mds()
        if back_after_s is not None:
            time.sleep(back_after_s)
            cluster.start_mds()
    return fault


def test_a_call_with_no_answer_names_the_daemons_it_waits_on() -> None:
    """A metadata call waits on the MDS; a read, write or fsync on the OSDs holding the
    file's objects and the MDS granting its capabilities: the line names what to ask."""
    opened = no_answer_line(1, "open", b"/ck/a", 5, "127.0.0.1:6789")
    assert opened == ("stampede: error: rank 1: CephFS open /ck/a had no answer within 5 s "
                      "(target.storage_options.timeout_s): the MDS is not answering (monitors "
                      "127.0.0.1:6789; `ceph fs status` says whether one is active); this rank "
                      "ends here, what was archived before stays\n")
    for call in ("read", "write", "fsync"):
        line = no_answer_line(0, call, b"", 2.5, "")
        assert line.startswith(f"stampede: error: rank 0: CephFS {call} had no answer within "
                               "2.5 s"), line
        assert ("the OSDs that hold its objects are not answering, or the MDS that grants its "
                "capabilities (monitors ?; `ceph -s` says which are down)") in line
    assert "OSD" not in no_answer_line(0, "stat", b"/x", 5, "m")


def each_rank_gave_up_in_one_line(status: int, out: str, err: str, bound_s: int) -> None:
    """Exit status 1; each rank stuck on a call ended with its own line naming the MDS
    (beside the OSDs where the call moved bytes: an fsync waits on both)."""
    assert status == 1, out + err
    said = [line for line in err.splitlines() if f"had no answer within {bound_s} s" in line]
    assert said and all("the MDS is not answering" in line or "or the MDS that grants" in line
                        for line in said), err
    assert len({line.split(":")[2] for line in said}) == len(said)   # one line per rank


@pytest.mark.mpi
def test_an_mds_killed_mid_restore_and_started_again_ends_a_valid_run(
        stampede, own_cluster: CephCluster, tmp_path: Path) -> None:
    """The MDS SIGKILLed while two ranks restore, started again 10 s later. Each client
    holds the caps of the files it reads, so its reads (from the OSDs) and its stats and
    opens (from its caps) go on without the MDS; what needs the MDS (the lock's release
    at the end) waits for it, up to timeout_s (60 s here), and the run ends valid once it
    is back."""
    archive = tmp_path / "results" / "kill.csv"
    job = quickstart(own_cluster.url("kill"), archive, "--set", "checkpoint.layout=['sharded']",
                     "--set", "run.warmup=0", "--set", "run.verify=none",
                     # stampede waits this long for an MDS: longer than it is away
                     "--set", "target.storage_options={timeout_s=60}")
    prepared = stampede("prepare", *job, np=2)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    status, out, err = while_running(["run", *job, "--set", "run.iterations=1500"], tmp_path,
                                     killed_mds(own_cluster, back_after_s=10))
    assert status == 0, " ".join((out + err).split())
    restores = [row for row in read_archive(archive) if row["op"] == "restore"]
    assert [(row["valid"], row["errors"]) for row in restores] == [("true", "0")]


@pytest.mark.mpi
def test_an_mds_killed_mid_restore_and_never_back_ends_the_run_in_one_line_per_rank(
        stampede, own_cluster: CephCluster, tmp_path: Path) -> None:
    """The MDS SIGKILLed while two ranks restore, never started again. What needs it (the
    lock's release at the end, at the latest) has no answer; the call's watchdog ends
    each rank stuck on it after timeout_s with one line naming the MDS and the bound:
    exit status 1, and the run archived before it still there."""
    archive = tmp_path / "results" / "dead.csv"
    job = quickstart(own_cluster.url("dead"), archive, "--set", "checkpoint.layout=['sharded']",
                     "--set", "run.warmup=0", "--set", "run.verify=none",
                     "--set", "target.storage_options={timeout_s=5}")
    for command in ("prepare", "run"):
        result = stampede(command, *job, np=2)
        assert result.returncode == 0, result.stdout + result.stderr
    archived = read_archive(archive)
    status, out, err = while_running(["run", *job, "--set", "run.iterations=300"], tmp_path,
                                     killed_mds(own_cluster))
    each_rank_gave_up_in_one_line(status, out, err, 5)
    assert read_archive(archive)[:len(archived)] == archived


# A rank's metadata-only pass in the compiled loop (stampede.run.metadata_loop): its stats
# are each a new client's first (the MDS asked), and its C call is what waits
IN_LOOP = """
import sys
from stampede.backends import open_backend
from stampede.checkpoint.plan import Extent, RankPlan
from stampede.run import metadata_loop
from stampede.run.outcome import PhaseOutcome

backend = open_backend(sys.argv[1], {"timeout_s": 3})
extents = tuple(Extent(f"f{number}", 0, 1) for number in range(int(sys.argv[2])))
plan = RankPlan(rank=0, nranks=1, layout="sharded", ops=("stat",), extents=extents,
                block_bytes=4096, stat_count=1, open_count=1, hold=extents[0])
program = metadata_loop.build(plan, {e.relpath: backend.path(e.relpath) for e in extents},
                              backend, False, True)
assert program is not None
print("mounted", flush=True)
sys.stdin.readline()
program.run(0, {e.relpath: [] for e in extents}, 0, 2**62, [], PhaseOutcome(), None)
print("the pass ended", flush=True)
"""


def test_an_mds_killed_under_the_compiled_metadata_loop_ends_it_in_one_line(
        own_cluster: CephCluster, tmp_path: Path) -> None:
    """The MDS SIGKILLed between a client's mount and its pass of first stats: the stat
    waiting in C is seen by the mount's watchdog (the loop's progress: which step, since
    when) and ends the process after timeout_s with the one line naming the call, as a
    call made from Python is ended."""
    files = 50
    with own_cluster.client() as mount:
        mount.mkdir(b"/loop", 0o755)
        for number in range(files):
            mount.close(mount.open(f"/loop/f{number}".encode(), os.O_CREAT | os.O_WRONLY, 0o644))
    (tmp_path / "in_loop.py").write_text(IN_LOOP)
    env = {**os.environ, "CEPH_CONF": str(own_cluster.conf),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    env.pop(PYTHON_LOOPS, None)
    running = subprocess.Popen([sys.executable, str(tmp_path / "in_loop.py"),
                                own_cluster.url("loop"), str(files)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        assert running.stdout is not None and running.stdin is not None
        assert running.stdout.readline() == "mounted\n", running.communicate(timeout=60)
        own_cluster.kill_mds()
        running.stdin.write("\n")
        running.stdin.flush()
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    assert running.returncode == 1, out + err
    assert "the pass ended" not in out
    said = [line for line in err.splitlines() if "had no answer" in line]
    assert len(said) == 1 and " CephFS stat /loop/f0 had no answer within 3 s " \
        "(target.storage_options.timeout_s): the MDS is not answering" in said[0], err


@pytest.mark.mpi
def test_an_mds_killed_mid_save_and_never_back_ends_each_stuck_rank_in_one_line(
        stampede, own_cluster: CephCluster, tmp_path: Path) -> None:
    """The MDS SIGKILLed while two ranks save version after version (each a mkdir,
    creates and renames: the MDS's), never started again. Each rank stuck on a call ends
    after timeout_s with its own line; exit status 1; the save archived before it still
    there."""
    archive = tmp_path / "results" / "dead-save.csv"
    job = quickstart(own_cluster.url("dead-save"), archive, "--set",
                     "checkpoint.layout=['sharded']", "--set", "run.warmup=0",
                     "--set", "target.storage_options={timeout_s=5}")
    result = stampede("save", *job, np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    archived = read_archive(archive)
    status, out, err = while_running(["save", *job, "--set", "run.iterations=400"], tmp_path,
                                     killed_mds(own_cluster))
    each_rank_gave_up_in_one_line(status, out, err, 5)
    assert read_archive(archive)[:len(archived)] == archived
