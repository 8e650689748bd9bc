"""One CSV cell, both ways: how the archive writes a value (`cell`) and how every reader
(report, compare, project, mttr, plot) reads it back (`number`, `whole`, `flag`, `text`),
as the column registry (stampede.results.columns) says the column holds.

Written: floats in full precision (repr: a 2 µs stat must survive), NaN and None as
empty, booleans as true/false. Read: an empty cell is "no value" (NaN, 0 or ""), never
an error; a cell that is not what its column holds (a hand-edited archive) is one
UsageError naming the archive, its line, the column and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from stampede.errors import UsageError
from stampede.results.columns import BY_NAME, KINDS

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
    _registered(column, "text", "number", "whole", "flag")
    return row.get(column) or ""


def number(row: Row, column: str) -> float:
    """A cell of a number column (or a whole-number one) as a float; NaN when empty."""
    kind = _registered(column, "number", "whole")
    value = row.get(column) or ""
    if not value:
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise bad_cell(row, column, kind) from None


def whole(row: Row, column: str) -> int:
    """A cell of a whole-number column; 0 when empty."""
    kind = _registered(column, "whole")
    value = row.get(column) or ""
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise bad_cell(row, column, kind) from None


def flag(row: Row, column: str) -> bool:
    """A cell of a true/false column; False when empty."""
    kind = _registered(column, "flag")
    value = row.get(column) or "false"
    if value not in ("true", "false"):
        raise bad_cell(row, column, kind)
    return value == "true"


def _registered(column: str, *kinds: str) -> str:
    """The column's kind, which must be one of `kinds`: reading a cell as what its column
    does not hold is a bug here, not in the archive."""
    kind = BY_NAME[column].kind
    if kind not in kinds:
        raise TypeError(f"archive column {column} holds {kind}, not {' or '.join(kinds)}")
    return kind


def bad_cell(row: Row, column: str, kind: str) -> UsageError:
    """One error for a cell that is not what its column holds: where, which, what."""
    where = f"{row[SOURCE]}, line {row[LINE]}" if SOURCE in row else "an archive row"
    unit = BY_NAME[column].unit
    allowed = KINDS[kind] + (f" (in {unit})" if unit else "") + ", or empty"
    return UsageError(f"{where}: column {column} = {row.get(column)!r}: not {KINDS[kind]}; "
                      f"allowed: {allowed}",
                      hint="the archive was edited by hand or is not stampede's")
