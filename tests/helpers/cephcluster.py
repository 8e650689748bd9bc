"""A real single-node Ceph for the tests and the bench: one monitor, one manager, one OSD
on memstore (the objects in memory) and one MDS, on 127.0.0.1, no authentication, and a
CephFS made on two pools; every daemon in the foreground under one generated config
(CEPH_CONF), its data, logs, sockets and pid files in one directory.

    with running_cluster(directory) as cluster:   # or the session fixture `ceph_cluster`
        target = cluster.url("ck")                # cephfs://127.0.0.1:PORT/ck
        with cluster.mounted(tmp_path / "mnt") as mountpoint:   # a ceph-fuse mount
            ...
        cluster.mds_perf()                        # the MDS's `perf dump`

The monitor's port is chosen free in 26000-27999 (messenger v2 only: no v1 port). The
manager is started too: without one `statfs` says 0 bytes free and stampede's space check
refuses every write. Stopped by pid (SIGTERM, then SIGKILL), its directory removed.
Without the binaries or libcephfs the fixture skips, unless STAMPEDE_REQUIRE_CEPH=1 (CI):
then it fails.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stampede.emulate.mds import sigterm_when_parent_dies
from stampede.launcher import find_mpiexec
from tests.helpers import requires
from tests.helpers.jobs import RUN_TIMEOUT_S
from tests.helpers.processes import descendants
from tests.helpers.s3server import bindable

PORT_RANGE = (26_000, 28_000)
DAEMONS = ("ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds")
TOOLS = (*DAEMONS, "ceph", "ceph-fuse", "monmaptool", "fusermount3")
LIBRARY = "libcephfs.so.2"
INSTALL = "apt-get install ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse libcephfs2"
ACTIVE_WAIT_S = 60.0         # the MDS up:active (about 10 s here)
MOUNT_WAIT_S = 30.0          # a ceph-fuse mount (about 1 s once the MDS is active)
COMMAND_TIMEOUT_S = 30       # one `ceph` command (its own connect timeout is below it)
STOP_WAIT_S = 2.0          # then SIGKILL: the cluster keeps nothing (one daemon took 5 s here)
MEMSTORE_BYTES = 2 * 1024**3  # the OSD's memory: the tests' checkpoints are MiBs
FS_NAME = "cephfs"
FLAG_WAIT_S = 60.0           # a pool or OSD flagged full, or not (seconds here)


@dataclass
class CephCluster:
    port: int                   # the monitor's (messenger v2)
    directory: Path             # config, data, logs, sockets, pid files
    processes: dict[str, Any] = field(default_factory=dict, repr=False)  # daemon -> Popen

    @property
    def mon_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def conf(self) -> Path:
        return self.directory / "ceph.conf"

    def env(self) -> dict[str, str]:
        """The environment of a `ceph` command or client of this cluster."""
        return {**os.environ, "CEPH_CONF": str(self.conf)}

    def url(self, relpath: str) -> str:
        return f"cephfs://{self.mon_host}/{relpath.lstrip('/')}"

    def ceph(self, *args: str, check: bool = True) -> str:
        """One `ceph` command's output (RuntimeError with its stderr when it fails)."""
        done = subprocess.run(["ceph", "--connect-timeout", "10", *args], env=self.env(),
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        if check and done.returncode != 0:
            raise RuntimeError(f"ceph {' '.join(args)}: exit {done.returncode}: "
                               f"{done.stderr.strip()[-1000:]}")
        return done.stdout

    def mds_perf(self, section: str = "mds_server") -> dict[str, Any]:
        """The MDS's `perf dump` (one section of it; "" for all), through its admin
        socket: the MDS's own request counts and latencies per op."""
        dump = json.loads(self.ceph("daemon", "mds.a", "perf", "dump", *(
            [section] if section else [])))
        return dict(dump.get(section, dump) if section else dump)

    def kill_mds(self) -> None:
        """The MDS SIGKILLed (a crash), reaped."""
        process = self.processes["mds"]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def start_mds(self) -> None:
        """The MDS started again (it replays its journal, and the clients reconnect)."""
        _spawn(self, "mds", ["ceph-mds", "-i", "a"])

    # --- faults: a full pool or OSD, an evicted client --------------------------------

    @contextmanager
    def client(self) -> Iterator[Any]:
        """A libcephfs client of this cluster (stampede.libcephfs.Mount) for the block."""
        from stampede.libcephfs import Mount

        mount = Mount({"err_to_stderr": "false", "log_to_stderr": "false"}, str(self.conf),
                      None, None)
        try:
            yield mount
        finally:
            mount.release()

    def set_xattr(self, path: str, name: str, value: str) -> None:
        """A CephFS virtual xattr (ceph.dir.layout.pool, ceph.quota.max_bytes...) set on a
        path of the file system ("/dir")."""
        with self.client() as mount:
            setxattr = mount.lib.ceph_setxattr
            setxattr.restype = ctypes.c_int
            setxattr.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                 ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
            code = setxattr(mount.cmount, path.encode(), name.encode(), value.encode(),
                            len(value.encode()), 0)
            if code < 0:
                raise OSError(-code, f"setxattr {name}={value} on {path}: {os.strerror(-code)}")

    def get_xattr(self, path: str, name: str) -> str:
        """A CephFS virtual xattr's value (ceph.dir.rbytes: the MDS's count of the bytes
        below a directory, what the clients' quota check adds to)."""
        with self.client() as mount:
            getxattr = mount.lib.ceph_getxattr
            getxattr.restype = ctypes.c_int
            getxattr.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                 ctypes.c_void_p, ctypes.c_size_t]
            value = ctypes.create_string_buffer(256)
            code = getxattr(mount.cmount, path.encode(), name.encode(), value, len(value))
            if code < 0:
                raise OSError(-code, f"getxattr {name} of {path}: {os.strerror(-code)}")
            return value.raw[:code].decode()

    def pool_flags(self, pool: str) -> list[str]:
        dump = json.loads(self.ceph("osd", "dump", "--format", "json"))
        return next(entry["flags_names"].split(",") for entry in dump["pools"]
                    if entry["pool_name"] == pool)

    def health_checks(self) -> set[str]:
        return set(json.loads(self.ceph("health", "--format", "json")).get("checks", {}))

    @contextmanager
    def full_pool(self, directory: str) -> Iterator[str]:
        """A data pool of its own for the files made under `directory` from now on (its
        ceph.dir.layout.pool), full: its quota (max_objects 1) reached by one object, so
        the monitors flag it full and every write into it fails as into a full cluster,
        while the rest of the file system (the session's other tests) takes writes. The
        quota lifted at the end; the pool stays (new files of `directory` still go there)."""
        pool = f"full-{uuid.uuid4().hex[:8]}"
        self.ceph("osd", "pool", "create", pool, "8")
        self.ceph("fs", "add_data_pool", FS_NAME, pool)
        with self.client() as mount:
            mount.mkdir(f"/{pool}".encode(), 0o750)
        self.set_xattr(f"/{pool}", "ceph.dir.layout.pool", pool)
        with self.client() as mount:          # the one object that fills it
            handle = mount.open(f"/{pool}/filler".encode(), os.O_WRONLY | os.O_CREAT, 0o640)
            data = ctypes.create_string_buffer(4096)
            mount.pwrite(handle, ctypes.addressof(data), 4096, 0)
            mount.fsync(handle)
            mount.close(handle)
        self.set_xattr(directory, "ceph.dir.layout.pool", pool)
        self.ceph("osd", "pool", "set-quota", pool, "max_objects", "1")
        try:
            _wait(lambda: "full" in self.pool_flags(pool), f"pool {pool} flagged full")
            yield pool
        finally:
            self.ceph("osd", "pool", "set-quota", pool, "max_objects", "0")
            _wait(lambda: "full" not in self.pool_flags(pool), f"pool {pool} not full")

    @contextmanager
    def osd_full(self) -> Iterator[None]:
        """The OSD full: its full ratio (and the two below it, kept in order) set under
        what it holds, until the monitors say OSD_FULL; the defaults back at the end, until
        they say it no more (the session's cluster is whole again)."""
        for which, ratio in (("nearfull", "0.0008"), ("backfillfull", "0.0009"),
                             ("full", "0.001")):
            self.ceph("osd", f"set-{which}-ratio", ratio)
        try:
            _wait(lambda: "OSD_FULL" in self.health_checks(), "the OSD full")
            yield
        finally:
            for which, ratio in (("full", "0.95"), ("backfillfull", "0.90"),
                                 ("nearfull", "0.85")):
                self.ceph("osd", f"set-{which}-ratio", ratio)
            _wait(lambda: not self.health_checks() & {"OSD_FULL", "POOL_FULL", "OSD_NEARFULL",
                                                      "OSD_BACKFILLFULL"}, "the OSD not full")

    def evict_process(self, pid: int) -> list[int]:
        """Every client of process `pid` (the MDS's `client ls`: its metadata's pid)
        evicted (`ceph tell mds.a client evict`: its session closed, its address
        blocklisted on the OSDs): their ids."""
        sessions = json.loads(self.ceph("tell", "mds.a", "client", "ls", "--format", "json"))
        ids = [int(entry["id"]) for entry in sessions
               if entry.get("client_metadata", {}).get("pid") == str(pid)]
        for client_id in ids:
            self.ceph("tell", "mds.a", "client", "evict", f"id={client_id}")
        return ids

    def clear_blocklist(self) -> None:
        """The evicted clients' addresses off the OSDs' blocklist (each client's address is
        its own, so no other client is refused meanwhile; cleared all the same)."""
        self.ceph("osd", "blocklist", "clear")

    @contextmanager
    def mounted(self, mountpoint: Path) -> Iterator[Path]:
        """A ceph-fuse mount of the file system's root at `mountpoint` (made), in the
        foreground (its pid is this block's to end): unmounted with `fusermount3 -u` and
        the process waited for at the end, whatever happened."""
        mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "ceph-fuse.out", "ab") as out:
            process = subprocess.Popen(
                ["ceph-fuse", "-f", "--client_mount_timeout", "20", str(mountpoint)],
                env=self.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=sigterm_when_parent_dies)
        try:
            deadline = time.monotonic() + MOUNT_WAIT_S
            while not is_mounted(mountpoint):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ceph-fuse {mountpoint}: not mounted within "
                                       f"{MOUNT_WAIT_S:.0f} s: {_tail(self.directory, 'ceph-fuse')}")
                time.sleep(0.1)
            yield mountpoint
        finally:
            unmount(mountpoint)
            try:
                process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait(condition: Callable[[], bool], what: str, limit_s: float = FLAG_WAIT_S) -> None:
    """Until `condition()` (the monitors' flags change within seconds); RuntimeError after
    limit_s."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {limit_s:.0f} s: {what}")
        time.sleep(0.25)


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The process of MPI rank `rank` among the launcher's descendants (its PMI_RANK)."""
    for pid in descendants(launcher_pid):
        with suppress(OSError):
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"PMI_RANK={rank}".encode() in environ:
                return pid
    raise RuntimeError(f"no rank {rank} under process {launcher_pid}")


