"""`project`'s request-rate model on rows from real runs: `mpiexec stampede run` restores
through `stampede emulate-s3` (in front of the suite's SeaweedFS) at a rate that binds, and
the archive's rows, read back as requests (stampede.model.prefix_rate.run_loads), say what
the emulator's log counted: requests per rank and partition, 503s. The fit reproduces the
503s it was fitted to; `project --preset` prints the table at 16,384 ranks and refuses bad
flags before reading anything. Counts only: no timing asserts."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stampede.backends.s3retry import RetryPolicy
from stampede.emulate.s3front import read_log
from stampede.model.prefix_rate import Limit, Observed, fit_read_rate, predict, run_loads
from stampede.results.archived import Archive
from tests.helpers.jobs import write_job
from tests.helpers.s3server import S3Server
from tests.helpers.throttling import emulator

NP = 4
COPIES = 2
PASSES = 3               # warmup 1 + iterations 2
READS_PER_RANK = 6       # a HEAD for stat, one for open, 4 ranged GETs (1 MiB in 256 KiB)
BURST = 4
ATTEMPTS = 10            # enough that no request fails
Launch = Callable[..., subprocess.CompletedProcess[str]]


def _job(tmp_path: Path, server: S3Server, endpoint: str) -> Path:
    return write_job(tmp_path, "fit", target={
        "path": f"s3://{server.bucket}/fit",
        "storage_options": {"endpoint_url": endpoint, "max_attempts": ATTEMPTS}},
        checkpoint={"size": "4MiB", "layout": ["sharded"], "block_size": "256KiB",
                    "format": "raw", "copies": COPIES},
        pattern={"ops": ["stat", "open", "read", "close"]},
        run={"iterations": PASSES - 1, "warmup": 1, "verify": "none"},
        archive={"path": str(tmp_path / "results" / "fit.csv")})


@pytest.mark.mpi
def test_the_rows_of_a_throttled_restore_are_its_requests_and_the_fit_their_503s(
        stampede: Launch, s3_env: S3Server, tmp_path: Path) -> None:
    bucket = s3_env.bucket
    prepared = stampede("prepare", str(_job(tmp_path, s3_env, s3_env.endpoint_url)), np=NP)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    log = tmp_path / "requests.jsonl"
    # each copy's prefix a partition of its own (the model's busiest: ranks 0 and 2), at
    # 20 reads a second, burst 4: 4 ranks' requests meet 503s
    with emulator(s3_env, log, "--get-rate", "20", "--burst", str(BURST), "--list-rate",
                  "100000", "--put-rate", "100000", "--split-delay-s", "inf",
                  "--partitioned", f"{bucket}/fit/copy-") as endpoint:
        job = _job(tmp_path, s3_env, endpoint)
        run = stampede("run", str(job), np=NP)
        assert run.returncode == 0, run.stdout + run.stderr
    shards = [request for request in read_log(str(log))
              if re.fullmatch(r"fit/copy-\d/sharded/shard-\d{5}-of-\d{5}\.raw", request.key)]
    admitted = Counter(r.partition for r in shards if r.status < 300)
    refused = Counter(r.partition for r in shards if r.status == 503)
    assert set(admitted) == {f"{bucket}/fit/copy-0", f"{bucket}/fit/copy-1"}
    assert sum(refused.values()) > 0, Counter(r.status for r in shards)

    (found,) = run_loads(Archive.open(str(tmp_path / "results" / "fit.csv")).rows)
    assert (found.nranks, found.passes, found.copies, found.listers) == (NP, PASSES, COPIES, 0)
    assert found.reads_per_rank == READS_PER_RANK
    # the archive's 503s are the log's, every one
    assert found.throttles == sum(refused.values())
    # the model's busiest partition is a copy's: its ranks' requests, as the log served
    load = found.load()
    assert (load.ranks, load.reads_per_rank, load.passes) == (NP // COPIES, READS_PER_RANK,
                                                              PASSES)
    assert admitted == {partition: load.requests for partition in admitted}

    # the fit: the rate whose simulation gives the 503s the busiest partition counted
    def policy() -> RetryPolicy:
        return RetryPolicy("standard", ATTEMPTS)

    busiest = max(refused.values())
    rate = fit_read_rate([Observed(load, busiest)], BURST, policy)
    again = predict(load, Limit(rate, rate, BURST), policy).throttles * PASSES
    assert again == pytest.approx(busiest, rel=0.25, abs=2)

    # project at 16,384 ranks: the fitted rate and the presets, one line per layout and keys
    archive = str(tmp_path / "results" / "fit.csv")
    shown = stampede("project", archive, "--target-ranks", "16384", "--preset",
                     "s3-standard,s3-express,gcs", "--prefix-rate", "read=5500,burst=100",
                     env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    assert "request rates at 16,384 ranks" in text
    assert "--prefix-rate: 5.5k reads/s and 5.5k LISTs/s per prefix, burst 100" in text
    for rates in ("fitted", "--prefix-rate", "S3 Standard", "S3 Express One Zone", "GCS"):
        assert re.search(rf"{rates} +sharded +1 (prefix|bucket)", text), text
    assert re.search(r"S3 Standard +sharded +2 copies +8,192", text), text
    assert re.search(r"S3 Standard +sharded +hashed +1 ", text), text
    stampede("clean", str(_job(tmp_path, s3_env, s3_env.endpoint_url)))


SAVE_NP = 2
SAVE_WRITES_PER_RANK = 4   # a 10 MiB shard in 5 MiB parts: CreateMultipartUpload, 2 parts, Complete
SAVE_READS_PER_RANK = 11   # its validation: a HEAD and 10 GETs of 1 MiB


def _save_job(tmp_path: Path, server: S3Server, endpoint: str) -> Path:
    return write_job(tmp_path, "sv", target={
        "path": f"s3://{server.bucket}/sv",
        "storage_options": {"endpoint_url": endpoint, "max_attempts": ATTEMPTS}},
        checkpoint={"size": "20MiB", "layout": ["sharded"], "block_size": "1MiB",
                    "format": "raw"},
        run={"iterations": PASSES - 1, "warmup": 1, "verify": "none"},
        save={"part_size": "5MiB", "keep": 2},
        archive={"path": str(tmp_path / "results" / "sv.csv")})


@pytest.mark.mpi
def test_a_throttled_saves_rows_are_its_writes_and_project_phase_save_counts_them(
        stampede: Launch, s3_env: S3Server, tmp_path: Path) -> None:
    bucket = s3_env.bucket
    log = tmp_path / "requests.jsonl"
    # the layout's saves a partition of their own (sv/saves/s...), at 4 writes a second,
    # burst 4: 2 ranks' uploads meet 503s; reads and LISTs roomy
    with emulator(s3_env, log, "--put-rate", "4", "--burst", str(BURST), "--get-rate",
                  "100000", "--list-rate", "100000", "--split-delay-s", "inf",
                  "--partitioned", f"{bucket}/sv/saves/") as endpoint:
        saved = stampede("save", str(_save_job(tmp_path, s3_env, endpoint)), np=SAVE_NP)
        assert saved.returncode == 0, saved.stdout + saved.stderr
    under = [r for r in read_log(str(log)) if r.key.startswith("sv/saves/sharded/")]
    assert {r.partition for r in under} == {f"{bucket}/sv/saves/s"}
    shards = [r for r in under if re.fullmatch(r"sv/saves/sharded/v\d{6}/sharded/"
                                               r"shard-\d{5}-of-\d{5}\.raw", r.key)]
    served = Counter((r.kind, r.method) for r in shards if r.status < 300)
    refused = sum(r.status == 503 for r in under)
    assert refused > 0, Counter(r.status for r in under)
    uploads = served["write", "POST"] + served["write", "PUT"]
    assert uploads == SAVE_WRITES_PER_RANK * SAVE_NP * PASSES
    assert served["read", "HEAD"] + served["read", "GET"] == \
        SAVE_READS_PER_RANK * SAVE_NP * PASSES
    publishes = [r for r in under if r.key == "sv/saves/sharded/latest" and r.method == "PUT"
                 and r.status < 300]
    assert len(publishes) == PASSES

    archive = str(tmp_path / "results" / "sv.csv")
    (found,) = run_loads(Archive.open(archive).rows, "save")
    assert (found.nranks, found.passes, found.publishes) == (SAVE_NP, PASSES, 1)
    assert (found.writes_per_rank, found.reads_per_rank) == (SAVE_WRITES_PER_RANK,
                                                              SAVE_READS_PER_RANK)
    # the archive's 503s and DELETEs are the log's, every one
    assert found.throttles == refused
    deletes = served["write", "DELETE"]
    assert found.deletes_per_rank * SAVE_NP * (PASSES - 1) == deletes > 0
    assert run_loads(Archive.open(archive).rows) == []   # no restore in it

    def policy() -> RetryPolicy:
        return RetryPolicy("standard", ATTEMPTS)

    rate = fit_read_rate([found.observed(policy)], BURST, policy)
    again = predict(found.load(), Limit(rate, rate, BURST), policy).throttles * PASSES
    assert again == pytest.approx(refused, rel=0.25, abs=2)

    shown = stampede("project", archive, "--phase", "save", "--target-ranks", "16384",
                     "--preset", "s3-standard", "--prefix-rate", "read=5500,write=3500,burst=100",
                     "--prefix-burst", str(BURST),
                     env={"COLUMNS": "220"})
    assert shown.returncode == 0, shown.stdout + shown.stderr
    text = " ".join(shown.stdout.split())
    print(text)
    assert "request rates at 16,384 ranks, each saving as archived in its run's parts" in text
    assert "fitted: " in text and f"the archive's 503s (sharded {SAVE_NP}: {refused})" in text
    assert "--prefix-rate: 5.5k reads/s, 3.5k writes/s and 5.5k LISTs/s per prefix" in text
    # each rank's uploads and validation as the log counted them; the partition's publish
    # and its ranks' DELETEs (as many a rank as the run's)
    lone = 1 + round(deletes / (SAVE_NP * (PASSES - 1)) * 16_384)
    per_rank = f"{SAVE_WRITES_PER_RANK}w {SAVE_READS_PER_RANK}r"
    for rates in ("fitted", "--prefix-rate", "S3 Standard"):
        assert re.search(rf"{rates} +sharded +1 prefix +16,384 +{per_rank} \+{lone:,}w ",
                         text), text
        assert re.search(rf"{rates} +sharded +hashed +1 +{per_rank} ", text), text
    stampede("clean", str(_save_job(tmp_path, s3_env, s3_env.endpoint_url)))


@pytest.mark.parametrize(("flags", "said"), [
    (("--preset", "s3-standrd"), "--preset 's3-standrd': 's3-standrd' is not a preset"),
    (("--prefix-rate", "read=fast"), "--prefix-rate 'read=fast': 'read=fast' is not valid"),
    (("--prefix-rate", "list=10"), "--prefix-rate 'list=10': no read rate"),
    (("--prefix-rate", "read=10,burst=0.5"), "'burst=0.5' is not valid"),
    (("--phase", "save", "--prefix-rate", "read=10,write=0"), "'write=0' is not valid"),
    (("--phase", "save", "--prefix-rate", "read=10,write=1,write=2"), "'write=2' is not valid"),
    (("--target-mttr", "soon"), "--target-mttr:"),
])
def test_bad_prefix_rate_flags_are_one_line_and_exit_2_before_the_archive_is_read(
        stampede: Launch, tmp_path: Path, flags: tuple[str, ...], said: str) -> None:
    missing = tmp_path / "absent.csv"   # never opened: the flags are checked first
    result = stampede("project", str(missing), "--target-ranks", "16384", *flags)
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr, result.stderr
    assert "absent.csv" not in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
