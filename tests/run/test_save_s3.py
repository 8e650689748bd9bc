"""The save stampede on a real S3 server (SeaweedFS on 127.0.0.1) under a real mpiexec,
through a counting, fault-injecting proxy: every layout saves (multipart uploads or one
PUT per object), publishes, releases old versions, and `run` restores the published one;
the requests per op are the plan's; a 503 or a server that dies mid-save never costs the
published version, and clean leaves the prefix empty (no object, no unfinished upload)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stampede.backends import open_backend
from stampede.backends.s3 import S3Backend
from stampede.launcher import find_mpiexec
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.s3server import FaultProxy, S3Server, request_kind

pytestmark = pytest.mark.mpi
MiB = 2**20
NO_FILE_OPS = {"mkdir", "rename", "fsync_dir", "close", "rmdir", "open"}


@pytest.fixture
def proxy(s3_env: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://")) as running:
        yield running


def s3_job(tmp_path: Path, proxy: FaultProxy, server: S3Server, name: str = "job",
           **sections: dict[str, Any]) -> tuple[Path, str]:
    """A job on a fresh prefix of the bucket, through the proxy; (job, prefix)."""
    prefix = f"save-{uuid.uuid4().hex[:10]}"
    tables: dict[str, dict[str, Any]] = {
        "target": {"path": f"s3://{server.bucket}/{prefix}",
                   "storage_options": {"endpoint_url": proxy.endpoint_url, "max_attempts": 3,
                                       "connect_timeout": 2, "read_timeout": 30}},
        "checkpoint": {"size": "20MiB", "block_size": "1MiB", "layout": ["sharded"]},
        "run": {"iterations": 3, "warmup": 1, "verify": "none"},
        "save": {"part_size": "5MiB"},
        "archive": {"path": str(tmp_path / "results" / f"{name}.csv")},
    }
    for section, table in sections.items():
        tables.setdefault(section, {}).update(table)
    return write_job(tmp_path, name, **tables), prefix


def backend_for(server: S3Server, prefix: str) -> S3Backend:
    backend = open_backend(f"s3://{server.bucket}/{prefix}", {"endpoint_url": server.endpoint_url})
    assert isinstance(backend, S3Backend)
    return backend


def kinds(proxy: FaultProxy, below: str) -> Counter[str]:
    """The requests the proxy saw for objects under `below`, by kind."""
    return Counter(request_kind(method, path) for method, path, _ in proxy.requests
                   if f"/{below}" in path.partition("?")[0])


def unfinished_uploads(server: S3Server, prefix: str) -> list[tuple[str, str]]:
    backend = backend_for(server, prefix)
    uploads, _ = backend._call("", "LIST uploads", backend._uploads_page, f"{prefix}/", "", "")
    return list(uploads)


def ops_of(rows: list[dict[str, str]], layout: str, phase: str) -> dict[str, dict[str, str]]:
    return {row["op"]: row for row in rows if row["layout"] == layout and row["phase"] == phase}


def sidecar(tmp_path: Path, name: str = "job") -> dict[str, Any]:
    paths = sorted((tmp_path / "results" / f"{name}.runs").glob("*.json"))
    return dict(json.loads(paths[-1].read_text()))


def saves_restores_and_cleans(stampede, tmp_path: Path, proxy: FaultProxy, server: S3Server,
                              job: Path, prefix: str, np: int,
                              expected: dict[str, dict[str, int]]) -> None:
    """Save (1 warmup + 3 saves, keep 2), check every layout's requests against
    `expected` (kind -> count over the 4 saves) and its archive rows, restore the
    published version verified, clean: nothing left under the prefix."""
    saved = stampede("save", str(job), np=np)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    backend = backend_for(server, prefix)
    for layout, counts in expected.items():
        seen = kinds(proxy, f"{prefix}/saves/{layout}/")
        assert {kind: seen[kind] for kind in counts} == counts, (layout, seen)
        assert seen["abort"] == 0 and seen["uploads"] == 0
        ops = ops_of(rows, layout, "save")
        assert not NO_FILE_OPS & set(ops), sorted(ops)
        assert all(row["valid"] == "true" and row["errors"] == "0" for row in ops.values())
        assert float(ops["save"]["unprotected_s"]) == 0.0
        # the archive holds 3 of the 4 saves (the warmup left out), each the same requests;
        # every release is in them (saves 3 and 4). write = an UploadPart or a PUT, but the
        # pointer's (publish)
        assert int(ops["write"]["count"]) == (counts["part"] + counts["put"] - 4) * 3 // 4
        assert int(ops["unlink"]["count"]) == counts["delete"]
        assert int(ops["publish"]["count"]) == 3 and int(ops["published"]["count"]) == 3
        if counts["create"]:
            assert int(ops["create"]["count"]) == counts["create"] * 3 // 4
            assert int(ops["fsync"]["count"]) == counts["complete"] * 3 // 4
        else:   # one PUT: nothing reaches the server before it, and its answer is durability
            assert "create" not in ops and "fsync" not in ops
        names = backend.names(f"saves/{layout}")
        assert f"saves/{layout}/latest" in names
        assert {name.split("/")[2] for name in names} == {"latest", "v000003", "v000004"}
        assert backend.get_bytes(f"saves/{layout}/latest") == b"v000004\n"
    restored = stampede("run", str(job), "--set", "run.verify=xxh3", "--set", "run.rank_shift=1",
                        np=np)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    for layout in expected:
        restore = ops_of(rows, layout, "restore")["restore"]
        assert restore["valid"] == "true" and restore["restored_from"] == f"saves/{layout}/v000004"
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert backend.names() == [] and unfinished_uploads(server, prefix) == []


def test_shared_sharded_fanout_metadata_first_save_in_parts(stampede, tmp_path: Path,
                                                            s3_env: S3Server,
                                                            proxy: FaultProxy) -> None:
    """2 ranks, 10 MiB shards in 5 MiB parts, safetensors (part 1 carries the header)."""
    job, prefix = s3_job(tmp_path, proxy, s3_env, checkpoint={
        "layout": ["shared", "sharded", "fan-out", "metadata-first"], "format": "safetensors"},
        save={"validate": "sha256"})
    # per save: shared = 1 object of 4 parts (rank 0 creates and completes it, each rank
    # uploads its 2); the others 2 objects of 2 parts; metadata-first + its index, one PUT;
    # every layout + its pointer, one PUT. 4 saves; keep 2 releases v1 and v2.
    sharded = {"create": 8, "part": 16, "complete": 8, "put": 4, "delete": 4}
    saves_restores_and_cleans(stampede, tmp_path, proxy, s3_env, job, prefix, 2, {
        "shared": {"create": 4, "part": 16, "complete": 4, "put": 4, "delete": 2},
        "sharded": sharded, "fan-out": sharded,
        "metadata-first": {**sharded, "put": 8, "delete": 6}})


def test_replicated_and_striped_save_in_parts(stampede, tmp_path: Path, s3_env: S3Server,
                                              proxy: FaultProxy) -> None:
    """4 ranks, 2 replicas: replicated's replica 0 writes each shard; striped's 2 replicas
    write 5 MiB each of one upload (replica 0 creates and completes it)."""
    job, prefix = s3_job(tmp_path, proxy, s3_env, checkpoint={
        "layout": ["replicated", "striped"], "replicas": 2})
    saves_restores_and_cleans(stampede, tmp_path, proxy, s3_env, job, prefix, 4, {
        "replicated": {"create": 8, "part": 16, "complete": 8, "put": 4, "delete": 4},
        "striped": {"create": 8, "part": 16, "complete": 8, "put": 4, "delete": 4}})


def test_one_put_per_object_without_a_part_size_async(stampede, tmp_path: Path,
                                                      s3_env: S3Server,
                                                      proxy: FaultProxy) -> None:
    """Async: the shard copied to staging (snapshot), then the PUTs from the copy. Stripes
    asked of an object store are not applied, and each save's rows warn so."""
    job, prefix = s3_job(tmp_path, proxy, s3_env, checkpoint={
        "size": "8MiB", "layout": ["sharded", "metadata-first"]},
        save={"part_size": "", "mode": "async"}, target={"stripe_count": 2})
    saves_restores_and_cleans(stampede, tmp_path, proxy, s3_env, job, prefix, 2, {
        "sharded": {"create": 0, "part": 0, "complete": 0, "put": 12, "delete": 4},
        "metadata-first": {"create": 0, "part": 0, "complete": 0, "put": 16, "delete": 6}})
    ops = ops_of(read_archive(tmp_path / "results" / "job.csv"), "sharded", "save")
    assert int(ops["snapshot"]["op_bytes"]) == 3 * 8 * MiB
    assert ("target.stripe_* (stripe_count=2, stripe_size=default) not applied: the s3 "
            "backend does not stripe") in ops["save"]["warnings"], ops["save"]["warnings"]
    # every rank's blocked time is within its own save (causality, as in test_save.py)
    for column in ("lat_min_s", "lat_p50_s", "lat_max_s"):
        assert float(ops["blocked"][column]) <= float(ops["save"][column]), column


