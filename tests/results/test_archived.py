"""The read side's one way in (stampede.results.archived): an archive parsed once per command,
its cells typed once (one error naming the file, line, column and value), the run a verdict
uses chosen in one place, several archives composed, sidecars read on demand and once."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stampede import cli
from stampede.errors import UsageError
from stampede.results import archive as csv_archive
from stampede.results.archive import append_rows
from stampede.results.archived import Archive
from tests.present.test_golden import unpack


def row(run_id: str, op: str = "restore", layout: str = "shared", valid: str = "true",
        **cells: str) -> dict[str, str]:
    return {"run_id": run_id, "op": op, "layout": layout, "valid": valid,
            "time_to_last_rank_s": "1.5", **cells}


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The archives read_rows parsed, in order."""
    parsed: list[str] = []
    read_rows = csv_archive.read_rows

    def counted(path: str | Path) -> list[dict[str, str]]:
        parsed.append(Path(path).name)
        return read_rows(path)

    monkeypatch.setattr(csv_archive, "read_rows", counted)
    return parsed


@pytest.mark.parametrize("argv", [
    ["report", "sweep.csv", "--html", "OUT"],
    ["report", "rejoin.csv", "--html", "OUT"],
    ["mttr", "sweep.csv", "--target-ranks", "1024"],
    ["mttr", "rejoin.csv", "--target-ranks", "1024"],
    ["project", "sweep.csv", "rejoin.csv", "--target-ranks", "1024"],
    ["compare", "sweep.csv", "--by", "layout"],
    ["html", "traced.csv", "-o", "OUT"],
], ids=lambda argv: "-".join(argv[:2]))
def test_one_command_parses_each_archive_once(argv: list[str], parses: list[str],
                                              tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """report --html once parsed the CSV four times (the terminal, the page, the
    assessment, the recovery model), plus once per projected layout and rejoin side."""
    unpack(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "out.html") if arg == "OUT" else arg for arg in argv]
    assert cli.main(argv) == 0
    assert parses == [arg for arg in argv if arg.endswith(".csv")]


def test_a_bad_cell_anywhere_is_one_error_before_anything_is_rendered(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    append_rows(path, [{**row("r1"), "schema": 6}, {**row("r2"), "schema": 6}])
    path.write_text(path.read_text().replace(",1.5,", ",fast,", 2).replace(",fast,", ",1.5,", 1))
    with pytest.raises(UsageError) as error:
        Archive.open(path)
    assert str(error.value).startswith(f"{path}, line 3: column time_to_last_rank_s = 'fast': "
                                       "not a number; allowed: a number (in s), or empty")


def test_rows_are_typed_once_when_the_archive_opens(tmp_path: Path) -> None:
    """Every reader gets the cells as what their columns hold: nothing re-parses a cell."""
    path = tmp_path / "a.csv"
    append_rows(path, [{**row("r1"), "schema": 6}])
    (read,) = Archive.open(path).rows
    assert (read["time_to_last_rank_s"], read["valid"], read["schema"]) == (1.5, True, 6)
    assert type(read["schema"]) is int and math.isnan(read["lat_p50_s"])
    in_memory = Archive([row("r1")])   # built in memory: typed the same way
    assert in_memory.rows[0]["time_to_last_rank_s"] == 1.5 and in_memory.rows[0]["valid"] is True


def test_the_latest_valid_run_of_an_op_and_layout_is_chosen_in_one_place() -> None:
    archive = Archive([row("r1"), row("r2", layout="sharded"), row("r3", valid="false"),
                       row("r4", time_to_last_rank_s=""), row("r5", op="save")])
    assert archive.runs() == ["r1", "r2", "r3", "r4", "r5"]
    latest = archive.latest("restore")
    assert latest is not None and latest["run_id"] == "r2"
    shared = archive.latest("restore", "shared")
    assert shared is not None and shared["run_id"] == "r1"
    assert archive.latest("startup") is None
    assert archive.without(["r2"]).runs() == ["r1", "r3", "r4", "r5"]


def test_several_archives_compose_in_order_and_split_by_file(tmp_path: Path) -> None:
    first, second = tmp_path / "first.csv", tmp_path / "second.csv"
    append_rows(first, [{**row("a1"), "schema": 6}])
    append_rows(second, [{**row("b1"), "schema": 6}, {**row("b2"), "schema": 6}])
    archive = Archive.open(first, second)
    assert archive.runs() == ["a1", "b1", "b2"] and archive.label == f"{first}, {second}"
    assert [part.runs() for part in archive.parts()] == [["a1"], ["b1", "b2"]]
    assert [archive.name_of(found) for found in archive.rows] == ["first.csv", "second.csv",
                                                                  "second.csv"]


def test_a_sidecar_is_read_on_demand_once_and_a_missing_one_is_a_note(tmp_path: Path) -> None:
    unpack(tmp_path)
    archive = Archive.open(tmp_path / "traced.csv")
    run_id = archive.runs()[-1]
    read = archive.sidecar(run_id)
    assert read.value is not None and read.value["run_id"] == run_id and not read.notes
    (tmp_path / "traced.runs" / f"{run_id}.json").unlink()
    assert archive.sidecar(run_id) is read   # cached: read once
    trace = archive.trace(run_id)
    assert trace is not None and trace.value is not None
    fresh = Archive.open(tmp_path / "traced.csv").sidecar(run_id)
    assert fresh.value is None and len(fresh.notes) == 1 and f"{run_id}.json" in fresh.notes[0]
    in_memory = Archive([row("r1")], sidecars={"r1": {"run_id": "r1"}})
    assert in_memory.sidecar("r1").value == {"run_id": "r1"}
    assert in_memory.sidecar("r2").value is None and in_memory.trace("r1") is None
