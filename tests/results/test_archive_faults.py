"""Archives that cannot be lost: what is not a regular file is refused before any I/O, a
full disk leaves the archive as it was, a signal keeps the layouts already measured, and
a damaged archive is one clear line, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stampede.errors import RunFailed
from stampede.launcher import find_mpiexec
from stampede.results.archive import append_rows, read_rows
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job
from tests.helpers.tmpfs import fill, small_disk


@pytest.mark.parametrize("where", ["/dev/full", "/dev/null", "fifo", "directory"])
def test_an_archive_that_is_not_a_regular_file_is_refused_before_any_io(
        stampede, tmp_path: Path, where: str) -> None:
    if where == "fifo":
        where = str(tmp_path / "fifo")
        os.mkfifo(where)
    elif where == "directory":
        where = str(tmp_path / "dir")
        os.mkdir(where)
    job = small_job(tmp_path, archive={"path": where})
    result = stampede("run", str(job), timeout=60)   # a FIFO once hung here forever
    assert result.returncode == 2, result.stderr
    assert f"archive.path = {where!r}: is a" in result.stderr
    assert "not a regular file" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 2   # the line and its hint
    assert not (tmp_path / "ckpt").exists()               # before any I/O


def test_a_full_disk_leaves_the_archive_as_it_was(tmp_path: Path) -> None:
    rows = [{"run_id": "r1", "job": "j", "layout": "sharded", "op": "read", "valid": "true"}]
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        archive = disk / "a.csv"
        append_rows(archive, rows)
        before = archive.read_bytes()
        fill(disk, 2048)
        big = [{**rows[0], "warnings": "x" * 4000, "run_id": "r2"}]
        with pytest.raises(RunFailed, match="appending 1 row.s. failed .No space left on device"):
            append_rows(archive, big)
        assert archive.read_bytes() == before   # nothing of the failed append stays
        assert [row["run_id"] for row in read_rows(archive)] == ["r1"]


@pytest.mark.mpi
def test_a_run_on_a_full_disk_reports_then_fails_in_one_line(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        archive = disk / "job.csv"
        fill(disk, 4096)   # the header fits, the rows do not
        result = stampede("run", str(job), "--set", f"archive.path={str(archive)!r}", np=2)
        assert result.returncode == 1, result.stderr
        assert "sharded: latency per op" in result.stdout   # the results were shown first
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "No space left on device" in errors[0], result.stderr
        assert "Traceback" not in result.stderr
        assert not archive.exists() or archive.read_bytes() == b""
        assert not list(disk.rglob("*.tmp"))


@pytest.mark.mpi
def test_sigterm_keeps_the_layouts_measured_and_says_what_was_not(tmp_path: Path) -> None:
    # each layout lasts 2000 iterations (seconds): the signal lands inside sharded
    job = small_job(tmp_path, checkpoint={"layout": ["shared", "sharded", "metadata-first"],
                                          "size": "4MiB"},
                    run={"iterations": 2000, "verify": "none", "warmup": 0})
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    command = [mpiexec, "-n", "2", sys.executable, "-m", "stampede"]
    env = {name: value for name, value in os.environ.items() if name != "COLUMNS"}
    prepared = subprocess.run([*command, "prepare", str(job)], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, env=env)
    assert prepared.returncode == 0, prepared.stderr
    archive = tmp_path / "results" / "job.csv"
    running = subprocess.Popen([*command, "run", str(job)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while not (archive.exists() and ",shared," in archive.read_text()):
        assert running.poll() is None and time.monotonic() < deadline, running.communicate()
        time.sleep(0.2)
    running.send_signal(signal.SIGTERM)   # mpiexec passes it to the ranks (as srun does)
    out, err = running.communicate(timeout=60)
    assert running.returncode != 0
    # shared whole; sharded's iterations up to the signal's (it finishes the one it lands
    # in) archived as incomplete, marked invalid; metadata-first never measured
    said = " ".join(err.split())
    assert "stopped by SIGTERM: archived shared, sharded (" in said, err
    assert ("of 2000 iterations, archived as incomplete); not measured (nothing of them "
            "archived): metadata-first") in said, err
    rows = read_archive(archive)
    assert {row["layout"] for row in rows} == {"shared", "sharded"}
    assert {row["valid"] for row in rows if row["layout"] == "shared"} == {"true"}
    sharded = [row for row in rows if row["layout"] == "sharded"]
    assert {row["valid"] for row in sharded} == {"false"}
    done = int(next(row["iterations"] for row in sharded if row["op"] == "restore"))
    assert 1 <= done < 2000 and f"sharded ({done} of 2000 iterations" in said


def test_a_garbage_cell_is_one_line_naming_file_line_and_value(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "a.csv"
    append_rows(archive, [{"run_id": "r1", "job": "j", "layout": "sharded", "op": "restore",
                           "valid": "true", "time_to_last_rank_s": 0.5, "nranks": 2,
                           "bytes_per_rank": 1, "block_bytes": 1}])
    text = archive.read_text().replace(",0.5,", ",half a second,")
    archive.write_text(text)
    result = stampede("report", str(archive))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{archive}, line 2: column time_to_last_rank_s = 'half a second': not a number" \
        in result.stderr


def test_an_archive_without_a_required_column_names_it(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "a.csv"
    append_rows(archive, [{"run_id": "r1", "job": "j", "layout": "sharded", "op": "restore"}])
    lines = archive.read_text().splitlines()
    header = lines[0].split(",")
    drop = header.index("lat_p50_s")
    archive.write_text("\n".join(",".join(cell for i, cell in enumerate(line.split(","))
                                          if i != drop) for line in lines) + "\n")
    result = stampede("report", str(archive))
    assert result.returncode == 2
    assert "its header lacks the column(s) lat_p50_s" in result.stderr
