"""`stampede compare`: two archives (or one archive grouped by a column) side by side.

Rows are matched on their configuration (MATCH_COLUMNS, less the grouping column); for
each match the latest run of each side is compared on aggregate GB/s, time to last rank
and p99 latency, as the ratio B / A. A difference is marked as within the runs' own
spread when the two sides' per-iteration min-max ranges overlap (pyperf's compare_to
asks the same question with a t-test; stampede archives keep min and max, not samples).
p99 has no per-iteration spread: its verdict carries a "?" and differences under
NO_SPREAD_TOLERANCE are shown as "similar".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stampede.results.archive import CONFIG_COLUMNS

NO_SPREAD_TOLERANCE = 0.05
# Two rows measure the same thing when these are equal (archive.CONFIG_COLUMNS and what
# they are of: layout, op, rank count, bytes per rank).
MATCH_COLUMNS = ("layout", "op", "nranks", "bytes_per_rank", *CONFIG_COLUMNS)
# metric column, its spread columns (or None), and whether higher is better
METRICS = (
    ("agg_gbps", ("agg_gbps_min", "agg_gbps_max"), True),
    ("time_to_last_rank_s", ("time_to_last_rank_min_s", "time_to_last_rank_max_s"), False),
    ("lat_p99_s", None, False),
)


@dataclass(frozen=True)
class Comparison:
    key: tuple[tuple[str, str], ...]   # (column, value) that both sides share
    metric: str
    base: float
    other: float
    within_spread: bool | None         # None: no spread to judge by
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return self.other / self.base if self.base else math.nan

    @property
    def verdict(self) -> str:
        if self.within_spread:
            return "within spread"
        if self.within_spread is None and abs(self.ratio - 1) < NO_SPREAD_TOLERANCE:
            return "similar?"
        better = (self.other > self.base) == self.higher_is_better
        return ("better" if better else "worse") + ("?" if self.within_spread is None else "")


def _number(row: dict[str, str], column: str) -> float:
    text = row.get(column, "")
    return float(text) if text else math.nan


def _overlap(base: dict[str, str], other: dict[str, str], columns: tuple[str, str]) -> bool | None:
    low_a, high_a = (_number(base, c) for c in columns)
    low_b, high_b = (_number(other, c) for c in columns)
    if any(math.isnan(value) for value in (low_a, high_a, low_b, high_b)):
        return None
    return low_a <= high_b and low_b <= high_a


Key = tuple[tuple[str, str], ...]


def latest_by_config(rows: list[dict[str, str]], skip: str = "",
                     match: tuple[str, ...] = MATCH_COLUMNS) -> dict[Key, dict[str, str]]:
    """The last valid row (archive order is time order) for each configuration."""
    chosen = {}
    for row in rows:
        if row.get("valid") == "false":
            continue
        key = tuple((column, row.get(column, "")) for column in match if column != skip)
        chosen[key] = row
    return chosen


def compare_rows(base_rows: list[dict[str, str]], other_rows: list[dict[str, str]],
                 skip: str = "", match: tuple[str, ...] = MATCH_COLUMNS) -> list[Comparison]:
    """Every metric of every configuration present on both sides."""
    base = latest_by_config(base_rows, skip, match)
    other = latest_by_config(other_rows, skip, match)
    result = []
    for key in base.keys() & other.keys():
        for metric, spread_columns, higher in METRICS:
            value_a, value_b = _number(base[key], metric), _number(other[key], metric)
            if metric == "lat_p99_s" and base[key]["op"] in ("restore", "startup"):
                continue  # across ranks, time to last rank says it with a spread
            if math.isnan(value_a) or math.isnan(value_b):
                continue
            within = _overlap(base[key], other[key], spread_columns) if spread_columns else None
            result.append(Comparison(key, metric, value_a, value_b, within, higher))
    return sorted(result, key=lambda c: ([value for _, value in c.key], c.metric))
