"""The column registry: the README's section is generated from it and current, its
`since` agrees with real archives of schema 1 and 4 (tests/data: written by stampede at
those schemas, a run, a loaders run and a gpu sweep), typed reads say what a bad cell is,
and old rows read in schema 5's terms, reported and compared as new ones."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.results.archive import append_rows, read_rows
from stampede.results.cells import typed
from stampede.results.columns import (
    ARCHIVE_SCHEMA,
    BEGIN,
    BY_NAME,
    COLUMNS,
    END,
    IDENTITY_COLUMNS,
    KINDS,
    REGISTRY,
    render,
)
from stampede.results.loaders import loader_lines

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SCHEMA_1, SCHEMA_4 = DATA / "archive-schema1.csv", DATA / "archive-schema4.csv"


def _header(path: Path) -> list[str]:
    with open(path, newline="") as stream:
        return next(csv.reader(stream))


def test_the_readme_section_is_the_registry_rendered() -> None:
    text = (REPO / "results" / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    shown = text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip("\n")
    assert shown == render().strip("\n"), (
        "results/README.md's column section is stale: regenerate it with "
        "`python -m stampede.results.columns --write results/README.md`")
    assert (REPO / "stampede" / "bundled" / "results-README.md").read_text() == text


def test_every_column_once_with_a_kind_a_meaning_and_a_schema() -> None:
    assert len(COLUMNS) == len(set(COLUMNS)) == len(REGISTRY)
    for column in REGISTRY:
        assert column.kind in KINDS and column.meaning, column
        assert 1 <= column.since <= ARCHIVE_SCHEMA, column
    assert {"layout", "op", "nranks", "tool", "backend", "phase"} <= set(IDENTITY_COLUMNS)
    assert not {"run_id", "timestamp", "agg_gbps", "hosts"} & set(IDENTITY_COLUMNS)


@pytest.mark.parametrize(("archive", "schema"), [(SCHEMA_1, 1), (SCHEMA_4, 4)])
def test_since_is_what_archives_of_that_schema_hold(archive: Path, schema: int) -> None:
    """(No archive of schema 2 or 3 is kept: their columns lie between these two.)"""
    with open(archive, newline="") as stream:
        assert {row["schema"] for row in csv.DictReader(stream)} == {str(schema)}
    assert set(_header(archive)) == {column.name for column in REGISTRY
                                     if column.since <= schema}


def test_the_written_header_is_the_registry(tmp_path: Path) -> None:
    append_rows(tmp_path / "a.csv", [{"run_id": "r", "op": "restore"}])
    assert _header(tmp_path / "a.csv") == list(COLUMNS)
    assert COLUMNS.index("tool") == COLUMNS.index("restored_from") + 1


def test_a_bad_cell_is_one_error_naming_where_what_and_what_is_allowed(tmp_path: Path) -> None:
    archive = tmp_path / "a.csv"
    cases = (("nranks", "2.5", "'2.5': not a whole number; allowed: a whole number, or empty"),
             ("valid", "yes", "'yes': not true or false; allowed: true or false, or empty"),
             ("agg_gbps", "fast",
              "'fast': not a number; allowed: a number (in GB/s), or empty"))
    for column, value, said in cases:
        archive.unlink(missing_ok=True)
        append_rows(archive, [{"run_id": "r", "op": "restore", column: value}])
        row, = read_rows(archive)
        with pytest.raises(UsageError) as error:
            typed(row)
        assert error.value.message == f"{archive}, line 2: column {column} = {said}"


def test_a_row_is_typed_once_as_its_columns_hold() -> None:
    row = typed({"run_id": "r", "agg_gbps": "1.5", "nranks": "4", "valid": "true",
                 "mine": "kept"})
    assert (row["agg_gbps"], row["nranks"], row["valid"], row["mine"]) == (1.5, 4, True, "kept")
    assert type(row["nranks"]) is int and type(row["agg_gbps"]) is float
    # every registered column is there, empty as "no value" of its kind
    assert math.isnan(row["lat_p50_s"]) and row["bytes_total"] == 0 and row["subset"] is False
    assert row["job"] == "" and set(BY_NAME) <= set(row)
    assert typed(row) is row   # a typed row comes back as it is
    # a value held already (a row built in memory) is kept as its kind
    assert typed({"nranks": 2, "agg_gbps": 3, "valid": False})["agg_gbps"] == 3.0


def test_rows_of_schema_4_read_as_what_they_measured() -> None:
    rows = read_rows(SCHEMA_4)
    kinds = {(row["job"], row["tool"], row["backend"], row["phase"]) for row in rows}
    assert kinds == {("quickstart", "stampede", "posix", "restore"),
                     ("gpu", "stampede", "-", "h2d"), ("gpu", "stampede", "posix", "h2d"),
                     ("loaders", "stampede", "posix", "restore"),
                     ("loaders", "safetensors", "posix", "restore")}
    assert {row["layout"] for row in rows if row["phase"] == "h2d" and row["backend"] == "-"} \
        == {"pageable"}
    assert all(row["schema"] == "4" for row in rows)   # as written: the derivation is on read
    lines = loader_lines([typed(row) for row in rows if row["job"] == "loaders"])
    assert [(line.loader, line.policy) for line in lines] == \
        [("stampede (posix)", "files"), ("safetensors", "files")]
    assert math.isnan(lines[0].efficiency) and lines[1].efficiency > 0
    assert lines[1].dominant.split()[0] in ("header", "load", "touch", "other")


def test_old_and_new_rows_are_the_same_measurement(tmp_path: Path) -> None:
    """A schema-4 loaders row and the same row written by schema 5 (tool column, honest
    backend) read alike in every identity column."""
    old = next(row for row in read_rows(SCHEMA_4) if row["tool"] == "safetensors")
    written = {column: old[column] for column in COLUMNS}
    append_rows(tmp_path / "new.csv", [{**written, "schema": ARCHIVE_SCHEMA}])
    new, = read_rows(tmp_path / "new.csv")
    assert {c: new[c] for c in IDENTITY_COLUMNS} == {c: old[c] for c in IDENTITY_COLUMNS}
    assert BY_NAME["tool"].since == 5


@pytest.mark.parametrize("archive", [SCHEMA_1, SCHEMA_4])
def test_old_archives_are_reported_and_compared(stampede, tmp_path: Path, archive: Path) -> None:
    reported = stampede("report", str(archive), "--last", "3")
    assert reported.returncode == 0, reported.stderr
    assert "Restore: time until every rank holds its bytes" in reported.stdout
    if archive == SCHEMA_4:
        assert "Host -> device, per rank" in reported.stdout
    copy = tmp_path / "copy.csv"
    shutil.copyfile(archive, copy)
    compared = stampede("compare", str(archive), str(copy))
    assert compared.returncode == 0, compared.stderr
    assert "restore" in compared.stdout and "1.00" in compared.stdout
    grouped = stampede("compare", str(archive), "--by", "layout", "--match", "op,nranks,cache")
    assert grouped.returncode == 0, grouped.stderr
