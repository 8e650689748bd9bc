"""Checkpoints stampede did not write, in an object store: the published safetensors
model, the same tensors resharded with their index, and a DCP checkpoint, uploaded to a
real S3 server (SeaweedFS on 127.0.0.1) and restored from there under a real mpiexec with
`--checkpoint s3://bucket/prefix`, exactly as from a file system: every tensor byte read
once, each rank's hashes equal to a plain read of the local files. Scanning makes only
reading requests; a prepared target and HDF5 are refused."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stampede.errors import CheckpointError, UsageError
from stampede.existing.catalogue import Catalogue
from stampede.existing.scan import scan
from stampede.existing.torchfiles import TAIL_BYTES
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.s3server import FaultProxy, S3Server

pytestmark = pytest.mark.mpi


def _client(server: S3Server) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=server.endpoint_url, region_name="us-east-1",
                        aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"])


def _upload(server: S3Server, files: dict[str, Path | bytes], prefix: str) -> str:
    """Put the files (relpath -> local file or bytes) under a prefix; its s3:// URL."""
    client = _client(server)
    try:
        for relpath, source in files.items():
            body = source if isinstance(source, bytes) else source.read_bytes()
            client.put_object(Bucket=server.bucket, Key=f"{prefix}/{relpath}", Body=body)
    finally:
        client.close()
    return f"s3://{server.bucket}/{prefix}"


def _tree(root: Path) -> dict[str, Path | bytes]:
    return {path.relative_to(root).as_posix(): path for path in sorted(root.rglob("*"))
            if path.is_file()}


def _options(server: S3Server, endpoint: str | None = None) -> dict[str, object]:
    return {"endpoint_url": endpoint or server.endpoint_url}


def _job(tmp_path: Path, server: S3Server, assign: list[str]) -> Path:
    return write_job(tmp_path, "existing",
                     target={"path": "set-by-checkpoint", "storage_options": _options(server)},
                     checkpoint={"assign": assign, "block_size": "1MiB"},
                     run={"iterations": 1, "warmup": 1, "verify": "sha256"},
                     archive={"path": str(tmp_path / "results" / "existing.csv")})


def _same_as_local(url: str, server: S3Server, local: Path) -> Catalogue:
    """The object store's catalogue is the local one's, but for its root."""
    found = scan(url, _options(server))
    assert found.root == url.rstrip("/")
    assert dataclasses.replace(found, root=str(local)) == scan(str(local))
    return found


