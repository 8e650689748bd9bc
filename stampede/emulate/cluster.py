"""Running an emulated cluster (planned by stampede.emulate.topology): build its namespaces
and links, run commands on its hosts, count the bytes its links carried, and take it all
down again, on exit, on a signal, and after a crash of the process that built it.

    with running_cluster(plan_cluster(new_cluster_id(), 2, 2, Link(0.1))) as cluster:
        cluster.run("head", [mpiexec, *cluster.mpiexec_arguments, "-n", "4", ...])

Ownership: the process that builds a cluster holds an exclusive lock (flock) on
/run/stampede-cluster/<id>.lock as long as the cluster stands; the kernel lets go of it
when the process dies, however it dies. Building a cluster first runs `cleanup_dead()`,
which removes what every cluster whose lock nobody holds left behind: the processes in its
namespaces (found through /proc/PID/ns/net, never by name), the namespaces (and with them
the veths and the bridge), their /etc/netns hosts files, the sockets its object store
recorded, its work directory. `stampede emulate-cluster --cleanup` runs it alone.

Root only (namespaces, links, tc). Nothing here routes to the machine's own network: the
hosts reach each other and their own loopback, nothing else.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from stampede.emulate.topology import (
    MPI_ENVIRONMENT,
    NETNS_PREFIX,
    ClusterPlan,
    build_commands,
    hosts_file,
    in_host,
    is_cluster_id,
    launcher_script,
    mpiexec_arguments,
    owner_of,
)

T = TypeVar("T")
STATE_DIR = Path("/run/stampede-cluster")
NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
STOP_WAIT_S = 10.0          # SIGTERM, then SIGKILL (SeaweedFS takes ~4 s to exit)
CLONE_NEWNET = 0x40000000
TOOLS = ("ip", "tc", "unshare", "hostname")


def unavailable() -> str:
    """Why clusters cannot be emulated here, or "" when they can."""
    if os.geteuid() != 0:
        return "emulating a cluster needs root (network namespaces, veth links, tc)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: apt-get install -y iproute2 util-linux)"
    return _probe(("veth links are not permitted here",
                   ["ip", "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"]),
                  ("tc shaping (tbf) is not permitted here",
                   ["tc", "qdisc", "add", "dev", "pa", "root", "tbf", "rate", "8mbit", "burst",
                    "32768", "limit", "1048576"]))


def netem_unavailable() -> str:
    """Why link latency cannot be emulated here (no netem qdisc in this kernel), or ""."""
    return _probe(("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), so link latency "
                   "cannot be emulated", ["tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                          "delay", "1ms"]))


def _probe(*steps: tuple[str, list[str]]) -> str:
    """Why a step fails in a scratch network namespace ("what is not possible: the tool's
    error"), or "" when every one passes. A step is (what it shows, an `ip` or `tc` command
    run in the namespace with -n), in order: a later one may use what an earlier one made.
    The namespace is removed whatever happens."""
    probe = f"{NETNS_PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"network namespaces are not permitted here: {made.stderr.strip()}"
    try:
        for shows, (tool, *words) in steps:
            ran = subprocess.run([tool, "-n", probe, *words], capture_output=True, text=True)
            if ran.returncode:
                return f"{shows}: {ran.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def new_cluster_id() -> str:
    return secrets.token_hex(4)


# --- what runs where -------------------------------------------------------------------------

def _netns_inode(path: Path) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def processes_in(netns: str) -> list[int]:
    """PIDs of the live processes in a network namespace (zombies have none)."""
    wanted = _netns_inode(NETNS_DIR / netns)
    if wanted is None:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _netns_inode(Path(entry.path) / "ns" / "net") == wanted:
            found.append(int(entry.name))
    return found


def in_namespace(netns: str, action: Callable[[], T]) -> T:
    """`action()` on a thread of its own that entered the network namespace first: the
    sockets it opens, and the threads it starts, stay in that namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            descriptor = os.open(NETNS_DIR / netns, os.O_RDONLY)
            try:
                if libc.setns(descriptor, CLONE_NEWNET) != 0:
                    number = ctypes.get_errno()
                    raise OSError(number, f"setns {netns}: {os.strerror(number)}")
            finally:
                os.close(descriptor)
            outcome["value"] = action()
        except BaseException as error:   # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=body, name=f"in-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _signal_all(pids: list[int], number: int) -> None:
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, number)


