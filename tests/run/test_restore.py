"""End to end through the CLI with a real mpiexec: prepare, run, archive, report, clean."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi
MiB = 2**20


def rows_by(rows: list[dict[str, str]], layout: str) -> dict[str, dict[str, str]]:
    return {row["op"]: row for row in rows if row["layout"] == layout}


@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_restore_reads_every_planned_byte_and_matches_the_manifest(stampede, tmp_path: Path,
                                                                   nranks: int) -> None:
    job = small_job(tmp_path)
    np_ = None if nranks == 1 else nranks  # one rank: plain `stampede run`, no mpiexec
    prepared = stampede("prepare", str(job), np=np_)
    assert prepared.returncode == 0, prepared.stderr
    manifest = json.loads((tmp_path / "ckpt" / "stampede-manifest.json").read_text())
    assert {entry["nranks"] for entry in manifest["layouts"].values()} == {nranks}

    ran = stampede("run", str(job), np=np_)
    assert ran.returncode == 0, ran.stderr + ran.stdout
    rows = read_archive(tmp_path / "results" / "job.csv")
    iterations = 2
    total = 16 * MiB // nranks // 4096 * 4096 * nranks
    for layout in ("shared", "sharded"):
        ops = rows_by(rows, layout)
        assert set(ops) == {"stat", "open", "read", "close", "verify", "restore"}
        read, restore, verify = ops["read"], ops["restore"], ops["verify"]
        # every planned byte read exactly once per iteration, and hashed equal to prepare's
        assert int(read["op_bytes"]) == total * iterations
        assert int(read["count"]) == nranks * iterations * -(-(total // nranks) // MiB)
        assert int(verify["count"]) == nranks * iterations and verify["errors"] == "0"
        assert int(restore["op_bytes"]) == total * iterations
        assert int(restore["count"]) == nranks * iterations
        assert all(row["valid"] == "true" and row["nranks"] == str(nranks) for row in ops.values())
        assert float(restore["time_to_last_rank_s"]) >= float(restore["first_done_s"]) > 0
        assert float(restore["agg_gbps"]) > 0 and float(read["lat_p50_s"]) > 0
        assert int(ops["stat"]["count"]) == nranks * iterations
    assert "Restore: time until every rank holds its bytes" in ran.stdout
    run_id = rows[0]["run_id"]
    sidecar = json.loads((tmp_path / "results" / "job.runs" / f"{run_id}.json").read_text(),
                         parse_constant=lambda name: pytest.fail(f"{name} in the sidecar"))
    assert len(sidecar["hosts_by_rank"]) == nranks
    for layout in ("shared", "sharded"):
        per_rank = sidecar["layouts"][layout]["stats"]["restore"]["per_rank_s"]
        assert len(per_rank) == nranks and all(seconds > 0 for seconds in per_rank)
    assert sidecar["node"]["target_mount"]["fs_type"] == rows[0]["fs_type"]
    if nranks > 1:
        assert "MPICH" in sidecar["mpi_library"]

    report = stampede("report", str(tmp_path / "results" / "job.csv"))
    assert report.returncode == 0 and run_id in report.stdout

    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (tmp_path / "ckpt").exists()   # prepare made the directory: clean removes it


def test_plan_touches_no_storage(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, target={"path": str(tmp_path / "never" / "created")})
    planned = stampede("plan", str(job), "--np", "64")
    assert planned.returncode == 0, planned.stderr
    assert "sharded/shard-00063-of-00064.raw" in planned.stdout
    assert "(56 more ranks)" in planned.stdout
    assert not (tmp_path / "never").exists()


def test_bad_job_is_one_error_on_rank_0_exit_2_on_every_rank_before_io(stampede,
                                                                       tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"cache": "cool"})
    for command in ("prepare", "run"):
        result = stampede(command, str(job), np=2)
        assert result.returncode == 2
        assert result.stderr.count("error:") == 1, result.stderr
        assert "run.cache = 'cool'" in result.stderr and str(job) in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "ckpt").exists()
    unknown = stampede("run", str(job), "--set", "run.cach=cold", np=2)
    assert unknown.returncode == 2 and 'did you mean "run.cache"' in unknown.stderr


def test_run_without_prepare_and_with_another_rank_count(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    (tmp_path / "ckpt").mkdir()
    missing = stampede("run", str(job), np=2)
    assert missing.returncode == 2 and "no checkpoint prepared here" in missing.stderr
    assert stampede("prepare", str(job), np=2).returncode == 0
    other = stampede("run", str(job), np=4)
    assert other.returncode == 2
    assert "prepared for 2 ranks" in other.stderr and "needs 4" in other.stderr


def test_missing_shard_is_reported_archived_invalid_and_does_not_hang(stampede,
                                                                      tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    (tmp_path / "ckpt" / "sharded" / "shard-00001-of-00002.raw").unlink()
    result = stampede("run", str(job), np=2, timeout=60)
    assert result.returncode == 1
    assert "rank 1: open sharded/shard-00001-of-00002.raw: No such file or directory" in result.stdout
    assert "archived as invalid" in result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert rows and all(row["valid"] == "false" for row in rows)
    assert rows_by(rows, "sharded")["open"]["errors"] == "1"


def test_corrupt_byte_is_named_by_file_rank_and_range(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "shared"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    shared = tmp_path / "ckpt" / "shared" / "checkpoint.raw"
    with open(shared, "r+b") as stream:  # one byte inside rank 1's slice (the upper half)
        stream.seek(12 * MiB + 17)
        byte = stream.read(1)
        stream.seek(12 * MiB + 17)
        stream.write(bytes([byte[0] ^ 0xFF]))
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert ("rank 1: verify shared/checkpoint.raw bytes 8388608..16777216: sha256 differs"
            in result.stdout)
    assert "rank 0: verify" not in result.stdout
    verify = rows_by(read_archive(tmp_path / "results" / "job.csv"), "shared")["verify"]
    assert verify["errors"] == "1" and verify["valid"] == "false"


def test_truncated_shard_is_a_short_read(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    os.truncate(tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.raw", 3 * MiB + 5)
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert "rank 0: read sharded/shard-00000-of-00002.raw at 3145728: short read, 5 of 1048576" \
        in result.stdout


@pytest.mark.parametrize("cache", ["cold", "direct"])
def test_cold_and_direct_restores_are_valid_and_labelled(stampede, tmp_path: Path,
                                                         cache: str) -> None:
    job = small_job(tmp_path, run={"cache": cache})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["cache"] for row in rows} == {cache}
    assert all(row["valid"] == "true" for row in rows)


def test_deadline_stops_every_rank_and_archives_invalid(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"deadline_s": 1e-6})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2, timeout=60)
    assert result.returncode == 1
    assert "deadline of 1e-06 s reached" in result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["valid"] for row in rows} == {"false"}


def test_prepare_refuses_a_directory_it_did_not_prepare(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    (tmp_path / "ckpt").mkdir()
    precious = tmp_path / "ckpt" / "precious.bin"
    precious.write_bytes(b"someone else's")
    result = stampede("prepare", str(job), np=2)
    assert result.returncode == 2
    assert "is not empty and was not prepared by stampede" in result.stderr
    assert result.stderr.count("error:") == 1
    assert precious.read_bytes() == b"someone else's"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["precious.bin"]


def test_clean_removes_only_what_prepare_wrote(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    assert stampede("prepare", str(job), np=2).returncode == 0
    mine = tmp_path / "ckpt" / "sharded" / "notes.txt"
    mine.write_text("keep me")
    assert stampede("clean", str(job)).returncode == 0
    assert mine.read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["sharded"]
    again = stampede("clean", str(job))
    assert again.returncode == 2 and "nothing here was prepared or saved by stampede" in again.stderr


def test_demo_sweeps_both_layouts_and_ends_in_the_verdict(stampede, tmp_path: Path,
                                                          monkeypatch) -> None:
    """--np 3: start-up and restore at 1, 2 and 3 ranks (three counts project), the save at
    3, the verdict of these runs alone (an archive holding an earlier demo's runs of another
    size is not one sweep), everything it wrote removed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the demo's temporary directory, ours alone
    archive = tmp_path / "demo.csv"
    earlier = stampede("demo", "--np", "1", "--size", "4MiB", "--archive", str(archive))
    assert earlier.returncode == 0, earlier.stderr + earlier.stdout
    assert "restore: use " in earlier.stdout   # one rank count: ranked, not projected
    before = {row["run_id"] for row in read_archive(archive)}
    result = stampede("demo", "--np", "3", "--size", "24MiB", "--archive", str(archive))
    assert result.returncode == 0, result.stderr + result.stdout
    rows = [row for row in read_archive(archive) if row["run_id"] not in before]
    restores = {(row["layout"], row["nranks"]) for row in rows if row["op"] == "restore"}
    assert restores == {(layout, n) for layout in ("shared", "sharded") for n in ("1", "2", "3")}
    assert {row["nranks"] for row in rows if row["op"] == "save"} == {"3"}
    assert {row["nranks"] for row in rows if row["op"] == "startup"} == {"1", "2", "3"}
    verdict = result.stdout[result.stdout.index("verdict of this demo's runs at 16384 ranks"):]
    assert "workload: the job's checkpoint as archived, 24 MiB, 16384 ranks" in verdict
    assert re.search(r"restore: use \w+ .*; at 16384 ranks: time to last rank", verdict)
    assert "T_MTTR at 16384 ranks" in verdict
    assert "T_pod_init" not in verdict.split("assumed, not measured:")[1].splitlines()[0]
    assert not list(tmp_path.glob("stampede-demo-*"))  # removed after the run


