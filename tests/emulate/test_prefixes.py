"""Layouts that spread an object store's requests, through `stampede emulate-s3` in front of
the suite's SeaweedFS, under real `mpiexec stampede run`: K copies halve each partition's
requests, hashed keys meet several partitions, list-first lists on every rank and
list-bcast once. Counts and partitions from the emulator's request log; no timing asserts."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stampede.checkpoint.prefix_requests import restore_requests
from stampede.emulate.s3front import Request, read_log
from stampede.spec import build_job
from tests.helpers.jobs import write_job
from tests.helpers.s3server import S3Server
from tests.helpers.throttling import emulator

NP = 4
PASSES = 3          # run.warmup + run.iterations: each rank's restores
ROOMY = ("--get-rate", "100000", "--put-rate", "100000", "--list-rate", "100000",
         "--split-delay-s", "inf")   # no 503: every request counted once
Launch = Callable[..., subprocess.CompletedProcess[str]]


def _job(tmp_path: Path, name: str, server: S3Server, endpoint: str,
         layouts: list[str], **checkpoint: object) -> Path:
    return write_job(tmp_path, name, target={
        "path": f"s3://{server.bucket}/{name}",
        "storage_options": {"endpoint_url": endpoint, "max_attempts": 2}},
        checkpoint={"size": "2MiB", "layout": layouts, "block_size": "256KiB",
                    "format": "raw", **checkpoint},
        run={"iterations": PASSES - 1, "warmup": 1, "verify": "xxh3"},
        archive={"path": str(tmp_path / "results" / f"{name}.csv")})


def _checkpoint_reads(requests: list[Request], name: str) -> Counter[str]:
    """GETs and HEADs of a target's checkpoint objects (not its manifest or lock) by
    partition: the restore's own requests."""
    return Counter(r.partition for r in requests if r.kind == "read" and r.status < 300
                   and r.key.startswith(f"{name}/")
                   and re.search(r"/(shared|sharded)/", r.key))