def _stop_processes(namespaces: tuple[str, ...], reap: Callable[[], None]) -> None:
    """SIGTERM to every process in these namespaces, SIGKILL to what is left after 10 s."""
    pids = [pid for netns in namespaces for pid in processes_in(netns)]
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    killed = False
    while True:
        reap()
        left = [pid for netns in namespaces for pid in processes_in(netns)]
        if not left:
            return
        if time.monotonic() > deadline:
            if killed:
                raise RuntimeError(f"processes {left} survived SIGKILL in {', '.join(namespaces)}")
            _signal_all(left, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + STOP_WAIT_S
        time.sleep(0.05)


# --- ownership and cleanup -------------------------------------------------------------------

def _lock_path(cluster_id: str) -> Path:
    return STATE_DIR / f"{cluster_id}.lock"


def _state_path(cluster_id: str) -> Path:
    return STATE_DIR / f"{cluster_id}.json"


def is_alive(cluster_id: str) -> bool:
    """Whether a process still holds the cluster's lock."""
    try:
        descriptor = os.open(_lock_path(cluster_id), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)
    return False


def _ids_present() -> set[str]:
    ids = {path.stem for path in STATE_DIR.glob("*.lock")} if STATE_DIR.is_dir() else set()
    for directory in (NETNS_DIR, ETC_NETNS):
        if directory.is_dir():
            ids |= {owner for entry in os.listdir(directory) if (owner := owner_of(entry))}
    return {cluster_id for cluster_id in ids if is_cluster_id(cluster_id)}


def leftovers(cluster_id: str | None = None) -> list[str]:
    """What clusters left on this machine (all of them, or one): namespaces, hosts files,
    state files, work directories, processes in the namespaces."""
    found = []
    for owner in sorted(_ids_present() if cluster_id is None else {cluster_id}):
        for directory in (NETNS_DIR, ETC_NETNS):
            if directory.is_dir():
                found += [str(directory / entry) for entry in sorted(os.listdir(directory))
                          if owner_of(entry) == owner]
                if directory == NETNS_DIR:
                    found += [f"process {pid} in {entry}" for entry in os.listdir(directory)
                              if owner_of(entry) == owner for pid in processes_in(entry)]
        found += [f"mount {mountpoint}" for mountpoint in _mounts()
                  if owner_of(Path(mountpoint).name) == owner]
        state = _read_state(owner)
        found += [str(path) for path in (_lock_path(owner), _state_path(owner)) if path.exists()]
        work = state.get("work_dir")
        if work and Path(work).exists():
            found.append(work)
        found += [socket for socket in state.get("sockets", []) if Path(socket).exists()]
    return found


def _mounts() -> list[str]:
    """Mount points in this mount namespace (a namespace's name is a bind mount on
    /run/netns/NAME: `ip netns del` unmounts it)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [fields[1] for fields in (line.split() for line in lines) if len(fields) > 1]


class ClusterState(TypedDict, total=False):
    """What Cluster._save_state writes; empty when there is none (or it is unreadable)."""
    cluster_id: str
    pid: int
    namespaces: list[str]
    work_dir: str
    sockets: list[str]


def _read_state(cluster_id: str) -> ClusterState:
    """The state a cluster saved; {} where there is none or it does not read (cleanup then
    goes by the namespaces' names alone)."""
    from stampede.results.readback import read_json

    state = read_json(_state_path(cluster_id), "cluster state").value
    return cast("ClusterState", state) if state is not None else {}


def remove_cluster(cluster_id: str, reap: Callable[[], None] = lambda: None) -> None:
    """Everything a cluster made, whoever made it: its processes, namespaces, files."""
    state = _read_state(cluster_id)
    present = os.listdir(NETNS_DIR) if NETNS_DIR.is_dir() else []
    namespaces = tuple(sorted((entry for entry in present if owner_of(entry) == cluster_id),
                              key=lambda name: name.endswith("-switch")))
    _stop_processes(namespaces, reap)
    for netns in namespaces:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    if ETC_NETNS.is_dir():
        for entry in os.listdir(ETC_NETNS):
            if owner_of(entry) == cluster_id:
                shutil.rmtree(ETC_NETNS / entry, ignore_errors=True)
        if not os.listdir(ETC_NETNS):
            ETC_NETNS.rmdir()
    for socket in state.get("sockets", []):
        Path(socket).unlink(missing_ok=True)
    work = state.get("work_dir")
    if work and Path(work).name == f"cluster-{cluster_id}":   # never a directory of the user's
        shutil.rmtree(work, ignore_errors=True)
    _state_path(cluster_id).unlink(missing_ok=True)
    _lock_path(cluster_id).unlink(missing_ok=True)


def cleanup_dead() -> list[str]:
    """Remove what clusters whose process is gone left behind; the ids removed."""
    removed = []
    for cluster_id in sorted(_ids_present()):
        if not is_alive(cluster_id):
            remove_cluster(cluster_id)
            removed.append(cluster_id)
    return removed


# --- a cluster -------------------------------------------------------------------------------

class Cluster:
    """A built cluster: commands on its hosts, its links' counters, its teardown."""

    def __init__(self, plan: ClusterPlan, work_dir: Path) -> None:
        self.plan = plan
        self.work_dir = work_dir
        self.launcher = work_dir / "ssh"
        self._children: list[subprocess.Popen[Any]] = []
        self._lock: int | None = None
        self._sockets: list[str] = []

    @property
    def mpiexec_arguments(self) -> list[str]:
        return mpiexec_arguments(self.plan, str(self.launcher))

    def build(self) -> None:
        """Take the lock, record what will be made, then make it (namespaces, links,
        shaping, hosts files, the launcher)."""
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(_lock_path(self.plan.cluster_id), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._save_state()
        for command in build_commands(self.plan):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
        for host in self.plan.hosts:
            directory = ETC_NETNS / host.netns
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(hosts_file(self.plan))
        self.launcher.write_text(launcher_script(self.plan))
        self.launcher.chmod(0o755)

    def record_sockets(self, paths: list[str]) -> None:
        """Files outside the work directory that a process of this cluster creates (and
        that a crash would leave): removed with the cluster."""
        self._sockets += paths
        self._save_state()

    def _save_state(self) -> None:
        _state_path(self.plan.cluster_id).write_text(json.dumps({
            "cluster_id": self.plan.cluster_id, "pid": os.getpid(),
            "namespaces": list(self.plan.namespaces), "work_dir": str(self.work_dir),
            "sockets": self._sockets}))

    def environment(self, mpiexec: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What a command on the head needs to launch ranks on the nodes: mpiexec and its
        arguments as STAMPEDE_CLUSTER_MPIEXEC (add -n N and the program), the rank count,
        the hosts; MPI between nodes over their NICs."""
        launch = shlex.join([mpiexec, *self.mpiexec_arguments])
        return {**os.environ, **MPI_ENVIRONMENT, "STAMPEDE_CLUSTER_MPIEXEC": launch,
                "STAMPEDE_CLUSTER_NRANKS": str(self.plan.nranks),
                "STAMPEDE_CLUSTER_HOSTS": self.plan.hydra_hosts,
                "STAMPEDE_CLUSTER_ID": self.plan.cluster_id, **(extra or {})}

    def popen(self, host: str, argv: list[str], new_session: bool = True,
              **options: Any) -> subprocess.Popen[Any]:
        """A process on `host` (its namespaces, its hostname), in a session of its own
        unless it is to stay in the terminal's foreground (an interactive shell)."""
        process = subprocess.Popen(in_host(self.plan.host(host), argv),
                                   start_new_session=new_session, **options)
        self._children.append(process)
        return process

    def run(self, host: str, argv: list[str], timeout: float | None = None,
            **options: Any) -> subprocess.CompletedProcess[Any]:
        """A command on `host`, to its end (killed, with all it started, on timeout)."""
        if options.pop("capture_output", False):
            options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        process = self.popen(host, argv, **options)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            self._kill_session(process)
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def _kill_session(self, process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
        try:
            if os.getpgid(process.pid) == process.pid:   # its own session: all it started
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
        except ProcessLookupError:
            pass
        process.communicate()

    def processes(self, host: str) -> list[int]:
        return processes_in(self.plan.host(host).netns)

    def kill_host(self, host: str, number: int = signal.SIGKILL) -> list[int]:
        """A host fails: every process on it gets the signal. The PIDs signalled."""
        pids = self.processes(host)
        _signal_all(pids, number)
        return pids

    def link_bytes(self, host: str) -> tuple[int, int]:
        """(bytes sent to `host`, bytes sent by it) over its link so far: the counters of
        its bridge port (what the port transmits goes to the host)."""
        port = self.plan.host(host).port
        shown = subprocess.run(["ip", "-n", self.plan.switch, "-s", "-j", "link", "show", "dev",
                                port], capture_output=True, text=True, check=True)
        stats = json.loads(shown.stdout)[0]["stats64"]
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def send(self, source: str, destination: str, nbytes: int, timeout_s: float = 120.0
             ) -> tuple[int, float]:
        """Probe a path through the cluster: `nbytes` sent over TCP from a process on
        `source` to a listener on `destination` (by its name, through the hosts file):
        (bytes received, seconds from the first byte received to the last). What the
        shaped links let through: bench/cluster_tradeoff.py prints it against their rate."""
        import socket

        host = self.plan.host(destination)
        listener = in_namespace(host.netns, lambda: socket.create_server((host.address, 0)))
        got: dict[str, float] = {"bytes": 0, "seconds": 0.0}

        def receive() -> None:
            connection, _ = listener.accept()
            with connection:
                total, first = 0, 0.0
                while chunk := connection.recv(1 << 16):
                    first = first or time.perf_counter()
                    total += len(chunk)
                got.update(bytes=total, seconds=time.perf_counter() - first)

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        script = (f"import socket; s = socket.create_connection(({destination!r}, "
                  f"{listener.getsockname()[1]})); s.sendall(bytes({nbytes})); s.close()")
        try:
            sent = self.run(source, [sys.executable, "-c", script], timeout=timeout_s,
                            capture_output=True, text=True)
            if sent.returncode:
                raise RuntimeError(f"sending {nbytes} bytes from {source} to {destination} "
                                   f"failed: {sent.stderr.strip()}")
            receiver.join(timeout=timeout_s)
        finally:
            listener.close()
        return int(got["bytes"]), got["seconds"]

    def _reap(self) -> None:
        for process in self._children:
            process.poll()

    def teardown(self) -> None:
        """Stop every process on the cluster's hosts, remove everything it made, let go
        of the lock."""
        try:
            remove_cluster(self.plan.cluster_id, self._reap)
            for process in self._children:
                if process.poll() is None:
                    self._kill_session(process)
        finally:
            if self._lock is not None:
                os.close(self._lock)
                self._lock = None


@contextmanager
def running_cluster(plan: ClusterPlan, work_dir: Path | None = None) -> Iterator[Cluster]:
    """The cluster, built, until the block ends (however it ends: an exception, a signal
    that raises, such as Ctrl-C); leftovers of dead clusters are removed first."""
    cleanup_dead()
    cluster = Cluster(plan, work_dir or STATE_DIR / f"cluster-{plan.cluster_id}")
    try:
        cluster.build()
        yield cluster
    finally:
        cluster.teardown()

