"""A real NFS server for the tests and the bench: Debian's nfs-ganesha (FSAL VFS) serving a
directory on 127.0.0.1, NFSv4 over TCP, in the foreground under a config of its own.

    with running_server(directory) as server:      # or the session fixture `nfs_server`
        target = server.url("ck")                  # nfs://127.0.0.1:PORT/export/ck

Its port is chosen free in 23000-24999 (a start that loses the race is retried); its log,
pid file and NFSv4 recovery directory live in its directory; it is Graceless (no 90 s
grace period at start). It logs that it finds no DBus system bus: harmless here.

NFSv3 (`running_server(directory, v3=True)`): ganesha registers v3 with rpcbind or refuses to
start, and rpcbind listens on every interface; so rpcbind runs in a network namespace of
its own (stampede-rpcb-PID, loopback only), reached by ganesha through its local socket
(/run/rpcbind.sock), and the client names the MOUNT port (`?mountport=`) so it never asks
the portmapper. One such server at a time (one rpcbind registration of NFSv3).
Without ganesha.nfsd or libnfs the fixture skips, unless STAMPEDE_REQUIRE_NFS=1 (CI):
then it fails.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stampede.emulate.mds import sigterm_when_parent_dies
from tests.helpers import requires
from tests.helpers.s3server import bindable

PSEUDO = "/export"
PORT_RANGE = (23_000, 25_000)
START_WAIT_S = 30.0
STOP_WAIT_S = 3.0
START_TRIES = 3
INSTALL = "apt-get install nfs-ganesha nfs-ganesha-vfs libnfs13"


@dataclass(frozen=True)
class NfsServer:
    port: int
    export: Path           # the directory served, as /export (NFSv4) and as itself (NFSv3)
    directory: Path        # config, log, pid file, recovery directory
    pid: int
    process: Any = field(default=None, compare=False, repr=False)
    mount_port: int = 0    # NFSv3's MOUNT protocol (0: NFSv4 only)

    def url(self, relpath: str) -> str:
        return f"nfs://127.0.0.1:{self.port}{PSEUDO}/{relpath}"

    def url_v3(self, relpath: str) -> tuple[str, dict[str, object]]:
        """(target.path, storage_options) of an NFSv3 target: the export is its real path."""
        return (f"nfs://127.0.0.1:{self.port}{self.export}/{relpath}?version=3&"
                f"mountport={self.mount_port}", {"export": str(self.export)})


def unavailable() -> str:
    """Why no server can be started here ("" when one can)."""
    if shutil.which("ganesha.nfsd") is None:
        return f"nfs-ganesha is not installed ({INSTALL})"
    if not Path("/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so").exists() and \
            not list(Path("/usr/lib").glob("*/ganesha/libfsalvfs.so")):
        return f"nfs-ganesha-vfs (FSAL VFS) is not installed ({INSTALL})"
    try:
        from stampede.backends.libnfs import library
        library()
    except Exception as error:   # UsageError: libnfs missing
        return f"libnfs is not installed ({error}; {INSTALL})"
    if os.geteuid() != 0:
        return "nfs-ganesha's FSAL VFS needs root (open_by_handle_at)"
    return ""


def config(directory: Path, export: Path, port: int, mount_port: int = 0,
           squash: str = "No_Root_Squash", address: str = "127.0.0.1") -> str:
    protocols = "3, 4" if mount_port else "4"
    v3 = f"MNT_Port = {mount_port}; Enable_UDP = false; " if mount_port else ""
    return f"""\
NFS_CORE_PARAM {{ Protocols = {protocols}; NFS_Port = {port}; {v3}Bind_addr = {address};
  Enable_RQUOTA = false; Enable_NLM = false; }}
NFS_KRB5 {{ Active_krb5 = false; }}
NFSV4 {{ Graceless = true; RecoveryRoot = "{directory / 'recovery'}"; }}
EXPORT {{ Export_Id = 1; Path = "{export}"; Pseudo = {PSEUDO}; Access_Type = RW;
  Squash = {squash}; Protocols = {protocols}; Transports = TCP; SecType = sys;
  FSAL {{ Name = VFS; }} }}
