"""One CSV cell, both ways: how the archive writes a value (`cell`) and how every reader
(report, compare, project, mttr, plot) reads it back (`number`, `whole`, `text`).

Written: floats in full precision (repr: a 2 µs stat must survive), NaN and None as
empty, booleans as true/false. Read: an empty cell is "no value" (NaN, 0 or ""), never
an error; a cell that is not what its column holds (a hand-edited archive) is one
UsageError naming the archive, its line, the column and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stampede.errors import UsageError

Row = Mapping[str, str]
# Set by archive.read_rows on every row it returns: where the row came from, for errors.
SOURCE, LINE = "_source", "_line"


def cell(value: object) -> str:
    """One CSV cell: floats in full precision, NaN and None as empty, bools as true/false."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def text(row: Row, column: str) -> str:
    return row.get(column) or ""


def number(row: Row, column: str) -> float:
    """A float cell; NaN when empty."""
    value = row.get(column) or ""
    if not value:
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise bad_cell(row, column, "not a number") from None


def whole(row: Row, column: str) -> int:
    """An integer cell; 0 when empty."""
    value = row.get(column) or ""
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise bad_cell(row, column, "not a whole number") from None


def bad_cell(row: Row, column: str, what: str) -> UsageError:
    where = f"{row[SOURCE]}, line {row[LINE]}" if SOURCE in row else "an archive row"
    return UsageError(f"{where}: column {column} = {row.get(column)!r}: {what}",
                      hint="the archive was edited by hand or is not stampede's")
