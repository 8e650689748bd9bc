"""The storage contract (stampede/backends/base.py), one suite for every backend: posix,
file://, memory://, S3 on a real SeaweedFS, NFS on a real nfs-ganesha and CephFS on a real
single-node Ceph. fsspec's shared
abstract tests are the model: what the contract promises, checked the same way everywhere."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stampede.backends import open_backend
from stampede.buffers import AlignedBuffer
from stampede.ops import RETRY_OPS
from stampede.targets import REGISTRY
from tests.helpers.s3server import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, S3Server

KINDS = ("posix", "file", "memory", "s3", "nfs", "cephfs")
BLOCK = 64 * 1024
CONTENT = bytes(range(256)) * (3 * BLOCK // 256) + b"tail"   # 3 blocks and 4 bytes


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A backend on a fresh, empty root of its kind."""
    kind = request.param
    if kind == "posix":
        target, options = str(tmp_path / "root"), {}
    elif kind == "file":
        target, options = f"file://{tmp_path / 'root'}", {}
    elif kind == "memory":
        target, options = f"memory://stampede-conformance/{uuid.uuid4().hex}", {}
    elif kind == "nfs":
        target, options = request.getfixturevalue("nfs_target"), {"timeout_ms": 5000}
    elif kind == "cephfs":
        target, options = request.getfixturevalue("cephfs_target"), {"timeout_s": 10}
    else:
        server: S3Server = request.getfixturevalue("s3_env")
        target = f"s3://{server.bucket}/conformance-{uuid.uuid4().hex[:12]}"
        options = {"endpoint_url": server.endpoint_url, "max_attempts": 2,
                   "connect_timeout": 2, "read_timeout": 5}
    opened = open_backend(target, options)
    opened.ensure_root()
    yield opened
    if kind == "cephfs":
        opened.client.release()   # its MDS session closed now, not at the interpreter's exit


def write(backend: Any, relpath: str, data: bytes = CONTENT) -> None:
    """Through the backend's writer, block by block from the start (as prepare does)."""
    with AlignedBuffer(BLOCK) as buffer, backend.writer(relpath) as writer:
        for offset in range(0, len(data), BLOCK):
            piece = data[offset:offset + BLOCK]
            buffer.view[:len(piece)] = piece
            writer.write_at(offset, buffer.view[:len(piece)])


def test_a_written_file_is_listed_sized_and_read_back_whole(backend: Any) -> None:
    write(backend, "dir/file.raw")
    assert backend.names() == ["dir/file.raw"]
    assert backend.names("dir") == ["dir/file.raw"]
    assert backend.size("dir/file.raw") == len(CONTENT)
    assert backend.get_bytes("dir/file.raw") == CONTENT
    local = backend.local_path("dir/file.raw")
    if backend.name in ("posix", "file"):
        assert local is not None and Path(local).read_bytes() == CONTENT
    else:
        assert local is None


def test_its_capabilities_are_its_registry_entrys_and_hold(backend: Any) -> None:
    """Callers trust the capabilities (stampede.targets): each is what the backend does."""
    caps = backend.capabilities
    assert caps is REGISTRY[backend.name].capabilities
    write(backend, "file.raw")
    local = backend.local_path("file.raw")
    assert not caps.local_files or (local is not None and Path(local).is_file())
    assert caps.saves == any(callable(getattr(backend, method, None))
                             for method in ("creator", "start_upload"))
    assert caps.has_directories == callable(getattr(backend, "mkdir", None))
    handle = backend.opener(False)(backend.path("file.raw"))
    try:
        with AlignedBuffer(BLOCK) as buffer:
            before = time.perf_counter_ns()
            backend.read_into(handle, buffer.view, 0)
        assert (backend.first_byte_ns > before) == caps.ttfb
    finally:
        backend.close(handle)