def test_a_launcher_that_does_not_match_the_mpi_library_is_refused(stampede, tmp_path: Path,
                                                                    monkeypatch) -> None:
    # An Open MPI launcher around PyPI's MPICH: each process would be a 1-rank world, and
    # four independent "rank 0"s would write the same archive. Simulated by its variable.
    job = small_job(tmp_path)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    result = stampede("run", str(job))
    assert result.returncode == 2
    assert "launched as 4 ranks, but MPI sees 1 rank" in result.stderr


def test_an_archive_of_another_schema_is_refused_before_any_io(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    assert stampede("prepare", str(job), np=2).returncode == 0
    archive = tmp_path / "results" / "job.csv"
    archive.parent.mkdir()
    archive.write_text("when,what\n1,2\n")
    result = stampede("run", str(job), np=2)
    assert result.returncode == 2
    assert "not this stampede's CSV schema" in result.stderr
    assert result.stderr.count("error:") == 1
    assert "Restore" not in result.stdout
    assert archive.read_text() == "when,what\n1,2\n"


def test_preparing_again_for_another_rank_count_leaves_no_stale_shards(stampede,
                                                                       tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"})
    assert stampede("prepare", str(job), np=4).returncode == 0
    assert stampede("prepare", str(job), np=2).returncode == 0
    shards = sorted(p.name for p in (tmp_path / "ckpt" / "sharded").iterdir())
    assert shards == ["shard-00000-of-00002.raw", "shard-00001-of-00002.raw"]
    assert stampede("run", str(job), np=2).returncode == 0


def test_an_open_storm_over_the_open_files_limit_is_refused_before_any_io(stampede,
                                                                          tmp_path: Path) -> None:
    import resource
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    job = small_job(tmp_path, pattern={"open_count": soft_limit + 1})
    assert stampede("prepare", str(job)).returncode == 0
    result = stampede("run", str(job))
    assert result.returncode == 2
    assert f"pattern.open_count = {soft_limit + 1} keeps" in result.stderr
    assert not (tmp_path / "results").exists()


def test_a_batch_script_outside_srun_is_one_rank(stampede, tmp_path: Path, monkeypatch) -> None:
    # sbatch sets SLURM_NTASKS for the whole allocation, also outside any srun step:
    # there this process is one rank, and must not be refused as a launcher mismatch.
    job = small_job(tmp_path)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert stampede("prepare", str(job)).returncode == 0
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")  # inside an srun step of 2: refused
    result = stampede("run", str(job))
    assert result.returncode == 2 and "launched as 2 ranks" in result.stderr


def _rank_pid(job: Path, rank: int, timeout_s: float = 30.0) -> int:
    """The PID of the process that is `rank` of a running `stampede run JOB`."""
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
                environment = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"run" in command and str(job).encode() in command and \
                    f"PMI_RANK={rank}".encode() in environment:
                return int(entry.name)
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} of {job} never started")


def test_a_killed_rank_ends_the_run_without_a_hang_and_keeps_the_archive(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from stampede.launcher import find_mpiexec

    job = small_job(tmp_path, checkpoint={"layout": "sharded"},
                    run={"iterations": 400, "jitter": "uniform:0.05", "verify": "none"})
    archive = tmp_path / "results" / "job.csv"
    command = [find_mpiexec(), "-n", "2", sys.executable, "-m", "stampede"]
    assert subprocess.run([*command, "prepare", str(job)], capture_output=True).returncode == 0
    earlier = subprocess.run([*command, "run", str(job), "--set", "run.iterations=2"],
                             capture_output=True, cwd=tmp_path)
    assert earlier.returncode == 0
    before = archive.read_text()
    started = time.monotonic()
    run = subprocess.Popen([*command, "run", str(job)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert run.stderr is not None
    announced = run.stderr.readline()        # rank 0 says it starts once every rank is up
    assert "stampede run job" in announced
    time.sleep(0.5)                          # well inside the 400 iterations
    os.kill(_rank_pid(job, 1), signal.SIGKILL)
    stdout, stderr = run.communicate(timeout=60)
    assert run.returncode != 0
    assert time.monotonic() - started < 60
    assert "signal 9" in (stdout + stderr).lower(), (run.returncode, stdout[-2000:], stderr)
    assert archive.read_text() == before    # the earlier run's rows, untouched


def test_errors_under_the_tolerated_fraction_are_counted_but_missing_bytes_stay_invalid(
        stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"},
                    run={"verify": "none", "iterations": 3, "max_error_fraction": 0.2})
    assert stampede("prepare", str(job), np=2).returncode == 0
    os.truncate(tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.raw", 5 * MiB + 5)
    result = stampede("run", str(job), np=2)
    # measuring went on through every iteration (the failed ops are within tolerance) ...
    read = rows_by(read_archive(tmp_path / "results" / "job.csv"), "sharded")["read"]
    assert read["errors"] == "3" and read["iterations"] == "3"      # one short read each
    assert "read: 3 failed op(s)" in read["warnings"]
    # ... but a rank that lacks bytes is no restore: invalid, whatever the tolerance
    assert result.returncode == 1
    assert "1 rank(s) did not hold all their bytes in warmup iteration 1 of 1" in result.stderr
    assert read["valid"] == "false"
    # with no tolerance the same fault stops every rank at once
    strict = stampede("run", str(job), "--set", "run.max_error_fraction=0", np=2)
    assert strict.returncode == 1
    assert "1 of 20 ops failed in warmup iteration 1 of 1" in strict.stderr


def test_prepare_and_clean_refuse_a_target_they_cannot_write(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, target={"path": "s3://bucket/ckpt"})
    for command in ("prepare", "clean"):
        result = stampede(command, str(job))
        assert result.returncode == 2 and "s3://bucket/ckpt" in result.stderr
    assert not (tmp_path / "s3:").exists()
    assert stampede("plan", str(job), "--np", "0").returncode == 2
