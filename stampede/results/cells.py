"""One CSV cell, both ways: how the archive writes a value (`cell`) and how a row is read
back, once, for every reader (report, compare, project, mttr, plot): `typed`, as the column
registry (stampede.results.columns) says each column holds.

Written: floats in full precision (repr: a 2 µs stat must survive), NaN and None as
empty, booleans as true/false. Read: an empty cell is "no value" (NaN, 0, False or ""),
never an error; a cell that is not what its column holds (a hand-edited archive) is one
UsageError naming the archive, its line, the column and the value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from stampede.errors import UsageError
from stampede.results.columns import BY_NAME, KINDS

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


def typed(row: Mapping[str, object]) -> Row:
    """The row as the read side sees it: every registered column present and holding what
    the column registry says (a float, NaN when empty; an int, 0 when empty; a bool, False
    when empty; a str), other keys (SOURCE, LINE, a column of a newer stampede) as given.
    A cell that is not what its column holds is bad_cell's one UsageError. A Row is typed
    already and comes back as it is."""
    if isinstance(row, Row):
        return row
    found = Row(row)
    for name, column in BY_NAME.items():
        value = row.get(name)
        found[name] = _READ[column.kind](row, name, value if value is not None else "")
    return found


class Row(dict[str, Any]):
    """A row whose cells are typed (`typed`): what every reader of an archive gets (an
    empty Row: no such row)."""


def _number(row: Mapping[str, object], column: str, value: object) -> float:
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    if value == "":
        return math.nan
    try:
        return float(str(value))
    except ValueError:
        raise bad_cell(row, column) from None


def _whole(row: Mapping[str, object], column: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if value == "":
        return 0
    try:
        return int(str(value))
    except ValueError:
        raise bad_cell(row, column) from None


def _flag(row: Mapping[str, object], column: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if value not in ("", "true", "false"):
        raise bad_cell(row, column)
    return value == "true"


def _text(row: Mapping[str, object], column: str, value: object) -> str:
    return value if isinstance(value, str) else cell(value)


_READ: dict[str, Callable[[Mapping[str, object], str, object], object]] = {
    "number": _number, "whole": _whole, "flag": _flag, "text": _text}


def bad_cell(row: Mapping[str, object], column: str) -> UsageError:
    """One error for a cell that is not what its column holds: where, which, what."""
    where = f"{row[SOURCE]}, line {row[LINE]}" if SOURCE in row else "an archive row"
    kind, unit = BY_NAME[column].kind, BY_NAME[column].unit
    allowed = KINDS[kind] + (f" (in {unit})" if unit else "") + ", or empty"
    return UsageError(f"{where}: column {column} = {row.get(column)!r}: not {KINDS[kind]}; "
                      f"allowed: {allowed}",
                      hint="the archive was edited by hand or is not stampede's")