def said(result: Any) -> str:
    """What a command printed, its lines unwrapped (the report wraps at its width)."""
    return " ".join((result.stdout + result.stderr).split())


def one_save_job(tmp_path: Path, proxy: FaultProxy, server: S3Server) -> tuple[Path, str]:
    """One 2-rank sharded save per command (10 MiB shards, 2 parts each), keep 1."""
    return s3_job(tmp_path, proxy, server, run={"iterations": 1, "warmup": 0},
                  save={"keep": 1}, target={"storage_options": {
                      "endpoint_url": proxy.endpoint_url, "max_attempts": 2,
                      "connect_timeout": 2, "read_timeout": 30}})


def journal_states(server: S3Server, prefix: str) -> dict[int, str]:
    text = backend_for(server, prefix).get_bytes("stampede-saves.json")
    assert text is not None
    return {entry["version"]: entry["state"]
            for entry in json.loads(text)["layouts"]["sharded"]["versions"]}


def restores(stampede, job: Path, version: str) -> None:
    restored = stampede("run", str(job), "--set", "run.verify=xxh3", np=2)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    restore = ops_of(read_archive(job.parent / "results" / "job.csv"), "sharded",
                     "restore")["restore"]
    assert restore["valid"] == "true" and restore["restored_from"] == f"saves/sharded/{version}"


