"""The throttling S3 front of `stampede emulate-s3`: an HTTP server on loopback that
decides each request on stampede.emulate.throttle's rule and either forwards it to a real
S3 server (SeaweedFS in the tests) or answers 503 SlowDown itself, as S3 does.

Forwarding keeps the request as signed: method, path, query and every header but the
hop-by-hop ones go upstream unchanged, the Host header included, so the server checks
the client's SigV4 signature as if it had been asked directly (SeaweedFS checks every
one; nothing is re-signed and no key passes through here). Bodies stream both ways in
COPY_CHUNK_BYTES pieces, never held whole. Each client connection is kept alive and has
one kept-alive connection upstream of its own. Path-style addressing only
(http://127.0.0.1:PORT/bucket/key: what stampede's client uses for an IP endpoint).

A denied request's body is read and dropped before the answer, so the client's
connection stays usable; the answer is S3's: status 503, the XML error body with code
SlowDown, and a Retry-After header (whole seconds). Every request is tallied (per kind
and partition: admitted, denied) and, with a log, recorded: when it arrived (seconds
since the front started), method, partition, key, status, a LIST's prefix, the client's
address (fields only ever appended: readers of older logs keep working).
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from stampede.emulate.throttle import Decision, Throttle
from stampede.units import BYTES_PER_MIB

COPY_CHUNK_BYTES = BYTES_PER_MIB
UPSTREAM_TIMEOUT_S = 60.0
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailers", "transfer-encoding", "upgrade"})
SLOW_DOWN_TEMPLATE = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                      "<Message>Please reduce your request rate.</Message>"
                      "<Resource>{resource}</Resource><RequestId>{request_id}</RequestId>"
                      "</Error>")


@dataclass(frozen=True)
class Request:
    """One request as the log keeps it."""

    time_s: float          # arrival, seconds since the front started
    method: str
    partition: str         # "bucket/prefix" it counted against
    kind: str              # read, write or list
    key: str
    status: int            # what the client got (503: denied here; else upstream's)
    prefix: str = ""       # a LIST's prefix parameter (the partition it counted against)
    client: str = ""       # the address it came from (an emulated cluster's node's own)


class RequestLog:
    """Every request, up to `limit` (the rest counted in `dropped`), kept in memory and
    written at exit (a write per request would be part of the service it measures)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.dropped = limit, 0
        self._entries: list[Request] = []
        self._guard = threading.Lock()

    def add(self, request: Request) -> None:
        with self._guard:
            if len(self._entries) < self.limit:
                self._entries.append(request)
            else:
                self.dropped += 1

    def __len__(self) -> int:
        return len(self._entries)

    def write(self, path: str) -> None:
        """JSON lines, one request each (Request's fields), in the order they ended."""
        with self._guard, open(path, "w") as stream:
            for request in self._entries:
                stream.write(json.dumps(asdict(request)) + "\n")


def read_log(path: str) -> list[Request]:
    """A log that `emulate-s3 --log` wrote (a field a later version appended is skipped)."""
    known = {item.name for item in fields(Request)}
    with open(path) as stream:
        return [Request(**{name: value for name, value in json.loads(line).items()
                           if name in known}) for line in stream if line.strip()]


class Tally:
    """Requests counted per (kind, admitted or denied) and per partition."""

    def __init__(self) -> None:
        self.by_kind: Counter[tuple[str, str]] = Counter()
        self.by_partition: Counter[tuple[str, str]] = Counter()
        self._guard = threading.Lock()

    def count(self, kind: str, partition: str, admitted: bool) -> None:
        verdict = "admitted" if admitted else "denied"
        with self._guard:
            self.by_kind[kind, verdict] += 1
            self.by_partition[partition, verdict] += 1

    def summary(self) -> dict[str, dict[str, int]]:
        with self._guard:
            kinds = sorted({kind for kind, _ in self.by_kind})
            return {kind: {v: self.by_kind[kind, v] for v in ("admitted", "denied")}
                    for kind in kinds}

    def text(self) -> str:
        parts = [f"{kind} {n['admitted']} admitted, {n['denied']} denied (503 SlowDown)"
                 for kind, n in self.summary().items()]
        return "; ".join(parts) or "no requests"


