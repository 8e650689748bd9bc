"""`stampede emulate-s3` in front of a real S3 server (the suite's SeaweedFS): signed
requests pass through it unchanged, beyond its rates it answers S3's 503 SlowDown, and a
real `mpiexec stampede run` through it retries and counts them, or fails named as
throttling. Counts, floors and messages only: no timing asserts."""

from __future__ import annotations

import http.client
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.emulate.s3front import read_log
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.s3server import S3Server
from tests.helpers.throttling import emulator


def _backend(server: S3Server, endpoint: str, prefix: str, **options: object):  # noqa: ANN202
    return open_backend(f"s3://{server.bucket}/{prefix}",
                        {"endpoint_url": endpoint, **options})


def test_signed_requests_pass_and_a_burst_gets_slow_down(s3_env: S3Server,
                                                         tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    # a token every 1,000 s: nothing refills while the test runs, however slow the machine
    with emulator(s3_env, log, "--get-rate", "0.001", "--burst", "3",
                  "--split-delay-s", "inf") as endpoint:
        backend = _backend(s3_env, endpoint, "front", max_attempts=1)
        backend.put_bytes("object.bin", b"x" * 3_000_000)     # forwarded, streamed, signed
        assert backend.size("object.bin") == 3_000_000        # HEAD: the 1st read token
        assert backend.get_bytes("object.bin") == b"x" * 3_000_000   # 2nd
        assert backend.get_bytes("object.bin") is not None    # 3rd: the burst is spent
        with pytest.raises(OSError) as raised:
            backend.get_bytes("object.bin")
        assert str(raised.value) == (f"throttled: S3 GET 503 SlowDown after 1 attempt on "
                                     f"s3://{s3_env.bucket}/front/object.bin")
        # S3's answer, as a client without stampede's sees it
        host, port = endpoint.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", f"/{s3_env.bucket}/front/object.bin")
        response = connection.getresponse()
        body = response.read().decode()
        connection.close()
        assert response.status == 503 and int(response.getheader("Retry-After", "0")) > 900
        assert "<Code>SlowDown</Code><Message>Please reduce your request rate.</Message>" in body
    requests = read_log(str(log))
    assert [(r.method, r.kind, r.status) for r in requests] == [
        ("PUT", "write", 200), ("HEAD", "read", 200), ("GET", "read", 200),
        ("GET", "read", 200), ("GET", "read", 503), ("GET", "read", 503)]
    assert {r.partition for r in requests} == {f"{s3_env.bucket}/"}
    assert requests[0].key == "front/object.bin"


def _job(tmp_path: Path, name: str, server: S3Server, endpoint: str, **options: object) -> Path:
    return write_job(tmp_path, name, target={
        "path": f"s3://{server.bucket}/throttled",
        "storage_options": {"endpoint_url": endpoint, **options}},
        checkpoint={"size": "2MiB", "layout": "sharded", "block_size": "1MiB",
                    "format": "raw"},
        run={"iterations": 2, "warmup": 1, "verify": "none"},
        archive={"path": str(tmp_path / "results" / f"{name}.csv")})


@pytest.mark.mpi
def test_a_run_through_the_front_retries_its_503s_or_fails_named(
        stampede: Callable[..., subprocess.CompletedProcess[str]], s3_env: S3Server,
        tmp_path: Path) -> None:
    prepared = _job(tmp_path, "direct", s3_env, s3_env.endpoint_url)
    assert stampede("prepare", str(prepared), np=2).returncode == 0   # not throttled
    log = tmp_path / "requests.jsonl"
    # 5 reads a second in all, burst 2: 2 ranks asking HEAD, HEAD, GET per iteration on loopback
    # ask faster than that on any machine, so 503s come whatever its speed
    with emulator(s3_env, log, "--get-rate", "5", "--burst", "2",
                  "--split-delay-s", "inf") as endpoint:
        patient = _job(tmp_path, "patient", s3_env, endpoint, max_attempts=20)
        run = stampede("run", str(patient), np=2)
        assert run.returncode == 0, run.stdout + run.stderr
        adaptive = _job(tmp_path, "adaptive", s3_env, endpoint, max_attempts=20,
                        retry_mode="adaptive")
        slowed = stampede("run", str(adaptive), np=2)
        assert slowed.returncode == 0, slowed.stdout + slowed.stderr
        hasty = _job(tmp_path, "hasty", s3_env, endpoint, max_attempts=1)
        failed = stampede("run", str(hasty), np=2)
    statuses = Counter(r.status for r in read_log(str(log)))
    # 503s from the front, and no other server error (502: a forward that failed)
    assert statuses[503] > 0 and not {s for s in statuses if s >= 500} - {503}, statuses
    rows = read_archive(tmp_path / "results" / "patient.csv")
    retried = sum(int(row["retries"]) for row in rows if row["retries"])
    # every retry the archive counts is a 503 the front logged (the patient run's; the
    # untimed requests' retries are counted nowhere)
    assert 0 < retried <= statuses[503]
    # each retry here followed a 503 (nothing else fails on loopback): the throttling
    # answers counted cover the retries, and a wait came before each retry
    throttled = sum(int(row["throttles"]) for row in rows if row["throttles"])
    assert retried <= throttled <= statuses[503], (retried, throttled)
    waited = [float(row["backoff_s"]) for row in rows if row["retries"] not in ("", "0")]
    assert waited and all(seconds > 0 for seconds in waited), waited
    for layout in {row["layout"] for row in rows}:   # said where the report shows warnings
        mine = [row for row in rows if row["layout"] == layout]
        answers = sum(int(row["throttles"]) for row in mine if row["throttles"])
        assert all((f"throttled: {answers} throttling answer(s)" in row["warnings"])
                   == (answers > 0) for row in mine), mine
    assert all(row["valid"] == "true" for row in rows)
    # the adaptive run: its mode recorded where the sidecar describes the client
    sidecars = list((tmp_path / "results" / "adaptive.runs").glob("*.json"))
    assert len(sidecars) == 1 and '"mode": "adaptive"' in sidecars[0].read_text()
    assert '"from": "storage_options"' in sidecars[0].read_text()
    # no retries allowed: the first 503 ends the run, named as throttling, not as missing
    assert failed.returncode == 1, failed.stdout + failed.stderr
    said = " ".join((failed.stdout + failed.stderr).split())
    # whichever request met the 503 first: the root's read of the manifest (after the
    # lock's requests), or a rank's of its shard (a HEAD's has no body to name SlowDown)
    shard = r"sharded/shard-0000\d-of-00002\.raw"
    assert re.search(rf"rank \d: (stat|open|read) {shard}: throttled: S3 (HEAD 503 Service "
                     rf"Unavailable|GET 503 SlowDown) after 1 attempt on s3://{s3_env.bucket}/"
                     rf"throttled/{shard}", said) or \
        f"error: checking the checkpoint: s3://{s3_env.bucket}/throttled/stampede-manifest" \
        f".json: cannot read the manifest (throttled: S3 GET 503 SlowDown after 1 attempt " \
        f"on s3://{s3_env.bucket}/throttled/stampede-manifest.json)" in said, said
    assert "No such file" not in said and "missing" not in said
    stampede("clean", str(prepared))


@pytest.mark.parametrize(("flags", "said"), [
    (["--host", "localhost"], "--host 'localhost': must be an IPv4 address"),
    (["--get-rate", "0"], "--get-rate 0.0: must be a finite number > 0"),
    (["--upstream", "https://127.0.0.1:1"], "must be http://HOST:PORT"),
])
def test_bad_flags_are_one_line_before_anything_listens(flags: list[str], said: str) -> None:
    import sys

    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-s3", "--upstream",
                             "http://127.0.0.1:1", *flags], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("stampede emulate-s3: error: ") and said in result.stderr
    assert result.stderr.count("error:") == 1
