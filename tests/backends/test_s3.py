"""The fsspec / S3 backends against a real S3 server (SeaweedFS `weed mini`, tests/s3server.py),
with a fault-injecting proxy in front of it to count requests and make them fail.

The untimed contract (put/get/names/remove/writer) runs on every backend alike, POSIX
included; the timed one is checked request by request on S3.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stampede.backends import backend_name_for, open_backend
from stampede.backends.fsspec import FsspecBackend, described_options
from stampede.backends.s3 import S3Backend
from stampede.backends.s3upload import part_bounds
from stampede.backends.s3wire import parse_uploads_page
from stampede.errors import UsageError, install_hint
from stampede.ops import RETRY_OPS
from tests.helpers.s3server import (
    FAKE_ACCESS_KEY_ID,
    FAKE_SECRET_ACCESS_KEY,
    LATE_BODY_S,
    FaultProxy,
    S3Server,
    request_kind,
    self_signed_certificate,
)

MiB = 2**20
HANG_GUARD_S = 60.0   # a call still running after this is a hang: the test fails, not waits
FAST_FAIL = {"max_attempts": 3, "connect_timeout": 1, "read_timeout": 1}   # faults by timeout
# Where the faults come from the proxy (503s, closed connections, cut bodies), a timeout
# must never add one of its own: a busy machine can keep a 6 MiB PUT past 1 s
PATIENT = {"max_attempts": 3, "connect_timeout": 5, "read_timeout": 30}


def s3_backend(server: S3Server, endpoint_url: str | None = None, **options: Any) -> S3Backend:
    """A backend on a fresh prefix of the session's bucket (through `endpoint_url`: a proxy)."""
    target = f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}"
    backend = open_backend(target, {"endpoint_url": endpoint_url or server.endpoint_url, **options})
    assert isinstance(backend, S3Backend)
    return backend