def test_a_503_mid_save_aborts_its_uploads_and_keeps_the_published_version(
        stampede, tmp_path: Path, s3_env: S3Server, proxy: FaultProxy) -> None:
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    assert stampede("save", str(job), np=2).returncode == 0
    proxy.clear()
    # rank 1's second part answered 503 SlowDown twice: its one retry fails too
    proxy.fail_next(2, matching="/v000002/sharded/shard-00001-of-00002.raw?partNumber=2&")
    failed = stampede("save", str(job), np=2)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert ("rank 1: write saves/sharded/v000002/sharded/shard-00001-of-00002.raw part 2: "
            "throttled: S3 PUT part 503 SlowDown after 2 attempts on s3://") in said(failed)
    assert "v000002 not published; v000001 stays published" in said(failed)
    assert "Traceback" not in failed.stderr
    seen = kinds(proxy, f"{prefix}/saves/sharded/v000002/")
    # rank 0 completed its own object (a version's objects are written apart; it is the
    # publish that is all or nothing); rank 1's upload was aborted, no part of it stays
    assert seen["create"] == 2 and seen["complete"] == 1 and seen["abort"] == 1
    assert unfinished_uploads(s3_env, prefix) == []
    assert [name for name in backend_for(s3_env, prefix).names() if "v000002" in name] == [
        "saves/sharded/v000002/sharded/shard-00000-of-00002.raw"]
    assert backend_for(s3_env, prefix).get_bytes("saves/sharded/latest") == b"v000001\n"
    assert journal_states(s3_env, prefix) == {1: "complete", 2: "invalid"}
    rows = [row for row in read_archive(tmp_path / "results" / "job.csv")
            if row["phase"] == "save"]
    last = {row["op"]: row for row in rows if row["run_id"] == rows[-1]["run_id"]}
    assert last["write"]["errors"] == "1" and last["save"]["valid"] == "false"
    assert last["published"]["count"] == "0" and "publish" not in last
    assert sidecar(tmp_path)["saves"]["sharded"]["retries"] == {"write": 1}
    restores(stampede, job, "v000001")
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert backend_for(s3_env, prefix).names() == []


def test_retried_save_requests_are_counted_per_op_and_the_save_stays_valid(
        stampede, tmp_path: Path, s3_env: S3Server, proxy: FaultProxy) -> None:
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    assert stampede("save", str(job), np=2).returncode == 0
    base = f"/{s3_env.bucket}/{prefix}/saves/sharded"
    for matching in ("?uploads=", "?partNumber=1&", ".raw?uploadId=", f"PUT {base}/latest",
                     f"DELETE {base}/v000001/"):
        proxy.fail_next(1, matching=matching)   # each once: its retry succeeds
    saved = stampede("save", str(job), np=2)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert sidecar(tmp_path)["saves"]["sharded"]["retries"] == {
        "create": 1, "write": 1, "fsync": 1, "publish": 1, "unlink": 1}
    assert backend_for(s3_env, prefix).get_bytes("saves/sharded/latest") == b"v000002\n"
    assert stampede("clean", str(job)).returncode == 0