def _restored(stampede: Any, tmp_path: Path, server: S3Server, url: str, local: Path,
              assign: list[str], fmt: str) -> list[dict[str, str]]:
    result = stampede("run", str(_job(tmp_path, server, assign)), "--checkpoint", url, np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {row["format"] for row in rows} == {fmt}
    assert {row["checkpoint_source"] for row in rows} == {"existing"}
    assert {row["valid"] for row in rows} == {"true"}
    assert {row["backend"] for row in rows} == {"s3"}
    assert {row["layout"] for row in rows} == set(assign)
    total = scan(str(local)).total_bytes
    digests = read_digests(tmp_path)
    assert set(digests) == set(assign)
    for policy, recorded in digests.items():
        assert recorded, policy
        accounted(local, recorded, str(local))
        restore = next(r for r in rows if r["layout"] == policy and r["op"] == "restore")
        assert int(restore["bytes_total"]) == total
    return rows


def test_a_published_model_restored_from_s3(stampede, s3_env: S3Server, tmp_path: Path,
                                            published: Path) -> None:
    url = _upload(s3_env, {"model.safetensors": published}, "existing/published")
    _same_as_local(url, s3_env, published.parent)
    # the object's own URL: its prefix is the root, as a file's directory is
    single = scan(f"{url}/model.safetensors", _options(s3_env))
    assert single == scan(url, _options(s3_env))
    rows = _restored(stampede, tmp_path, s3_env, url, published.parent,
                     ["files", "tensor-slices"], "safetensors")
    header = [row for row in rows if row["op"] == "header" and row["layout"] == "tensor-slices"]
    assert int(header[0]["count"]) == 2   # every rank parses the header, timed, over S3
    assert {row["retries"] for row in rows if row["op"] == "read"} == {"0"}


def test_sharded_safetensors_with_their_index_from_s3(stampede, s3_env: S3Server,
                                                      tmp_path: Path, sharded: Path) -> None:
    url = _upload(s3_env, _tree(sharded), "existing/sharded")
    catalogue = _same_as_local(url, s3_env, sharded)
    assert catalogue.index_file == "model.safetensors.index.json" and len(catalogue.files) == 3
    assert scan(f"{url}/model.safetensors.index.json", _options(s3_env)) == catalogue
    rows = _restored(stampede, tmp_path, s3_env, url, sharded, ["files", "tensor-slices"],
                     "safetensors")
    index = [row for row in rows if row["op"] == "index"]
    assert index and all(int(row["count"]) == 2 for row in index)   # every rank reads it


def test_a_dcp_checkpoint_restored_from_s3(stampede, s3_env: S3Server, tmp_path: Path,
                                           dcp_dir: Path) -> None:
    url = _upload(s3_env, _tree(dcp_dir), "existing/dcp")
    catalogue = _same_as_local(url, s3_env, dcp_dir)
    assert catalogue.format == "dcp" and catalogue.saving_ranks == 2
    rows = _restored(stampede, tmp_path, s3_env, url, dcp_dir, ["saved", "tensor-slices"], "dcp")
    index = [row for row in rows if row["op"] == "index"]     # .metadata, unpickled, every rank
    assert {int(row["count"]) for row in index} == {2}


def test_plan_prints_what_it_found_in_s3(stampede, s3_env: S3Server, tmp_path: Path,
                                         sharded: Path) -> None:
    url = _upload(s3_env, _tree(sharded), "existing/plan")
    result = stampede("plan", str(_job(tmp_path, s3_env, ["files"])), "--checkpoint", url,
                      "--np", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    total = scan(str(sharded)).total_bytes
    said = " ".join(result.stdout.split())
    assert f"checkpoint: {url} (safetensors)" in said
    assert f"bytes to restore: {total:,}" in said
    assert "assign files: 2 rank(s)" in said


def test_scan_makes_only_reading_requests(s3_env: S3Server, sharded: Path,
                                          dcp_dir: Path) -> None:
    """LIST (a GET of the bucket), HEAD and GET only: nothing is written, and the bytes
    fetched are the headers and the small files (ranges inside each header)."""
    urls = {"safetensors": _upload(s3_env, _tree(sharded), "existing/requests/sharded"),
            "dcp": _upload(s3_env, _tree(dcp_dir), "existing/requests/dcp")}
    seen: dict[str, Counter[str]] = {}
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://")) as proxy:
        for fmt, url in urls.items():
            proxy.clear()
            catalogue = scan(url, _options(s3_env, proxy.endpoint_url))
            assert catalogue.format == fmt
            requests = list(proxy.requests)
            kinds: Counter[str] = Counter()
            for method, path, byte_range in requests:
                assert method in ("GET", "HEAD"), (method, path)
                if method == "GET" and "list-type=2" in path:
                    kinds["LIST"] += 1
                elif method == "GET":
                    kinds["GET range" if byte_range else "GET whole"] += 1
                else:
                    kinds["HEAD"] += 1
            seen[fmt] = kinds
            files = len(catalogue.files)
            assert kinds["LIST"] == 1
            # the manifest that must not be there: one HEAD in the prefix, one in its parent
            if fmt == "safetensors":
                # the index and each shard: one HEAD (its open) and ranged GETs of its
                # header (the index: whole; a shard: its first page, then the whole header)
                assert kinds["HEAD"] == files + 1 + 2
                pages = {}
                for name, _ in catalogue.files:
                    with open(sharded / name, "rb") as stream:
                        pages[name] = 1 if 8 + int.from_bytes(stream.read(8), "little") <= 4096 \
                            else 2
                assert kinds["GET range"] == sum(pages.values()) + 1
                assert kinds["GET whole"] == 0
                for _, path, byte_range in requests:
                    name = path.partition("?")[0].rpartition("/")[2]
                    if byte_range and name.endswith(".safetensors"):   # header bytes only
                        with open(sharded / name, "rb") as stream:
                            header = 8 + int.from_bytes(stream.read(8), "little")
                        whole_pages = -(-header // 4096) * 4096
                        last = int(byte_range.removeprefix("bytes=").partition("-")[2])
                        assert last < whole_pages, (name, byte_range, header)
            else:
                # each .distcp file opened once (a HEAD), .metadata opened (a HEAD) and read
                # whole; each tensor chunk's zip directory in one ranged GET of its item's
                # tail, its record's local header inside it unless the item is larger
                assert kinds["HEAD"] == files + 1 + 2
                chunks = [t for t in catalogue.tensors if t.rows_total]
                large = [t for t in chunks if t.nbytes > TAIL_BYTES]
                assert chunks and large and len(large) < len(chunks)   # both kinds here
                assert kinds["GET range"] == 1 + len(chunks) + len(large)
                assert kinds["GET whole"] == 0
                ranged = [path for _, path, byte_range in requests if byte_range]
                assert sum(path.partition("?")[0].endswith("/.metadata") for path in ranged) == 1
    print(f"scan requests: {json.dumps({fmt: dict(kinds) for fmt, kinds in seen.items()})}")


def test_a_prepared_target_in_s3_is_refused(stampede, s3_env: S3Server, tmp_path: Path,
                                            published: Path) -> None:
    url = _upload(s3_env, {"stampede-manifest.json": b"{}",
                           "sharded/model.safetensors": published}, "existing/prepared")
    job = _job(tmp_path, s3_env, ["files"])
    for where in (url, f"{url}/sharded"):   # the prepared target, or a layout inside it
        result = stampede("run", str(job), "--checkpoint", where, np=2)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "stampede-manifest.json" in result.stderr and "prepared" in result.stderr
    with pytest.raises(CheckpointError, match="prepared"):
        scan(f"{url}/sharded/model.safetensors", _options(s3_env))


def test_hdf5_in_s3_is_refused(stampede, s3_env: S3Server, tmp_path: Path,
                               hdf5_dir: Path) -> None:
    url = _upload(s3_env, _tree(hdf5_dir), "existing/hdf5")
    result = stampede("run", str(_job(tmp_path, s3_env, ["files"])), "--checkpoint",
                      f"{url}/model.h5", np=2)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "h5py" in result.stderr and "POSIX" in result.stderr
    with pytest.raises(UsageError, match="h5py reads a file through a POSIX path"):
        scan(url, _options(s3_env))   # a prefix holding HDF5 files


def test_nothing_at_an_s3_url(s3_env: S3Server, published: Path) -> None:
    with pytest.raises(CheckpointError, match="empty, no checkpoint here"):
        scan(f"s3://{s3_env.bucket}/existing/nowhere", _options(s3_env))
    url = _upload(s3_env, {"notes.txt": b"hello", "pytorch_model.bin": b"\0" * 64,
                           "shards/model.safetensors": published}, "existing/other")
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        scan(url, _options(s3_env))
    with pytest.raises(CheckpointError, match="not a checkpoint file"):
        scan(f"{url}/notes.txt", _options(s3_env))
    assert scan(f"{url}/shards", _options(s3_env)).format == "safetensors"