def _prepare(stampede: Launch, job: Path) -> None:
    done = stampede("prepare", str(job), np=NP)   # straight to SeaweedFS: not counted
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.mpi
def test_copies_halve_each_partitions_requests_and_hashed_keys_spread(
        stampede: Launch, s3_env: S3Server, tmp_path: Path) -> None:
    bucket, direct = s3_env.bucket, s3_env.endpoint_url
    layouts = ["shared", "sharded"]
    for name, options in (("one", {}), ("two", {"copies": 2}),
                          ("hashed", {"key_prefix": "hash"})):
        _prepare(stampede, _job(tmp_path, name, s3_env, direct,
                                ["sharded"] if name == "hashed" else layouts, **options))
    log = tmp_path / "requests.jsonl"
    # every prefix partitioned ahead: the partition of a key is one character past it
    with emulator(s3_env, log, *ROOMY, "--partitioned", f"{bucket}/one/",
                  "--partitioned", f"{bucket}/two/copy-",
                  "--partitioned", f"{bucket}/hashed/") as endpoint:
        for name, options in (("one", {}), ("two", {"copies": 2}),
                              ("hashed", {"key_prefix": "hash"})):
            job = _job(tmp_path, name, s3_env, endpoint,
                       ["sharded"] if name == "hashed" else layouts, **options)
            run = stampede("run", str(job), np=NP)
            assert run.returncode == 0, run.stdout + run.stderr
    requests = read_log(str(log))
    assert not [r for r in requests if r.status >= 500], Counter(r.status for r in requests)
    one, two = _checkpoint_reads(requests, "one"), _checkpoint_reads(requests, "two")
    # K = 1: every rank's reads of both layouts in one partition (shared/ and sharded/
    # share their first character)
    assert list(one) == [f"{bucket}/one/s"]
    total = one[f"{bucket}/one/s"]
    assert total > 0 and total % NP == 0
    # K = 2: the same requests, half in each copy's partition (ranks 0, 2 and 1, 3)
    assert two == {f"{bucket}/two/copy-0": total // 2, f"{bucket}/two/copy-1": total // 2}
    # what `stampede plan` says each prefix is asked, per restore, is what the log counted
    for name, options, logged in (("one", {}, one), ("two", {"copies": 2}, two)):
        spec = build_job(name, f"{name}.toml", {"target": {"path": f"s3://{bucket}/{name}"},
                                                "checkpoint": {"size": "2MiB", "layout": layouts,
                                                               "block_size": "256KiB",
                                                               **options}})
        planned: Counter[str] = Counter()
        for layout in layouts:
            for (prefix, _), count in restore_requests(spec, layout, NP).items():
                # the emulator's partition: one character past the prefix it was told
                planned[f"{bucket}/{name}/" + (prefix[:1] if name == "one" else prefix[:-1])] \
                    += count * PASSES
        assert planned == logged, (planned, logged)
    # each layout's objects in both copies
    for layout in ("shared", "sharded"):
        assert {r.key.split("/")[1] for r in requests
                if r.key.startswith("two/copy-") and f"/{layout}/" in r.key} == \
            {"copy-0", "copy-1"}
    # hashed keys: the shards' reads meet two partitions or more, a key in one
    hashed = Counter(r.partition for r in requests if r.kind == "read" and r.status < 300
                     and re.fullmatch(r"hashed/[0-9a-f]{4}/sharded/shard-\d{5}-of-\d{5}\.raw",
                                      r.key))
    assert len(hashed) >= 2 and sum(hashed.values()) == total // 2, hashed
    for r in requests:
        if r.key.startswith("hashed/") and "/sharded/" in r.key:
            assert r.partition == f"{bucket}/hashed/{r.key.split('/')[1][0]}"
    for name in ("one", "two", "hashed"):
        stampede("clean", str(_job(tmp_path, name, s3_env, direct, layouts)))


@pytest.mark.mpi
def test_list_first_lists_on_every_rank_and_list_bcast_once(
        stampede: Launch, s3_env: S3Server, tmp_path: Path) -> None:
    bucket, direct = s3_env.bucket, s3_env.endpoint_url
    for name, layout in (("storm", "list-first"), ("once", "list-bcast")):
        _prepare(stampede, _job(tmp_path, name, s3_env, direct, [layout]))
    counted = tmp_path / "counted.jsonl"
    with emulator(s3_env, counted, *ROOMY, "--partitioned", f"{bucket}/") as endpoint:
        for name, layout in (("storm", "list-first"), ("once", "list-bcast")):
            run = stampede("run", str(_job(tmp_path, name, s3_env, endpoint, [layout])), np=NP)
            assert run.returncode == 0, run.stdout + run.stderr
    lists = Counter((r.partition, r.prefix) for r in read_log(str(counted)) if r.kind == "list"
                    and r.prefix.endswith("/sharded/"))
    assert lists == {(f"{bucket}/s", "storm/sharded/"): NP * PASSES,
                     (f"{bucket}/o", "once/sharded/"): PASSES}
    # one LIST a second per partition, a burst of NP: list-bcast's PASSES LISTs pass,
    # list-first's second pass meets 503 SlowDown from the LIST bucket and fails named
    throttled = tmp_path / "throttled.jsonl"
    with emulator(s3_env, throttled, "--get-rate", "100000", "--put-rate", "100000",
                  "--list-rate", "0.001", "--burst", str(NP), "--split-delay-s", "inf",
                  "--partitioned", f"{bucket}/") as endpoint:
        once = stampede("run", str(_job(tmp_path, "once", s3_env, endpoint, ["list-bcast"])),
                        np=NP)
        storm = stampede("run", str(_job(tmp_path, "storm", s3_env, endpoint, ["list-first"])),
                         np=NP)
    assert once.returncode == 0, once.stdout + once.stderr
    assert storm.returncode == 1, storm.stdout + storm.stderr
    said = " ".join((storm.stdout + storm.stderr).split())
    # the burst spent by the first pass: every rank's LIST of the second fails, as throttling
    for rank in range(NP):
        assert f"rank {rank}: list sharded: throttled: S3 LIST 503 SlowDown after 2 attempts " \
               f"on s3://{bucket}/storm/sharded/" in said, said
    requests = [r for r in read_log(str(throttled)) if r.kind == "list"]
    assert Counter((r.prefix, r.status) for r in requests if r.prefix == "once/sharded/") == \
        {("once/sharded/", 200): PASSES}
    storm_lists = Counter(r.status for r in requests if r.prefix == "storm/sharded/")
    assert storm_lists[200] == NP and storm_lists[503] > 0, storm_lists
    assert not [r for r in read_log(str(throttled)) if r.kind != "list" and r.status >= 500]
    for name, layout in (("storm", "list-first"), ("once", "list-bcast")):
        stampede("clean", str(_job(tmp_path, name, s3_env, direct, [layout])))


@pytest.mark.mpi
def test_a_save_with_hashed_keys_puts_each_shard_under_its_prefix_and_restores(
        stampede: Launch, s3_env: S3Server, tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    with emulator(s3_env, log, *ROOMY) as endpoint:
        job = _job(tmp_path, "hsave", s3_env, endpoint, ["sharded"], key_prefix="hash")
        saved = stampede("save", str(job), np=NP)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        restored = stampede("run", str(job), np=NP)   # run.restore auto: the published save
        assert restored.returncode == 0, restored.stdout + restored.stderr
    requests = read_log(str(log))
    shard = r"hsave/saves/sharded/(v\d{6})/([0-9a-f]{4})/sharded/shard-(\d{5})-of-00004\.raw"
    puts = [re.fullmatch(shard, r.key) for r in requests if r.method == "PUT"]
    written = [match.groups() for match in puts if match]
    versions = {version for version, _, _ in written}
    # each version: the 4 shards under 4 prefixes, one each, the same in every version
    assert versions and len(written) == NP * len(versions)
    for version in versions:
        heads = {number: head for v, head, number in written if v == version}
        assert len(heads) == NP and len(set(heads.values())) == NP
    reads = {match.group(1) for r in requests if r.kind == "read"
             and (match := re.fullmatch(shard, r.key))}
    assert reads and reads <= versions   # the save's validation and the restore read them
    assert not [r for r in requests if r.status >= 500]
    stampede("clean", str(_job(tmp_path, "hsave", s3_env, s3_env.endpoint_url, ["sharded"],
                               key_prefix="hash")))
