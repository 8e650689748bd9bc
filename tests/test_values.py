"""stampede.values: what a command reads is looked at before it is read (a FIFO never
hangs it, a device never fills memory), and what it writes is never one of its inputs,
however the two paths are spelled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.values import read_text, refuse_overwrite, scale

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", ["fifo", "directory", "/dev/zero", "/dev/null"])
def test_only_a_regular_file_is_read(tmp_path: Path, kind: str) -> None:
    path = Path(kind) if kind.startswith("/") else tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)               # no writer: a plain open() would wait for ever
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(UsageError) as refused:
        read_text(path, "archive", limit_bytes=1024)
    what = {"fifo": "a FIFO", "directory": "a directory"}.get(kind, "a character device")
    assert str(refused.value) == f"{path}: is {what}, not a regular file, so not an archive"


def test_a_file_over_the_limit_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("x" * 2000)
    with pytest.raises(UsageError, match="more than 1000 B, larger than any mdtest output"):
        read_text(path, "mdtest output", limit_bytes=1000)
    assert read_text(path, "mdtest output", limit_bytes=2000) == "x" * 2000


def test_an_output_is_never_an_input_however_it_is_spelled(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "a.csv"
    archive.write_text("schema\n")
    runs = tmp_path / "a.runs"
    inputs = {"archive": archive, "archive's sidecars": runs}
    os.link(archive, tmp_path / "hard.csv")
    (tmp_path / "soft.csv").symlink_to(archive)
    monkeypatch.chdir(tmp_path)
    for output in (archive, Path("a.csv"), Path("./sub/../a.csv"), tmp_path / "hard.csv",
                   Path("soft.csv")):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(UsageError, match="is the archive"):
            refuse_overwrite("-o", output, inputs)
    for output in (runs / "x.html", Path("a.runs/deeper/x.html")):   # not made yet, then made
        with pytest.raises(UsageError, match="lies inside the archive's sidecars"):
            refuse_overwrite("-o", output, inputs)
        runs.mkdir(exist_ok=True)
    refuse_overwrite("-o", tmp_path / "a.html", inputs)            # beside it: fine
    assert archive.read_text() == "schema\n"


def stampede(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stampede", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


def test_readers_of_user_files_refuse_what_is_not_one(tmp_path: Path) -> None:
    """Each command that reads a user's file, on a FIFO (it once hung for ever) and on
    /dev/zero (it once grew to 24 GiB): one line, exit 2, at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for command in (["report", str(fifo)], ["compare", str(fifo), str(fifo)],
                    ["html", str(fifo)], ["mttr", str(fifo)], ["run", str(fifo)],
                    ["import", "mdtest", str(fifo), "--archive", "x.csv"],
                    ["import", "mdtest", "/dev/zero", "--archive", "x.csv"],
                    ["mttr", "--job", "/dev/zero"]):
        result = stampede(*command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert "not a regular file" in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_the_report_never_replaces_its_archive_or_the_job(tmp_path: Path) -> None:
    archive = tmp_path / "a0.csv"
    imported = stampede("import", "ior", str(REPO / "tests" / "data" / "ior-4.1-read-F-n2-warm.json"),
                        "--archive", str(archive), cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    before = archive.read_bytes()
    job = REPO / "jobs" / "quickstart.toml"
    for command in (["html", "a0.csv", "-o", "a0.csv"], ["html", "a0.csv", "-o", "a0.runs/x.html"],
                    ["plot", "a0.csv", "--kind", "cdf", "-o", "./a0.csv"],
                    ["assess", str(job), "--ranks", "1,2,4", "--budget", "1s", "--no-save",
                     "-o", "rep.csv"],
                    ["assess", str(job), "--ranks", "1,2,4", "-o", str(job)],
                    ["slurm", str(job), "--output", str(job)]):
        result = stampede(*command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert "would replace it" in result.stderr or "lies inside" in result.stderr, result.stderr
    assert archive.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a0.csv"]


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 0, 1.5, "2/1"])
def test_a_scale_outside_0_to_1_is_a_clear_error(value: object) -> None:
    with pytest.raises(ValueError, match="must be a factor above 0 and at most 1"):
        scale(value)