@pytest.fixture
def proxy(s3_env: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://")) as running:
        yield running


@pytest.fixture
def mapped() -> Iterator[memoryview]:
    """A page-aligned buffer, as the runner reads into."""
    region = mmap.mmap(-1, 4 * MiB)
    yield memoryview(region)
    # not closed here: a failed read's traceback (kept by pytest.raises) may still hold a
    # slice of it; the mapping goes with the last reference


def in_thread(call: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """(result, exception, seconds) of a call that must not hang: fails past HANG_GUARD_S."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as error:   # handed to the test thread
            outcome["error"] = error

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), f"still running after {HANG_GUARD_S:.0f} s: a hang"
    return outcome.get("result"), outcome.get("error"), time.monotonic() - start


# --- the untimed contract, on every backend ------------------------------------------------------

@pytest.fixture(params=["posix", "memory", "file", "s3"])
def any_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "posix":
        return open_backend(str(tmp_path / "root"))
    if request.param == "memory":
        return open_backend(f"memory://stampede-{uuid.uuid4().hex[:12]}")
    if request.param == "file":
        return open_backend(f"file://{tmp_path / 'root'}")
    return s3_backend(request.getfixturevalue("s3_env"))


def test_put_get_names_remove(any_backend: Any) -> None:
    backend = any_backend
    backend.ensure_root()
    assert backend.get_bytes("stampede-manifest.json") is None
    backend.put_bytes("stampede-manifest.json", b'{"v": 1}')
    backend.put_bytes("stampede-manifest.json", b'{"v": 2}')   # replaced whole
    backend.put_bytes("sharded/shard-0001.bin", b"one")
    backend.put_bytes("sharded/shard-0000.bin", b"zero")
    assert backend.get_bytes("stampede-manifest.json") == b'{"v": 2}'
    assert backend.names() == ["sharded/shard-0000.bin", "sharded/shard-0001.bin",
                               "stampede-manifest.json"]
    assert backend.names("sharded") == ["sharded/shard-0000.bin", "sharded/shard-0001.bin"]
    assert backend.names("nothing-here") == []
    backend.remove("sharded/shard-0001.bin")
    backend.remove("sharded/shard-0001.bin")   # missing: fine
    assert backend.names("sharded") == ["sharded/shard-0000.bin"]
    assert backend.get_bytes("sharded/shard-0000.bin") == b"zero"


def test_writer_writes_in_order_and_is_durable(any_backend: Any) -> None:
    backend = any_backend
    backend.ensure_root()
    data = os.urandom(3 * MiB + 123)
    with backend.writer("shared.bin") as writer:
        for offset in range(0, len(data), MiB):
            writer.write_at(offset, memoryview(data)[offset:offset + MiB])
    assert backend.get_bytes("shared.bin") == data
    local = backend.local_path("shared.bin")
    assert local is None if backend.name in ("s3", "memory") else Path(local).read_bytes() == data


def test_object_stores_refuse_out_of_order_writes_and_commit_nothing(tmp_path: Path) -> None:
    backend = open_backend(f"memory://stampede-{uuid.uuid4().hex[:12]}")
    with pytest.raises(ValueError, match="written sequentially"), backend.writer("x.bin") as writer:
        writer.write_at(0, memoryview(b"a" * 10))
        writer.write_at(20, memoryview(b"b" * 10))
    assert backend.get_bytes("x.bin") is None


def test_s3_multipart_upload_and_abort(s3_env: S3Server, proxy: FaultProxy) -> None:
    """prepare's streamed upload: a PUT part per block (S3's smallest part here), the
    short rest the last part; its retries (untimed) counted nowhere; on an error the
    upload aborted, nothing committed."""
    backend = s3_backend(s3_env, proxy.endpoint_url, block_size=5 * MiB)
    data = os.urandom(12 * MiB + 7)
    proxy.fail_next(1, matching="partNumber=2")
    with backend.writer("big.bin") as writer:
        for offset in range(0, len(data), MiB):
            writer.write_at(offset, memoryview(data)[offset:offset + MiB])
    assert [request_kind(method, path) for method, path, _ in proxy.requests] == [
        "create", "part", "part", "part", "part", "complete"]   # part 2 retried once
    assert not any(backend.retries.values())
    assert backend.get_bytes("big.bin") == data
    proxy.clear()
    with backend.writer("small.bin") as writer:   # under a block: one PUT
        writer.write_at(0, memoryview(data)[:MiB])
    assert [request_kind(method, path) for method, path, _ in proxy.requests] == ["put"]
    with pytest.raises(ValueError, match="written sequentially"), backend.writer("torn.bin") as writer:
        for offset in range(0, 6 * MiB, MiB):   # past one part: a multipart upload is open
            writer.write_at(offset, memoryview(data)[offset:offset + MiB])
        writer.write_at(7 * MiB, memoryview(data)[:MiB])
    assert [request_kind(method, path) for method, path, _ in proxy.requests][-3:] == [
        "create", "part", "abort"]
    assert backend.get_bytes("torn.bin") is None    # the upload was aborted, not completed
    assert backend.names() == ["big.bin", "small.bin"]


@pytest.mark.parametrize(("buffered", "parts"), [
    (5, [(0, 5)]),                           # a block: one part
    (6, [(0, 6)]),                           # a block and a short rest: joined
    (15, [(0, 5), (5, 10), (10, 15)]),       # blocks
    (17, [(0, 5), (5, 10), (10, 17)]),       # the rest joined to the last block
    (3, [(0, 3)]),                           # the object's end, under a block: one part
])
def test_streamed_parts_are_cut_as_s3fs_cut_them(buffered: int, parts: list[tuple[int, int]]) -> None:
    assert part_bounds(buffered * MiB, 5 * MiB) == [(start * MiB, end * MiB) for start, end in parts]
    # blocks of 3 GiB, 8.5 GiB buffered: the joined last part, 5.5 GiB, is over S3's
    # largest (5 GiB): two halves of 2.75 GiB
    assert part_bounds(8704 * MiB, 3072 * MiB) == [(0, 3072 * MiB), (3072 * MiB, 5888 * MiB),
                                                   (5888 * MiB, 8704 * MiB)]
    assert part_bounds(5632 * MiB, 3072 * MiB) == [(0, 2816 * MiB), (2816 * MiB, 5632 * MiB)]


# --- the timed contract on S3, request by request ----------------------------------------------

def test_stat_open_read_close_request_by_request(s3_env: S3Server, proxy: FaultProxy,
                                                 mapped: memoryview) -> None:
    writer_side = s3_backend(s3_env)
    data = os.urandom(2 * MiB + 100)
    writer_side.put_bytes("shard.bin", data)
    backend = open_backend(f"s3://{writer_side.root}", {"endpoint_url": proxy.endpoint_url})
    key_path = f"/{writer_side.root}/shard.bin"
    path = backend.path("shard.bin")
    assert path == f"{writer_side.root}/shard.bin"
    proxy.clear()

    backend.stat(path)
    assert proxy.requests == [("HEAD", key_path, "")]
    handle = backend.opener(True)(path)
    assert handle.size == len(data)
    assert proxy.requests[1:] == [("HEAD", key_path, "")]

    proxy.clear()
    view = mapped[:MiB]
    start = time.perf_counter_ns()
    count = backend.read_into(handle, view, MiB + 50)
    stop = time.perf_counter_ns()
    assert count == MiB and bytes(view) == data[MiB + 50:2 * MiB + 50]
    assert proxy.requests == [("GET", key_path, f"bytes={MiB + 50}-{2 * MiB + 49}")]
    assert backend.capabilities.ttfb and start < backend.first_byte_ns < stop

    proxy.clear()
    assert backend.read_into(handle, view, 2 * MiB) == 100   # the end: a short read
    assert bytes(view[:100]) == data[2 * MiB:]
    assert backend.read_into(handle, view, len(data)) == 0   # past it: no request at all
    backend.close(handle)
    backend.evict(path, 0, len(data))
    assert proxy.requests == [("GET", key_path, f"bytes={2 * MiB}-{2 * MiB + 99}")]
    assert backend.retries == dict.fromkeys(RETRY_OPS, 0)


def test_time_to_first_byte_is_the_bodys_first_byte(s3_env: S3Server, proxy: FaultProxy,
                                                     mapped: memoryview) -> None:
    """Headers at once, the body LATE_BODY_S later: the first byte is the body's."""
    writer_side = s3_backend(s3_env)
    writer_side.put_bytes("shard.bin", b"z" * MiB)
    backend = open_backend(f"s3://{writer_side.root}", {"endpoint_url": proxy.endpoint_url})
    handle = backend.opener(False)(backend.path("shard.bin"))
    proxy.mode = "late"
    start = time.perf_counter_ns()
    assert backend.read_into(handle, mapped[:MiB], 0) == MiB and bytes(mapped[:MiB]) == b"z" * MiB
    assert backend.first_byte_ns - start >= LATE_BODY_S * 1e9


def test_list_is_one_request_and_returns_basenames(s3_env: S3Server,
                                                   proxy: FaultProxy) -> None:
    writer_side = s3_backend(s3_env)
    for name in ("sharded/shard-0000.bin", "sharded/shard-0001.bin", "sharded/sub/deeper.bin"):
        writer_side.put_bytes(name, b"x")
    backend = open_backend(f"s3://{writer_side.root}", {"endpoint_url": proxy.endpoint_url})
    proxy.clear()
    assert sorted(backend.list(backend.path("sharded"))) == ["shard-0000.bin", "shard-0001.bin", "sub"]
    assert [method for method, _, _ in proxy.requests] == ["GET"]
    assert backend.list(backend.path("empty")) == []


def test_missing_object_is_file_not_found(s3_env: S3Server, mapped: memoryview) -> None:
    backend = s3_backend(s3_env)
    with pytest.raises(FileNotFoundError):
        backend.stat(backend.path("absent.bin"))
    with pytest.raises(FileNotFoundError):
        backend.opener(False)(backend.path("absent.bin"))


def test_throttling_is_retried_and_counted(s3_env: S3Server, proxy: FaultProxy,
                                           mapped: memoryview) -> None:
    writer_side = s3_backend(s3_env)
    writer_side.put_bytes("shard.bin", b"0123456789" * 1000)
    backend = open_backend(f"s3://{writer_side.root}",
                           {"endpoint_url": proxy.endpoint_url, **PATIENT})
    path = backend.path("shard.bin")
    handle = backend.opener(False)(path)

    proxy.clear()
    proxy.fail_next(2)          # two 503 SlowDown, then the real answer
    assert backend.read_into(handle, mapped[:10], 5) == 10
    assert bytes(mapped[:10]) == b"5678901234"
    assert backend.retries["read"] == 2
    assert [method for method, _, _ in proxy.requests] == ["GET"] * 3

    proxy.fail_next(1)
    backend.stat(path)
    assert backend.retries["stat"] == 1

    proxy.fail_next(100)        # more than max_attempts: the error surfaces, counted, named
    #                             as throttling with its object (never "missing")
    with pytest.raises(OSError, match=r"^throttled: S3 GET 503 SlowDown after 3 attempts on "
                                      r"s3://[^/]+/.+/shard\.bin$") as raised:
        backend.read_into(handle, mapped[:10], 0)
    assert not isinstance(raised.value, FileNotFoundError)
    assert backend.retries["read"] == 4
    with pytest.raises(OSError, match=r"^throttled: S3 HEAD 503 Service Unavailable after 3 "
                                      r"attempts on s3://.+/shard\.bin$"):
        backend.opener(False)(path)
    assert backend.retries["open"] == 2


def test_a_dead_server_is_an_oserror_within_the_timeouts(s3_env: S3Server,
                                                         proxy: FaultProxy) -> None:
    writer_side = s3_backend(s3_env)
    writer_side.put_bytes("shard.bin", b"x" * 100)
    backend = open_backend(f"s3://{writer_side.root}",
                           {"endpoint_url": proxy.endpoint_url, **FAST_FAIL})
    path = backend.path("shard.bin")
    handle = backend.opener(False)(path)         # a kept-alive connection exists now

    proxy.mode = "stall"                         # a hung server: the read timeout ends it
    _, error, _ = in_thread(lambda: backend.stat(path))
    assert isinstance(error, OSError) and str(error) == "S3 HEAD: read timeout after 2 retries"
    assert backend.retries["stat"] == 2

    proxy.mode, proxy.late_s = "late", 3.0       # headers, then a body that stalls
    _, error, _ = in_thread(lambda: backend.read_into(handle, memoryview(bytearray(100)), 0))
    assert isinstance(error, OSError) and str(error) == "S3 GET: read timeout after 2 retries"
    assert backend.retries["read"] == 2

    proxy.refuse()                               # nothing listening any more
    _, error, _ = in_thread(lambda: backend.list(backend.path("")))
    assert isinstance(error, OSError)
    assert str(error) == "S3 LIST: connection refused after 2 retries"
    assert backend.retries["list"] == 2


def test_a_connection_the_server_closed_while_idle_is_replaced_uncounted(
        s3_env: S3Server, proxy: FaultProxy) -> None:
    """A kept-alive connection the server hung up (its idle timeout) is not a retry: the
    client sees it before sending and opens a new one; one request reaches the server."""
    writer_side = s3_backend(s3_env)
    writer_side.put_bytes("shard.bin", b"x" * 100)
    backend = open_backend(f"s3://{writer_side.root}",
                           {"endpoint_url": proxy.endpoint_url, **PATIENT})
    path = backend.path("shard.bin")
    backend.stat(path)
    connections = proxy.connections
    proxy.hang_up()
    time.sleep(0.2)   # the FIN reaches the client's socket
    proxy.clear()
    backend.stat(path)
    assert backend.retries["stat"] == 0
    assert proxy.requests == [("HEAD", f"/{writer_side.root}/shard.bin", "")]
    assert proxy.connections == connections + 1


def test_closed_connections_and_cut_bodies_are_retried_and_counted(
        s3_env: S3Server, proxy: FaultProxy, mapped: memoryview) -> None:
    writer_side = s3_backend(s3_env)
    data = os.urandom(MiB)
    writer_side.put_bytes("shard.bin", data)
    backend = open_backend(f"s3://{writer_side.root}",
                           {"endpoint_url": proxy.endpoint_url, **PATIENT})
    path = backend.path("shard.bin")
    handle = backend.opener(False)(path)

    proxy.mode = "cut"          # half of each body, then the connection closed
    _, error, _ = in_thread(lambda: backend.read_into(handle, mapped[:MiB], 0))
    assert isinstance(error, OSError) and str(error) == \
        "S3 GET: response body ended early after 2 retries"
    assert backend.retries["read"] == 2

    proxy.mode = "close"        # no answer at all
    _, error, _ = in_thread(lambda: backend.stat(path))
    assert isinstance(error, OSError) and str(error) == \
        "S3 HEAD: connection closed by the server after 2 retries"
    assert backend.retries["stat"] == 2

    proxy.clear()
    assert backend.read_into(handle, mapped[:MiB], 0) == MiB and bytes(mapped[:MiB]) == data
    assert backend.retries == {**dict.fromkeys(RETRY_OPS, 0), "stat": 2, "read": 2}


def test_a_list_of_more_than_one_page(s3_env: S3Server, proxy: FaultProxy) -> None:
    """1,001 names: two LIST requests, every name once, odd characters intact."""
    writer_side = s3_backend(s3_env)
    names = [f"many/{index:04d}{' +%ü' if index % 250 == 0 else ''}.bin" for index in range(1001)]
    for name in names:
        writer_side.put_bytes(name, b"")
    backend = open_backend(f"s3://{writer_side.root}", {"endpoint_url": proxy.endpoint_url})
    proxy.clear()
    assert sorted(backend.list(backend.path("many"))) == sorted(n.partition("/")[2] for n in names)
    assert [method for method, _, _ in proxy.requests] == ["GET", "GET"]
    assert backend.names("many") == sorted(names)


def test_an_http_proxy_in_the_environment_is_used(s3_env: S3Server, proxy: FaultProxy,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.endpoint_url)
    backend = s3_backend(s3_env)   # the server's own endpoint: reached through the proxy
    backend.put_bytes("shard.bin", b"through the proxy")
    assert backend.get_bytes("shard.bin") == b"through the proxy"
    url = f"{s3_env.endpoint_url}/{backend.root}/shard.bin"
    assert [(method, path) for method, path, _ in proxy.requests] == [("PUT", url), ("GET", url)]


def test_without_credentials_a_usage_error_and_anon_is_unsigned(
        s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    target = f"s3://{s3_env.bucket}/anywhere"
    with pytest.raises(UsageError, match=f"^{target}: no S3 credentials found"):
        open_backend(target, {"endpoint_url": s3_env.endpoint_url})
    backend = open_backend(target, {"endpoint_url": s3_env.endpoint_url, "anon": True})
    with pytest.raises(PermissionError) as raised:   # this server wants keys
        backend.stat(backend.path("x.bin"))
    assert raised.value.strerror == "S3 HEAD 403 Forbidden"


def test_no_path_imports_s3fs_or_an_async_client(s3_env: S3Server, tmp_path: Path) -> None:
    """open, stat, read, list and prepare's uploads (one PUT, and multipart) import neither
    s3fs, fsspec, aiobotocore nor aiohttp (heavy: at 16,384 ranks each import is a
    metadata storm; and the `s3` extra installs none of them)."""
    script = tmp_path / "imports.py"
    script.write_text(f"""
import os, sys
from stampede.backends import open_backend
backend = open_backend("s3://{s3_env.bucket}/imports", {{"endpoint_url": "{s3_env.endpoint_url}",
                                                         "block_size": 5 * 2**20}})
backend.put_bytes("x.bin", b"0123456789")
handle = backend.opener(False)(backend.path("x.bin"))
view = memoryview(bytearray(10))
assert backend.read_into(handle, view, 0) == 10 and backend.list(backend.path("")) == ["x.bin"]
with backend.writer("y.bin") as writer:
    writer.write_at(0, memoryview(b"y"))
with backend.writer("z.bin") as writer:
    writer.write_at(0, memoryview(os.urandom(11 * 2**20)))
print(sorted(name for name in ("s3fs", "fsspec", "aiobotocore", "aiohttp") if name in sys.modules))
""")
    import subprocess
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env={**os.environ, **s3_env.env}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[]"


def test_https_verified_by_a_ca_bundle_or_refused(s3_env: S3Server, tmp_path: Path,
                                                 mapped: memoryview) -> None:
    """Through a TLS endpoint (the proxy, with a self-signed certificate): verified by the
    bundle given in client_kwargs.verify, refused at once without it (no retry: it would
    fail alike), accepted with verify = false."""
    certificate, key = self_signed_certificate(tmp_path)
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://"), tls=(certificate, key)) as proxy:
        backend = s3_backend(s3_env, proxy.endpoint_url, client_kwargs={"verify": str(certificate)})
        data = os.urandom(MiB)
        backend.put_bytes("tls.bin", data)
        handle = backend.opener(False)(backend.path("tls.bin"))
        assert backend.read_into(handle, mapped[:MiB], 0) == MiB and bytes(mapped[:MiB]) == data
        assert backend.describe()["endpoint_url"] == proxy.endpoint_url
        proxy.clear()
        strict = open_backend(f"s3://{backend.root}", {"endpoint_url": proxy.endpoint_url})
        with pytest.raises(OSError, match=r"^S3 HEAD: TLS: certificate verify failed \("):
            strict.stat(handle.path)
        assert strict.retries["stat"] == 0 and proxy.requests == []
        lax = open_backend(f"s3://{backend.root}", {"endpoint_url": proxy.endpoint_url,
                                                    "client_kwargs": {"verify": False}})
        assert lax.get_bytes("tls.bin") == data


# --- what the sidecar may hold; the registry ----------------------------------------------------

def test_describe_holds_no_credentials(s3_env: S3Server) -> None:
    backend = s3_backend(s3_env, client_kwargs={"verify": False}, config_kwargs={"user_agent_extra": "x"})
    text = json.dumps(backend.describe())
    assert FAKE_ACCESS_KEY_ID not in text and FAKE_SECRET_ACCESS_KEY not in text
    described = backend.describe()
    assert described["protocol"] == "s3" and described["endpoint_url"] == s3_env.endpoint_url
    assert described["caches"]["blocks"].startswith("off")
    assert described["retry"]["max_attempts"] == 3
    assert described["storage_options"]["config_kwargs"] == {}   # keys not allow-listed: left out
    assert described_options({"endpoint_url": "http://user:pw@host:9000", "profile": "p"}) == \
        {"endpoint_url": "http://host:9000"}


def test_credentials_in_storage_options_are_refused_unshown() -> None:
    for options in ({"secret": "hunter2"}, {"client_kwargs": {"aws_secret_access_key": "hunter2"}}):
        with pytest.raises(UsageError) as raised:
            open_backend("memory://x", options)
        assert "hunter2" not in str(raised.value) and "credential" in str(raised.value)


@pytest.mark.parametrize("protocol", ["memory", "file"])
def test_generic_fsspec_backends_follow_the_timed_contract(protocol: str, tmp_path: Path,
                                                           mapped: memoryview) -> None:
    root = f"stampede-{uuid.uuid4().hex[:12]}" if protocol == "memory" else str(tmp_path / "root")
    backend = open_backend(f"{protocol}://{root}")
    assert isinstance(backend, FsspecBackend) and backend.fs_type() == protocol
    assert not backend.capabilities.ttfb
    data = os.urandom(MiB + 10)
    backend.put_bytes("sharded/shard-0000.bin", data)
    path = backend.path("sharded/shard-0000.bin")
    assert backend.stat(path)["size"] == len(data)
    handle = backend.opener(False)(path)
    assert backend.read_into(handle, mapped[:MiB], 10) == MiB and bytes(mapped[:MiB]) == data[10:MiB + 10]
    assert backend.read_into(handle, mapped[:MiB], MiB) == 10
    assert backend.read_into(handle, mapped[:MiB], len(data)) == 0
    backend.close(handle)
    backend.evict(path, 0, 0)   # file://: the page cache's pages dropped; memory://: nothing
    assert backend.list(backend.path("sharded")) == ["shard-0000.bin"]
    with pytest.raises(FileNotFoundError):
        backend.opener(False)(backend.path("absent"))
    assert backend.describe()["protocol"] == protocol


def test_registry_routes_urls_and_names_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [backend_name_for(target) for target in ("/a/b", "s3://b/p", "gs://b", "memory://x")] == \
        ["posix", "s3", "gs", "memory"]
    with pytest.raises(UsageError, match="no backend for ftp://"):
        backend_name_for("ftp://host/x")
    with pytest.raises(UsageError, match="POSIX path"):
        open_backend("/tmp/x", {"endpoint_url": "http://127.0.0.1:1"})
    monkeypatch.setitem(sys.modules, "botocore", None)   # import botocore now fails
    with pytest.raises(UsageError) as raised:
        open_backend("s3://bucket/prefix")
    assert "(botocore)" in str(raised.value) and install_hint("s3") in str(raised.value)


# --- the save's requests (stampede.backends.base.ObjectStore) ------------------------------

def test_a_multipart_upload_is_its_requests_sent_from_the_buffers(s3_env: S3Server,
                                                                  proxy: FaultProxy,
                                                                  mapped: memoryview) -> None:
    backend = s3_backend(s3_env, proxy.endpoint_url, **PATIENT)
    mapped[:] = bytes(range(256)) * (len(mapped) // 256)
    large = mmap.mmap(-1, 6 * MiB)   # a part of at least 5 MiB, then a short last one
    large[:] = os.urandom(6 * MiB)
    path = backend.path("saved.bin")
    upload = backend.start_upload(path)
    # part 1: a header and the data behind it, two views sent back to back
    first = backend.upload_part(upload, 1, (mapped[:4096], memoryview(large)))
    last = backend.upload_part(upload, 2, (mapped[:1000],))
    backend.complete_upload(upload, [(1, first), (2, last)])
    assert [request_kind(method, path) for method, path, _ in proxy.requests] == [
        "create", "part", "part", "complete"]
    assert backend.get_bytes("saved.bin") == bytes(mapped[:4096]) + bytes(large) + \
        bytes(mapped[:1000])
    assert not any(backend.retries.values())


def test_save_requests_retry_and_count_under_their_ops(s3_env: S3Server, proxy: FaultProxy,
                                                       mapped: memoryview) -> None:
    backend = s3_backend(s3_env, proxy.endpoint_url, **PATIENT)
    path = backend.path("saved.bin")
    proxy.fail_next(1)
    upload = backend.start_upload(path)
    proxy.fail_next(2)
    etag = backend.upload_part(upload, 1, (mapped[:100],))
    proxy.fail_next(1)
    backend.complete_upload(upload, [(1, etag)])
    proxy.fail_next(1)
    backend.put_object(backend.path("latest"), (memoryview(b"v000001\n"),), "publish")
    proxy.fail_next(1)
    backend.unlink(path)
    assert {op: count for op, count in backend.retries.items() if count} == {
        "create": 1, "write": 2, "fsync": 1, "publish": 1, "unlink": 1}
    assert backend.names() == ["latest"]
    upload = backend.start_upload(path)
    proxy.fail_next(100)   # more than max_attempts: the error surfaces, named
    with pytest.raises(OSError, match=r"^throttled: S3 PUT part 503 SlowDown after 3 attempts on "
                                      r"s3://.+$"):
        backend.upload_part(upload, 1, (mapped[:100],))
    proxy.clear()
    backend.abort_upload(upload)


def test_an_aborted_upload_leaves_nothing_and_discard_finds_a_killed_saves(
        s3_env: S3Server, mapped: memoryview) -> None:
    backend = s3_backend(s3_env)
    upload = backend.start_upload(backend.path("saves/v1/a.bin"))
    etag = backend.upload_part(upload, 1, (mapped[:100],))
    backend.abort_upload(upload)
    backend.abort_upload(upload)   # already gone: not an error
    with pytest.raises(FileNotFoundError, match="NoSuchUpload"):
        backend.complete_upload(upload, [(1, etag)])
    left = [backend.start_upload(backend.path(name)) for name in ("saves/v2/a.bin", "saves/v2/b")]
    backend.start_upload(backend.path("elsewhere.bin"))
    assert sorted(backend.discard_uploads("saves")) == ["saves/v2/a.bin", "saves/v2/b"]
    assert backend.discard_uploads("saves") == []
    with pytest.raises(FileNotFoundError):
        backend.complete_upload(left[0], [])
    assert backend.discard_uploads("") == ["elsewhere.bin"]
    assert backend.names() == []


def test_a_list_of_uploads_is_parsed_page_by_page() -> None:
    body = (b'<?xml version="1.0" encoding="UTF-8"?><ListMultipartUploadsResult xmlns="http://s3'
            b'.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><IsTruncated>true</IsTruncated>'
            b"<NextKeyMarker>p/b</NextKeyMarker><NextUploadIdMarker>2</NextUploadIdMarker>"
            b"<Upload><Key>p/a</Key><UploadId>1</UploadId></Upload>"
            b"<Upload><Key>p/b</Key><UploadId>2</UploadId></Upload></ListMultipartUploadsResult>")
    assert parse_uploads_page(body) == ([("p/a", "1"), ("p/b", "2")], ("p/b", "2"))
    last = body.replace(b"<IsTruncated>true", b"<IsTruncated>false")
    assert parse_uploads_page(last)[1] == ("", "")
