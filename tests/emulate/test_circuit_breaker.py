"""SeaweedFS's own S3 circuit breaker (`s3.circuitBreaker` in `weed shell`, applied by
stampede.emulate.objectstore.apply_circuit_breaker): a second, real throttle, a limit on the
requests in flight in a bucket. Its rejections (503 ErrTooManyRequest) are counted by
stampede's client as throttling, retried, and, once the attempts run out, an error named
as throttling, never "missing". The read slot is held open by a GET of a large object whose
body is not read (the server's handler blocks writing it), so which request is refused is
decided by the order of events, not by the machine's speed. A server of its own: the
session's is left unthrottled for every other test."""

from __future__ import annotations

import http.client
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.emulate.objectstore import apply_circuit_breaker
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.s3server import FaultProxy, S3Server, running_server

HOLD_BYTES = 64 << 20     # far more than a loopback socket buffers: the GET stays in flight
NP = 2
Launch = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def breaker_server(s3_env: S3Server, tmp_path: Path) -> Iterator[S3Server]:
    """A SeaweedFS of this test's own (the session's keys in the environment), its bucket
    limited to 1 read in flight."""
    with running_server(tmp_path) as server:
        open_backend(f"s3://{server.bucket}/hold", {"endpoint_url": server.endpoint_url}
                     ).put_bytes("big.bin", bytes(HOLD_BYTES))
        config = apply_circuit_breaker(f"127.0.0.1:{server.ports['master']}", server.bucket,
                                       reads=1, writes=100)
        assert config["buckets"] == {server.bucket: {"enabled": True, "actions": {
            "Read:Count": "1", "Write:Count": "100"}}}
        yield server


class Hold:
    """The bucket's one read slot, held by a signed GET whose body is left unread; let go
    by closing its connection (the server's write then fails at once)."""

    def __init__(self, server: S3Server) -> None:
        from botocore.auth import S3SigV4Auth
        from botocore.credentials import Credentials

        self.signer = S3SigV4Auth(Credentials(server.env["AWS_ACCESS_KEY_ID"],
                                              server.env["AWS_SECRET_ACCESS_KEY"]),
                                  "s3", "us-east-1")
        self.server = server
        self.connection: http.client.HTTPConnection | None = None

    def take(self) -> None:
        """The slot, taken: asked again while the server refuses (503), since a slot let go
        is free only once the server's write on the closed connection has failed, a moment
        later under load (a take refused inside the proxy once left the run's first read
        unthrottled: the suite failed with 0 throttles)."""
        from botocore.awsrequest import AWSRequest

        path = f"/{self.server.bucket}/hold/big.bin"
        deadline = time.monotonic() + 30
        while True:
            request = AWSRequest("GET", self.server.endpoint_url + path)
            self.signer.add_auth(request)
            connection = http.client.HTTPConnection(
                self.server.endpoint_url.removeprefix("http://"), timeout=30)
            connection.request("GET", path, headers=dict(request.headers.items()))
            response = connection.getresponse()
            if response.status == 200:
                self.connection = connection
                return
            connection.close()
            assert response.status == 503 and time.monotonic() < deadline, response.status
            time.sleep(0.05)

    def release(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _until_the_breaker_refuses(server: S3Server, hold: Hold) -> OSError:
    """The S3 server loads the breaker's configuration a moment after weed shell wrote it:
    ask (the slot held) until a read is refused; the refusal."""
    backend = open_backend(f"s3://{server.bucket}/hold", {"endpoint_url": server.endpoint_url,
                                                          "max_attempts": 1})
    backend.put_bytes("small.bin", b"x" * 1000)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        hold.take()
        try:
            backend.get_bytes("small.bin")
        except OSError as refused:
            return refused
        finally:
            hold.release()
        time.sleep(0.2)
    raise AssertionError("the circuit breaker refused nothing within 60 s")


def test_a_read_beyond_the_breakers_limit_is_refused_as_throttling(
        breaker_server: S3Server) -> None:
    hold = Hold(breaker_server)
    refused = _until_the_breaker_refuses(breaker_server, hold)
    assert str(refused) == (f"throttled: S3 GET 503 ErrTooManyRequest after 1 attempt on "
                            f"s3://{breaker_server.bucket}/hold/small.bin")
    # once the held GET's connection is closed (the server notices it a moment later), the
    # slot is free: a client that retries is served
    patient = open_backend(f"s3://{breaker_server.bucket}/hold",
                           {"endpoint_url": breaker_server.endpoint_url, "max_attempts": 20})
    assert patient.get_bytes("small.bin") == b"x" * 1000


def _job(tmp_path: Path, name: str, server: S3Server, endpoint: str, attempts: int) -> Path:
    return write_job(tmp_path, name, target={
        "path": f"s3://{server.bucket}/breaker",
        "storage_options": {"endpoint_url": endpoint, "max_attempts": attempts}},
        checkpoint={"size": "2MiB", "layout": "sharded", "block_size": "1MiB", "format": "raw"},
        run={"iterations": 1, "warmup": 0, "verify": "none"},
        archive={"path": str(tmp_path / "results" / f"{name}.csv")})


@pytest.mark.mpi
def test_a_run_counts_the_breakers_refusals_as_throttling_or_fails_named(
        stampede: Launch, breaker_server: S3Server, tmp_path: Path) -> None:
    server = breaker_server
    hold = Hold(server)
    _until_the_breaker_refuses(server, hold)
    prepared = stampede("prepare", str(_job(tmp_path, "direct", server, server.endpoint_url, 3)),
                        np=NP)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    with FaultProxy(server.endpoint_url.removeprefix("http://")) as proxy:
        # the first GET of a shard (a timed read) is relayed just after the hold took the
        # slot, so it is refused; the next one lets the slot go before it is relayed
        shard_get = f"GET /{server.bucket}/breaker/sharded/"
        proxy.before_next(shard_get, hold.take)
        proxy.before_next(shard_get, hold.release)
        run = stampede("run", str(_job(tmp_path, "patient", server, proxy.endpoint_url, 20)),
                       np=NP)
    hold.release()
    stdout, stderr = run.stdout, run.stderr
    assert run.returncode == 0, stdout + stderr
    rows = read_archive(tmp_path / "results" / "patient.csv")
    throttled = sum(int(row["throttles"]) for row in rows if row["throttles"])
    retried = sum(int(row["retries"]) for row in rows if row["retries"])
    assert throttled >= 1 and retried >= 1, rows
    read = next(row for row in rows if row["op"] == "read")
    assert int(read["throttles"]) >= 1 and float(read["backoff_s"]) > 0, read
    assert all(row["valid"] == "true" and row["errors"] in ("", "0") for row in rows), rows
    assert "throttling answers (429, 503) / retries / time backing off" in stdout, stdout
    # the slot held for the whole run and 2 attempts: the run fails, named as throttling
    hold.take()
    try:
        failed = stampede("run", str(_job(tmp_path, "hasty", server, server.endpoint_url, 2)),
                          np=NP)
    finally:
        hold.release()
    said = " ".join((failed.stdout + failed.stderr).split())
    assert failed.returncode != 0, said
    assert re.search(r"throttled: S3 (GET 503 ErrTooManyRequest|HEAD 503 Service Unavailable) "
                     r"after 2 attempts on s3://", said), said
    assert "missing" not in said and "No such file" not in said
    stampede("clean", str(_job(tmp_path, "direct", server, server.endpoint_url, 3)))