def while_running(args: list[str], cwd: Path, fault: Callable[[subprocess.Popen[str]], None],
                  np: int = 2) -> tuple[int, str, str]:
    """`mpiexec -n np stampede ARGS` started; once its first iteration is done (" took "
    on its stderr: restoring or saving now), `fault(process)`; then waited for (killed if
    it outlives RUN_TIMEOUT_S): (exit status, stdout, stderr)."""
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    running = subprocess.Popen([mpiexec, "-n", str(np), sys.executable, "-m", "stampede", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert running.stderr is not None
        while " took " not in (line := running.stderr.readline()):
            assert line, running.communicate(timeout=RUN_TIMEOUT_S)
        fault(running)
        out, err = running.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()
    return running.returncode, out, err


def is_mounted(mountpoint: Path) -> bool:
    return any(line.split()[1] == str(mountpoint)
               for line in Path("/proc/self/mounts").read_text().splitlines())


def unmount(mountpoint: Path) -> None:
    """fusermount3 -u, lazily where busy (the ceph-fuse process then exits by itself)."""
    for args in (["-u"], ["-uz"]):
        if not is_mounted(mountpoint):
            return
        subprocess.run(["fusermount3", *args, str(mountpoint)], capture_output=True,
                       timeout=STOP_WAIT_S * 2)


def unavailable() -> str:
    """Why no cluster can be started here ("" when one can)."""
    missing = [tool for tool in TOOLS
               if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]
    if missing:
        return f"Ceph is not installed ({', '.join(missing)} missing: {INSTALL})"
    try:
        from stampede.libcephfs import library
        library()
    except Exception as error:   # UsageError: libcephfs missing
        return f"libcephfs is not installed ({error}; {INSTALL})"
    if os.geteuid() != 0:
        return "ceph-fuse mounts and the daemons' sockets here need root"
    return ""


def config(directory: Path, port: int, fsid: str) -> str:
    return f"""\
[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{port}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
osd objectstore = memstore
memstore device bytes = {MEMSTORE_BYTES}
run dir = {directory}/run
admin socket = {directory}/run/$name.asok
log file = {directory}/$name.log
pid file = {directory}/run/$name.pid
mon data = {directory}/mon
osd data = {directory}/osd$id
mds data = {directory}/mds
mgr data = {directory}/mgr
ms bind msgr1 = false
public addr = 127.0.0.1
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
mgr initial modules =
"""


def _spawn(cluster: CephCluster, name: str, args: list[str]) -> None:
    """One daemon in the foreground (-f), a session of its own, SIGTERM when the test
    process dies, its output into its directory."""
    with open(cluster.directory / f"{name}.out", "ab") as out:
        cluster.processes[name] = subprocess.Popen(
            [*args, "-f"], env=cluster.env(), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=sigterm_when_parent_dies)


def start_cluster(directory: Path) -> CephCluster:
    """The daemons, in the order a cluster needs them, until the MDS is up:active
    (RuntimeError, everything stopped, where it is not within ACTIVE_WAIT_S)."""
    for _ in range(20):
        port = random.randrange(*PORT_RANGE)
        if bindable(port):
            break
    else:
        raise RuntimeError("no free port for ceph-mon")
    directory.mkdir(parents=True, exist_ok=True)
    for sub in ("run", "mon", "mds", "mgr"):
        (directory / sub).mkdir(exist_ok=True)
    cluster = CephCluster(port, directory)
    fsid = str(uuid.uuid4())
    cluster.conf.write_text(config(directory, port, fsid))
    env = cluster.env()

    def tool(*args: str) -> None:
        done = subprocess.run(list(args), env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: "
                               f"{done.stderr.strip()[-1000:]}")

    try:
        tool("monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{port}]", "--fsid", fsid,
             str(directory / "monmap"))
        tool("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(directory / "monmap"))
        _spawn(cluster, "mon", ["ceph-mon", "-i", "a"])
        osd_uuid = str(uuid.uuid4())
        osd_id = cluster.ceph("osd", "new", osd_uuid).strip()
        (directory / f"osd{osd_id}").mkdir(exist_ok=True)
        tool("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        _spawn(cluster, "osd", ["ceph-osd", "-i", osd_id])
        _spawn(cluster, "mgr", ["ceph-mgr", "-i", "x"])
        for pool in ("cephfs_metadata", "cephfs_data"):
            cluster.ceph("osd", "pool", "create", pool, "8")
        cluster.ceph("fs", "new", FS_NAME, "cephfs_metadata", "cephfs_data")
        _spawn(cluster, "mds", ["ceph-mds", "-i", "a"])
        deadline = time.monotonic() + ACTIVE_WAIT_S
        while "up:active" not in cluster.ceph("mds", "stat", check=False):
            for name, process in cluster.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"ceph-{name} exited ({process.returncode}): "
                                       f"{_tail(directory, name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the MDS was not up:active within {ACTIVE_WAIT_S:.0f} s: "
                                   f"{cluster.ceph('mds', 'stat', check=False).strip()}; "
                                   f"{_tail(directory, 'mds')}")
            time.sleep(0.5)
        _wait_for_space(cluster, deadline)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _wait_for_space(cluster: CephCluster, deadline: float) -> None:
    """Until the manager reports the pools' space (before it does, a client's statfs
    says 0 bytes free)."""
    while time.monotonic() < deadline:
        stats = json.loads(cluster.ceph("df", "--format", "json", check=False) or "{}")
        if stats.get("stats", {}).get("total_avail_bytes", 0) > 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the manager reported no space within {ACTIVE_WAIT_S:.0f} s: "
                       f"{_tail(cluster.directory, 'mgr')}")


def _tail(directory: Path, name: str) -> str:
    out = directory / f"{name}.out"
    return out.read_text(errors="replace")[-800:] if out.exists() else ""


def stop_cluster(cluster: CephCluster) -> None:
    """Every daemon by its pid: SIGTERM to all at once (nothing is kept, so no order is
    owed), SIGKILL to any still there after STOP_WAIT_S; reaped."""
    running = [process for process in cluster.processes.values() if process.poll() is None]
    for process in running:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for process in running:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def running_cluster(directory: Path) -> Iterator[CephCluster]:
    """A cluster for the block; stopped, and its directory removed, at the end."""
    cluster = start_cluster(directory)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)
        shutil.rmtree(directory, ignore_errors=True)


def require() -> None:
    """Skip where no cluster can run, unless STAMPEDE_REQUIRE_CEPH=1, where that fails."""
    reason = unavailable()
    if reason:
        requires.unavailable(reason, "CEPH")


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephCluster]:
    """One Ceph for the session (per xdist worker), where one can run (require())."""
    require()
    try:
        with running_cluster(tmp_path_factory.mktemp("ceph")) as cluster:
            yield cluster
    except RuntimeError as error:
        requires.unavailable(str(error), "CEPH")


@pytest.fixture
def cephfs_target(ceph_cluster: CephCluster) -> str:
    """A fresh, not yet existing directory in the file system, as a cephfs:// URL."""
    return ceph_cluster.url(f"t-{uuid.uuid4().hex[:12]}")
