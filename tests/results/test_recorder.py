"""The one recorder every measuring command archives through: a part is shown, then its
rows appended whole, then the sidecar rewritten; a part the archive refuses leaves the
archive and the sidecar as the parts before it left them. And each command's sidecar,
written by a real run, follows results/sidecar-N.schema.json under its command's name."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from stampede.errors import RunFailed
from stampede.results.archive import read_rows, sidecar_path
from stampede.results.cells import cell
from stampede.results.columns import ARCHIVE_SCHEMA
from stampede.results.recorder import Recorder
from stampede.results.rows import shared_columns
from tests.helpers import checkpoints
from tests.helpers.jobs import small_job, write_job
from tests.helpers.json_schema import sidecar_problems
from tests.helpers.loaders import loader_package
from tests.helpers.tmpfs import fill, small_disk


def part(layout: str, ops: Sequence[str], warnings: str = "") -> list[dict[str, str]]:
    shared = shared_columns("r1", "2026-12-02T00:00:00+00:00", "job", "posix", layout,
                            ("node0", "node0"))
    return [{column: cell(value) for column, value in
             {**shared, "op": op, "count": 2, "warnings": warnings}.items()} for op in ops]


def test_each_part_is_shown_then_archived_whole_and_a_refused_part_changes_nothing(
        tmp_path: Path) -> None:
    shown: list[tuple[list[str], int, dict[str, Any]]] = []

    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        archive = disk / "job.csv"

        def show(rows: Sequence[dict[str, str]], sidecar: Mapping[str, Any]) -> None:
            # what the archive held when the part was shown: the parts before it only
            held = len(read_rows(archive)) if archive.exists() else 0
            shown.append(([row["op"] for row in rows], held, dict(sidecar)))

        recorder = Recorder(archive, "r1", "run", show)
        recorder.record(part("shared", ("open", "read", "restore")), {"layouts": ["shared"]})
        recorder.record(part("sharded", ("open", "restore")), {"layouts": ["shared", "sharded"]})
        assert [(ops, held) for ops, held, _ in shown] == [
            (["open", "read", "restore"], 0), (["open", "restore"], 3)]
        assert shown[-1][2] == {"layouts": ["shared", "sharded"], "schema": ARCHIVE_SCHEMA,
                                "run_id": "r1", "command": "run"}
        document = json.loads(sidecar_path(archive, "r1").read_text())
        assert document == shown[-1][2] and recorder.sidecar_file == sidecar_path(archive, "r1")
        assert [row["layout"] for row in read_rows(archive)] == ["shared"] * 3 + ["sharded"] * 2
        assert len(recorder.rows) == 5
        assert recorder.archived(", trace T") == \
            f"archived: {archive} (+ {sidecar_path(archive, 'r1')}, trace T)"

        before = archive.read_bytes()
        fill(disk, 2048)   # the third part's rows cannot fit
        with pytest.raises(RunFailed, match="No space left on device"):
            recorder.record(part("metadata-first", ("stat", "restore"), "x" * 4000),
                            {"layouts": ["shared", "sharded", "metadata-first"]})
        assert shown[-1][0] == ["stat", "restore"]   # shown: the results are not lost to sight
        assert archive.read_bytes() == before and len(recorder.rows) == 5
        assert json.loads(sidecar_path(archive, "r1").read_text()) == document
        assert not list(disk.rglob("*.tmp"))


def test_a_part_whose_trace_cannot_be_written_is_not_archived_either(tmp_path: Path) -> None:
    """E13: the rows of a part are archived only with its sidecar and trace. A trace that
    does not fit (the disk full) leaves the archive, the sidecar and the trace as the parts
    before left them, and no temporary file."""
    import numpy as np

    from stampede.ops import OP_CODE
    from stampede.results.model import LayoutTrace
    from stampede.results.readback import read_trace
    from stampede.results.trace import trace_path, write_trace

    def traced(count: int) -> LayoutTrace:
        return LayoutTrace(np.array([[0, OP_CODE["read"], n, n + 1, 4096, 1, n % 2, 0, 0]
                                     for n in range(count)], dtype=np.int64), ["f"])

    meta = {"run_id": "r1", "hosts_by_rank": ["node0", "node0"]}
    with small_disk(tmp_path / "disk", 512 * 1024) as disk:
        archive = disk / "job.csv"
        recorder = Recorder(archive, "r1", "run", lambda rows, sidecar: None)
        first = {"restore/shared": traced(10)}
        recorder.record(part("shared", ("open", "read", "restore")), {"layouts": ["shared"]},
                        lambda path: write_trace(path, first, meta))
        kept = {path: path.read_bytes() for path in (archive, sidecar_path(archive, "r1"),
                                                     trace_path(sidecar_path(archive, "r1")))}
        fill(disk, 96 * 1024)   # the sidecar fits again, 2 MB of trace rows do not
        second = {**first, "restore/sharded": traced(30_000)}
        with pytest.raises(RunFailed) as raised:
            recorder.record(part("sharded", ("open", "restore")),
                            {"layouts": ["shared", "sharded"]},
                            lambda path: write_trace(path, second, meta))
        assert raised.value.message == (
            f"{trace_path(sidecar_path(archive, 'r1'))}: writing the run's trace failed (No "
            "space left on device); its 2 row(s) not archived: the archive, the sidecar and "
            "the trace are as the parts before them left them")
        assert {path: path.read_bytes() for path in kept} == kept
        assert [row["layout"] for row in read_rows(archive)] == ["shared"] * 3
        assert len(recorder.rows) == 3
        assert sorted(path.name for path in disk.rglob("*") if path.is_file()) == \
            ["filler", "job.csv", "r1.json", "r1.trace.npz"]   # no temporary file
        found = read_trace(trace_path(sidecar_path(archive, "r1")))
        assert found.notes == () and found.value is not None
        assert list(found.value.layouts) == ["restore/shared"]


@pytest.mark.mpi
def test_a_run_whose_sidecar_does_not_fit_archives_none_of_its_rows(stampede,
                                                                    tmp_path: Path) -> None:
    """E13 as a user meets it: the rows fit, the sidecar does not. Once the rows stayed,
    valid, beside no sidecar (and the trace half written); now the run's report is shown,
    then one line names the sidecar, exit 1, and the archive holds nothing of the part."""
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    with small_disk(tmp_path / "disk", 128 * 1024) as disk:   # a sidecar is ~250 KB
        archive = disk / "job.csv"
        result = stampede("run", str(job), "--trace", "--set",
                          f"archive.path={str(archive)!r}", np=2)
        assert result.returncode == 1, result.stderr
        assert "sharded: latency per op" in result.stdout   # the results were shown first
        errors = [line for line in result.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"{disk / 'job.runs'}/" in errors[0] and errors[0].endswith(
            ".json: writing the run's sidecar failed (No space left on device); its 5 row(s) "
            "not archived: the archive, the sidecar and the trace are as the parts before "
            "them left them"), errors[0]
        assert not archive.exists() or read_rows(archive) == []
        assert [path for path in disk.rglob("*") if path.is_file()
                and path != archive] == []   # no sidecar, no trace, no temporary file


def _sidecar(archive: Path) -> dict[str, Any]:
    found = sorted(archive.with_name(f"{archive.stem}.runs").glob("*.json"))
    documents = [json.loads(path.read_text()) for path in found]
    runs = [document for document, path in zip(documents, found, strict=True)
            if document.get("run_id") == path.stem]
    assert len(runs) == 1, found
    return runs[0]


def _valid(archive: Path, command: str) -> dict[str, Any]:
    document = _sidecar(archive)
    assert sidecar_problems(document) == [], (command, sidecar_problems(document)[:5])
    assert document["command"] == command and document["schema"] == ARCHIVE_SCHEMA
    assert {row["run_id"] for row in read_rows(archive)} == {document["run_id"]}
    return document


@pytest.mark.mpi
def test_every_command_writes_a_sidecar_of_its_schema(stampede, tmp_path: Path) -> None:
    """run, save, cycle, startup and gpu at 2 ranks (loaders below; rejoin, which needs
    several nodes, in tests/run/test_rejoin.py through the suite's check of every
    sidecar): each sidecar validates and names its command."""
    for command in ("run", "save", "cycle"):
        directory = tmp_path / command
        directory.mkdir()
        job = small_job(directory, checkpoint={"layout": "sharded", "size": "4MiB"},
                        run={"iterations": 1, "warmup": 0, "verify": "none"})
        if command == "run":
            assert stampede("prepare", str(job), np=2).returncode == 0
        result = stampede(command, str(job), np=2)
        assert result.returncode == 0, result.stderr
        document = _valid(directory / "results" / "job.csv", command)
        parts = {"run": {"layouts"}, "save": {"saves"}, "cycle": {"layouts", "saves"}}[command]
        assert parts <= set(document) and len(document["hosts_by_rank"]) == 2
    startup = tmp_path / "startup.csv"
    assert stampede("startup", "--archive", str(startup), np=2).returncode == 0
    assert len(_valid(startup, "startup")["ranks"]) == 2
    gpu = tmp_path / "gpu.csv"
    result = stampede("gpu", "--device", "host", "--sizes", "1MiB", "--modes", "pageable,file",
                      "--trials", "1", "--archive", str(gpu), np=2)
    assert result.returncode == 0, result.stderr
    document = _valid(gpu, "gpu")
    assert document["groups"] == [["pageable", 2**20], ["file", 2**20]]
    assert len(document["devices_by_rank"]) == len(document["hosts_by_rank"]) == 2
    assert f"(+{sidecar_path(gpu, document['run_id'])})" in "".join(result.stdout.split())


@pytest.mark.mpi
def test_a_loaders_run_writes_a_sidecar_of_its_schema(stampede, tmp_path: Path) -> None:
    loader_package("safetensors")
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["files"], "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 0},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(checkpoints.published_safetensors()),
                      "--loaders", "safetensors", "--devices", "cpu", np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    document = _valid(tmp_path / "results" / "loaders.csv", "loaders")
    assert list(document["loaders"]) == ["safetensors cpu files"]
    assert sidecar_problems(document["ceiling"]) == []