class ThrottlingFront:
    """The server: `start()` listens (port 0: any free one), `stop()` ends it."""

    def __init__(self, upstream: str, throttle: Throttle, host: str = "127.0.0.1",
                 port: int = 0, log: RequestLog | None = None) -> None:
        """`upstream`: host:port of the S3 server to forward to (plain HTTP)."""
        self.upstream = upstream
        self.throttle = throttle
        self.log = log
        self.tally = Tally()
        self.started_s = time.monotonic()
        self._decide_lock = threading.Lock()   # the table is one state: a decision at a time
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.endpoint_url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    def decide(self, method: str, bucket: str, key: str, prefix: str = "") -> Decision:
        with self._decide_lock:
            return self.throttle.decide(method, bucket, key, time.monotonic(), prefix)

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> ThrottlingFront:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ThrottlingFront:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def split_path(path: str) -> tuple[str, str]:
    """(bucket, key) of a path-style request's path."""
    bucket, _, key = unquote(urlsplit(path).path).lstrip("/").partition("/")
    return bucket, key


def list_prefix(path: str) -> str:
    """A LIST's prefix parameter ("" when it names none)."""
    return parse_qs(urlsplit(path).query).get("prefix", [""])[0]


def _handler_for(front: ThrottlingFront) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive, as S3 clients expect
        upstream: http.client.HTTPConnection | None = None
        served = 0

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the request log and the tally say what happened."""

        def finish(self) -> None:
            if self.upstream is not None:
                self.upstream.close()
            super().finish()

        def _serve(self) -> None:
            arrived = time.monotonic() - front.started_s
            bucket, key = split_path(self.path)
            prefix = list_prefix(self.path)
            decision = front.decide(self.command, bucket, key, prefix)
            front.tally.count(decision.kind, decision.partition, decision.admitted)
            length = int(self.headers.get("Content-Length") or 0)
            if self.headers.get("Transfer-Encoding"):
                self.send_error(501, "chunked request bodies are not relayed")
                status = 501
            elif decision.admitted:
                status = self._forward(length)
            else:
                self._drain(length)
                status = self._slow_down(decision.retry_after_header())
            if front.log is not None:
                front.log.add(Request(round(arrived, 6), self.command, decision.partition,
                                      decision.kind, key, status, prefix,
                                      self.client_address[0]))

        def _drain(self, length: int) -> None:
            while length > 0:
                chunk = self.rfile.read(min(length, COPY_CHUNK_BYTES))
                if not chunk:
                    break
                length -= len(chunk)

        def _slow_down(self, retry_after: str) -> int:
            Handler.served += 1
            body = SLOW_DOWN_TEMPLATE.format(resource=self.path.partition("?")[0],
                                             request_id=f"EMULATED{Handler.served:012d}").encode()
            self.send_response(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Retry-After", retry_after)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return 503

        def _forward(self, length: int) -> int:
            """Send the request upstream, its body streamed; relay the answer. A kept
            connection that died is replaced once, for a request without a body."""
            for attempt in range(2):
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(front.upstream,
                                                               timeout=UPSTREAM_TIMEOUT_S)
                try:
                    self.upstream.putrequest(self.command, self.path, skip_host=True,
                                             skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if name.lower() not in HOP_BY_HOP:
                            self.upstream.putheader(name, value)
                    self.upstream.endheaders()
                    remaining = length
                    while remaining > 0:
                        chunk = self.rfile.read(min(remaining, COPY_CHUNK_BYTES))
                        if not chunk:
                            raise ConnectionError("the client's body ended early")
                        self.upstream.send(chunk)
                        remaining -= len(chunk)
                    response = self.upstream.getresponse()
                    break
                except (http.client.HTTPException, OSError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt or length:   # a body half sent cannot be sent again
                        self.close_connection = True
                        return 502
            return self._answer(response)

        def _answer(self, response: http.client.HTTPResponse) -> int:
            length = response.getheader("Content-Length")
            self.send_response(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            if length is None and self.command != "HEAD":
                # no length upstream: the body ends when the connection does
                self.close_connection = True
                self.send_header("Connection", "close")
            elif length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            if self.command == "HEAD":
                response.read()
                return response.status
            while chunk := response.read(COPY_CHUNK_BYTES):
                self.wfile.write(chunk)
            return response.status

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _serve   # noqa: N815

    return Handler