def test_reads_land_in_the_buffer_and_end_at_the_end(backend: Any) -> None:
    write(backend, "file.raw")
    path = backend.path("file.raw")
    handle = backend.opener(False)(path)
    try:
        assert backend.handle_size(handle) == len(CONTENT)
        with AlignedBuffer(BLOCK) as buffer:
            assert backend.read_into(handle, buffer.view, BLOCK) == BLOCK
            assert bytes(buffer.view) == CONTENT[BLOCK:2 * BLOCK]
            assert backend.read_into(handle, buffer.view, 3 * BLOCK) == 4   # short at the end
            assert bytes(buffer.view[:4]) == b"tail"
            assert backend.read_into(handle, buffer.view, len(CONTENT)) == 0   # past it
    finally:
        backend.close(handle)
    backend.stat(path)
    backend.evict(path, 0, 0)   # drops what is cached where something is; never an error


def test_listing_a_directory_gives_its_names(backend: Any) -> None:
    write(backend, "dir/a.raw", b"a")
    write(backend, "dir/b.raw", b"b")
    names = {name.decode() if isinstance(name, bytes) else name
             for name in backend.list(backend.path("dir"))}
    assert names == {"a.raw", "b.raw"}


def test_a_missing_file_is_file_not_found_everywhere(backend: Any) -> None:
    path = backend.path("nowhere.raw")
    with pytest.raises(FileNotFoundError):
        backend.stat(path)
    with pytest.raises(FileNotFoundError):
        backend.opener(False)(path)
    with pytest.raises(FileNotFoundError):
        backend.size("nowhere.raw")
    assert backend.get_bytes("nowhere.raw") is None
    backend.remove("nowhere.raw")   # removing what is not there is not an error
    assert backend.names() == []


def test_put_bytes_replaces_whole_and_remove_deletes(backend: Any) -> None:
    backend.put_bytes("small.json", b"first")
    backend.put_bytes("small.json", b"second version")
    assert backend.get_bytes("small.json") == b"second version"
    assert backend.names() == ["small.json"]   # no temporary file left beside it
    backend.remove("small.json")
    assert backend.get_bytes("small.json") is None and backend.names() == []


def test_a_failed_write_commits_nothing_new_where_the_store_can_abort(backend: Any) -> None:
    with pytest.raises(RuntimeError), backend.writer("aborted.raw") as writer:
        writer.write_at(0, memoryview(b"x" * BLOCK))
        raise RuntimeError("the writer failed mid-file")
    if backend.capabilities.has_directories:   # posix, nfs
        # a file written in place keeps what reached it: the manifest, recorded first,
        # is how stampede knows to remove it (prepare and clean)
        assert backend.names() == ["aborted.raw"]
    else:
        assert backend.names() == []


def test_only_file_systems_take_writes_at_any_offset(backend: Any) -> None:
    """POSIX and NFS write in place (every rank its slice of the shared file); fsspec's
    file systems, object stores among them, write a file as one stream from its start."""
    if backend.capabilities.has_directories:
        with backend.writer("holes.raw") as writer:
            writer.write_at(BLOCK, memoryview(b"b" * 4))
            writer.write_at(0, memoryview(b"a" * 4))
        assert backend.size("holes.raw") == BLOCK + 4
        return
    with pytest.raises(ValueError, match="sequentially"), backend.writer("holes.raw") as writer:
        writer.write_at(BLOCK, memoryview(b"b" * 4))


def test_describe_counts_retries_and_holds_no_credentials(backend: Any) -> None:
    described = repr(backend.describe())
    assert FAKE_ACCESS_KEY_ID not in described and FAKE_SECRET_ACCESS_KEY not in described
    assert "protocol" in backend.describe()
    # the client's counters, one key per op retried, zero before any timed op
    for counters in (backend.retries, backend.throttles, backend.backoff_s):
        assert set(counters) == set(RETRY_OPS) and not any(counters.values())
    assert isinstance(backend.fs_type(), str) and backend.fs_type()