@pytest.mark.parametrize("answers", [1, 2])
def test_a_complete_answered_200_with_an_error_is_a_failure_retried_then_reported(
        stampede, tmp_path: Path, s3_env: S3Server, proxy: FaultProxy, answers: int) -> None:
    """S3 may answer CompleteMultipartUpload 200 OK and say InternalError in the body: the
    object then does not exist. Once: retried, the save valid. Twice (max_attempts 2): the
    version is not published, the upload aborted, the previous version stays."""
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    assert stampede("save", str(job), np=2).returncode == 0
    shard = "saves/sharded/v000002/sharded/shard-00001-of-00002.raw"
    proxy.fail_next(answers, matching=f"POST /{s3_env.bucket}/{prefix}/{shard}?uploadId=",
                    status=200)
    saved = stampede("save", str(job), np=2)
    backend = backend_for(s3_env, prefix)
    if answers == 1:
        assert saved.returncode == 0, saved.stdout + saved.stderr
        assert sidecar(tmp_path)["saves"]["sharded"]["retries"] == {"fsync": 1}
        assert backend.get_bytes("saves/sharded/latest") == b"v000002\n"
    else:
        assert saved.returncode == 1, saved.stdout + saved.stderr
        assert (f"rank 1: fsync {shard} (completing its upload): S3 POST complete 200 "
                "InternalError after 1 retries") in said(saved)
        assert "v000002 not published; v000001 stays published" in said(saved)
        assert "Traceback" not in saved.stderr
        assert backend.get_bytes("saves/sharded/latest") == b"v000001\n"
        assert shard not in backend.names() and unfinished_uploads(s3_env, prefix) == []
        assert journal_states(s3_env, prefix) == {1: "complete", 2: "invalid"}
        restores(stampede, job, "v000001")
    assert stampede("clean", str(job)).returncode == 0
    assert backend.names() == []


def test_a_server_that_dies_mid_save_leaves_the_published_version_and_clean_aborts_the_rest(
        stampede, tmp_path: Path, s3_env: S3Server, proxy: FaultProxy) -> None:
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    assert stampede("save", str(job), np=2).returncode == 0
    proxy.die_at("?partNumber=2&")   # every connection closed from the first second part on
    failed = stampede("save", str(job), np=2)
    proxy.clear()                     # the server is back, with what it had stored
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "part 2: S3 PUT part: connection closed by the server after 1 retries" in said(failed)
    assert "v000002 not published, the pointer untouched; its journal entry not updated" in \
        said(failed)
    assert "save finished with errors, archived as invalid" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert backend_for(s3_env, prefix).get_bytes("saves/sharded/latest") == b"v000001\n"
    assert journal_states(s3_env, prefix) == {1: "complete", 2: "writing"}
    assert len(unfinished_uploads(s3_env, prefix)) == 2   # the aborts could not reach it
    restores(stampede, job, "v000001")
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    # v1's 2 objects, the pointer, the journal, and v2's 2 unfinished uploads, aborted
    assert "removed 6 path(s)" in cleaned.stdout
    assert backend_for(s3_env, prefix).names() == [] and unfinished_uploads(s3_env, prefix) == []