"""


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def start_server(directory: Path, port: int | None = None, mount_port: int = 0,
                 squash: str = "No_Root_Squash") -> NfsServer:
    """ganesha.nfsd serving directory/export (on `port`: a server started again where one
    was; with `mount_port`, NFSv3 too on that MOUNT port, -1 for the port after the NFS
    one); waits until it accepts connections and answers a mount (RuntimeError with its
    log's tail where it does not)."""
    from stampede.backends.libnfs import Client

    export = directory / "export"
    export.mkdir(parents=True, exist_ok=True)
    (directory / "recovery").mkdir(exist_ok=True)
    failure = ""
    given = port
    for _ in range(START_TRIES if given is None else 1):
        port = given or random.randrange(*PORT_RANGE)
        if given is None and not (bindable(port) and (not mount_port or bindable(port + 1))):
            continue   # (a port given is the one a killed server held: its own to take again)
        conf = directory / "ganesha.conf"
        mount = port + 1 if mount_port == -1 else mount_port
        conf.write_text(config(directory, export, port, mount, squash))
        log = directory / "ganesha.log"
        process = subprocess.Popen(
            ["ganesha.nfsd", "-F", "-f", str(conf), "-L", str(log), "-p",
             str(directory / "ganesha.pid"), "-N", "NIV_EVENT"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=sigterm_when_parent_dies)
        server = NfsServer(port, export, directory, process.pid, process, mount)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline and process.poll() is None:
            if _listening(port):
                try:
                    Client(f"nfs://127.0.0.1{PSEUDO}?version=4&nfsport={port}", 2000).destroy()
                    return server
                except OSError:
                    pass
            time.sleep(0.2)
        stop_server(server)
        text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        failure = f"ganesha.nfsd did not serve within {START_WAIT_S:.0f} s; its log ends:\n{text}"
        if "Address already in use" not in text:
            break
    raise RuntimeError(failure or "no free port for ganesha.nfsd")


def stop_server(server: NfsServer, how: int = signal.SIGTERM) -> None:
    """SIGTERM (or `how`: SIGKILL, a crash), then SIGKILL after STOP_WAIT_S; reaped."""
    if server.process.poll() is not None:
        return
    try:
        os.killpg(server.pid, how)
    except ProcessLookupError:
        return
    try:
        server.process.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.process.wait()


@contextmanager
def running_server(directory: Path, v3: bool = False,
                   squash: str = "No_Root_Squash") -> Iterator[NfsServer]:
    """A server for the block (`squash` = Root_Squash: the client's root is nobody there)."""
    with rpcbind() if v3 else nullcontext():
        server = start_server(directory, mount_port=-1 if v3 else 0, squash=squash)
        try:
            yield server
        finally:
            stop_server(server)


@contextmanager
def rpcbind() -> Iterator[None]:
    """An rpcbind for NFSv3's registration: the machine's where one runs, else one in a
    network namespace of its own (loopback only), removed with it."""
    if subprocess.run(["pgrep", "-x", "rpcbind"], capture_output=True).returncode == 0:
        yield
        return
    if shutil.which("rpcbind", path="/usr/sbin:/sbin:/usr/bin") is None:
        requires.unavailable("rpcbind is not installed (apt-get install rpcbind)", "NFS")
    namespace = f"stampede-rpcb-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    daemon = None
    try:
        subprocess.run(["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"],
                       check=True)
        daemon = subprocess.Popen(["ip", "netns", "exec", namespace, "rpcbind", "-f", "-w"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True, preexec_fn=sigterm_when_parent_dies)
        deadline = time.monotonic() + START_WAIT_S
        while not Path("/run/rpcbind.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)   # its socket listening, not only made
        yield
    finally:
        if daemon is not None:
            os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        subprocess.run(["ip", "netns", "del", namespace], check=False)


def require() -> None:
    """A test that starts servers of its own: skipped where none can run, unless
    STAMPEDE_REQUIRE_NFS=1, where that fails it."""
    reason = unavailable()
    if reason:
        requires.unavailable(reason, "NFS")


@pytest.fixture(scope="session")
def nfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NfsServer]:
    """One ganesha for the session (per xdist worker), where one can run (require())."""
    require()
    try:
        with running_server(tmp_path_factory.mktemp("nfs")) as server:
            yield server
    except RuntimeError as error:
        requires.unavailable(str(error), "NFS")


@pytest.fixture
def nfs_target(nfs_server: NfsServer) -> str:
    """A fresh, not yet existing directory on the session's export, as an nfs:// URL
    (never reused: the server keeps handles of what it served)."""
    return nfs_server.url(f"t-{uuid.uuid4().hex[:12]}")