def test_a_rank_killed_mid_save_leaves_the_published_version_and_clean_aborts_its_upload(
        tmp_path: Path, s3_env: S3Server, proxy: FaultProxy, stampede) -> None:
    """SIGKILL of a rank while rank 1's upload is in flight (the proxy holds rank 1's
    second part, and every request after it; the rank killed is either): the job ends, no
    hang; the pointer, the journal's
    last word and the archive stay as they were; clean aborts what the dead ranks left."""
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    assert stampede("save", str(job), np=2).returncode == 0
    archived = read_archive(tmp_path / "results" / "job.csv")
    held = "/v000002/sharded/shard-00001-of-00002.raw?partNumber=2&"
    proxy.stall_at(held)
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    command = [mpiexec, "-n", "2", sys.executable, "-m", "stampede", "save", str(job)]
    running = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not any(held in path for _, path, _ in list(proxy.requests)):
            assert running.poll() is None and time.monotonic() < deadline, \
                running.communicate(timeout=60)
            time.sleep(0.01)
        ranks = [int(pid) for pid in subprocess.run(
            ["pgrep", "-f", "--", f"-m stampede save {job}"], capture_output=True,
            text=True).stdout.split() if int(pid) != running.pid]
        assert len(ranks) == 2, ranks
        os.kill(max(ranks), signal.SIGKILL)
        running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
        proxy.clear()   # the server answers again, with what it had stored
    assert running.returncode != 0
    backend = backend_for(s3_env, prefix)
    assert backend.get_bytes("saves/sharded/latest") == b"v000001\n"
    assert journal_states(s3_env, prefix) == {1: "complete", 2: "writing"}
    assert read_archive(tmp_path / "results" / "job.csv") == archived
    assert unfinished_uploads(s3_env, prefix)   # rank 1's at least: its part 2 never landed
    restores(stampede, job, "v000001")
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert backend.names() == [] and unfinished_uploads(s3_env, prefix) == []


@pytest.mark.parametrize(("np", "sections", "says"), [
    (2, {"checkpoint": {"layout": ["shared"]}, "save": {"part_size": ""}},
     "several ranks write one object, which takes a multipart upload (save.part_size); at 2 "
     "ranks its slices start every 10485760 bytes"),
    (2, {"checkpoint": {"layout": ["shared"], "size": "24MiB"}},
     'slices that start on parts of save.part_size = 5242880 bytes; at 2 ranks its slices start '
     'every 12582912 bytes hint: save.part_size = "12582912"'),
    (4, {"checkpoint": {"layout": ["striped"], "replicas": 2, "size": "24MiB"}},
     "stripes that start on parts of save.part_size = 5242880 bytes"),
    (2, {"save": {"durability": "none"}}, "an object store has no buffered write"),
    (2, {"save": {"mkdir": "every"}}, "an object store has no directories to make"),
    (2, {"save": {"part_size": "6GiB"}}, "S3 takes parts of at most 5 GiB"),
])
def test_save_on_s3_refuses_before_any_request(stampede, tmp_path: Path, s3_env: S3Server,
                                               proxy: FaultProxy, np: int,
                                               sections: dict[str, dict[str, Any]],
                                               says: str) -> None:
    job, _ = s3_job(tmp_path, proxy, s3_env, **sections)
    refused = stampede("save", str(job), np=np)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert says in " ".join(refused.stderr.split()) and "Traceback" not in refused.stderr
    assert proxy.requests == []


def test_a_writer_that_published_meanwhile_wins_and_is_never_overwritten(
        stampede, tmp_path: Path, s3_env: S3Server, proxy: FaultProxy) -> None:
    """The publish is a conditional PUT of the pointer (If-Match: its ETag when the
    version began): another writer's pointer, PUT to the real server just before this
    save's publish reaches it, makes the publish fail 412, the other writer's pointer
    stays, and this version is not published (one line, exit 1). A first save, with no
    pointer yet, publishes with If-None-Match: *."""
    job, prefix = one_save_job(tmp_path, proxy, s3_env)
    first = stampede("save", str(job), np=2)
    assert first.returncode == 0, first.stdout + first.stderr
    store = backend_for(s3_env, prefix)
    assert store.get_bytes("saves/sharded/latest") == b"v000001\n"
    proxy.clear()
    theirs = b"v000007\n"   # the other writer's own version (same bytes: the same ETag)
    proxy.before_next(f"PUT /{s3_env.bucket}/{prefix}/saves/sharded/latest",
                      lambda: backend_for(s3_env, prefix).put_bytes("saves/sharded/latest", theirs))
    lost = stampede("save", str(job), np=2)
    assert lost.returncode == 1, lost.stdout + lost.stderr
    assert ("rank 0: publish saves/sharded/latest: File exists: S3 PUT 412 PreconditionFailed: "
            "another writer wrote it first") in said(lost)
    assert "v000002 not published" in said(lost) and "Traceback" not in lost.stderr
    assert store.get_bytes("saves/sharded/latest") == theirs
    puts = [path for method, path, _ in proxy.requests
            if method == "PUT" and path.endswith("/saves/sharded/latest")]
    assert len(puts) == 1   # a 412 is not retried
    assert journal_states(s3_env, prefix)[2] == "invalid"
    store.put_bytes("saves/sharded/latest", b"v000001\n")   # the other writer's gone
    assert stampede("clean", str(job)).returncode == 0
