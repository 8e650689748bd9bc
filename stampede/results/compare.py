"""`stampede compare`: two archives (or one archive grouped by a column) side by side.

Rows are matched on their configuration (CONFIG_COLUMNS, less the grouping column); for
each match the latest run of each side is compared on aggregate GB/s, time to last rank
and p99 latency, as the ratio B / A. A difference is marked as within the runs' own
spread when the two sides' per-iteration min-max ranges overlap (pyperf's compare_to
asks the same question with a t-test; stampede archives keep min and max, not samples).
p99 has no per-iteration spread: its verdict carries a "?" and differences under
NO_SPREAD_TOLERANCE are shown as "similar".
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

NO_SPREAD_TOLERANCE = 0.05
# What must be equal for two rows to measure the same thing.
CONFIG_COLUMNS = ("layout", "op", "nranks", "cache", "format", "bytes_per_rank", "block_bytes",
                  "pattern", "replicas", "broadcast_group", "index_bytes", "stat_count",
                  "open_count", "verify", "jitter", "h2d", "backend", "fs_type")
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
                     match: tuple[str, ...] = CONFIG_COLUMNS) -> dict[Key, dict[str, str]]:
    """The last valid row (archive order is time order) for each configuration."""
    chosen = {}
    for row in rows:
        if row.get("valid") == "false":
            continue
        key = tuple((column, row.get(column, "")) for column in match if column != skip)
        chosen[key] = row
    return chosen


def compare_rows(base_rows: list[dict[str, str]], other_rows: list[dict[str, str]],
                 skip: str = "", match: tuple[str, ...] = CONFIG_COLUMNS) -> list[Comparison]:
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


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "compare", formatter_class=formatter,
        help="Compare two archives (or one archive's groups, --by layout): ratios of GB/s, "
             "time to last rank and p99, marked when within the runs' own spread.",
        description="Compare archived runs matched on configuration.",
        epilog=__doc__)
    sub.add_argument("archives", nargs="+", metavar="ARCHIVE", help="one or two CSV archives")
    sub.add_argument("--by", default="", metavar="COLUMN",
                     help="with one archive: compare the groups of this column (e.g. layout, "
                          "cache, job); the first value seen is the baseline")
    sub.add_argument("--match", default=",".join(CONFIG_COLUMNS), metavar="COLUMNS",
                     help="columns that must be equal for rows to be compared (default: the "
                          "whole configuration); e.g. --match op,layout,nranks to set IOR rows "
                          "imported with `stampede import` against stampede's")
    sub.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.results.archive import COLUMNS, read_rows
    from stampede.results.report import make_console, render_comparison

    match = tuple(column.strip() for column in args.match.split(",") if column.strip())
    unknown = [column for column in match if column not in COLUMNS]
    if unknown or not match:
        raise UsageError(f"--match {args.match!r}: not archive columns: {unknown}")
    if len(args.archives) == 2 and not args.by:
        base, other = (read_rows(path) for path in args.archives)
        sections = [(f"A = {args.archives[0]}, B = {args.archives[1]}",
                     compare_rows(base, other, match=match))]
    elif len(args.archives) == 1 and args.by:
        if args.by not in COLUMNS:
            raise UsageError(f"--by {args.by!r}: not an archive column (e.g. layout, cache, job)")
        rows = read_rows(args.archives[0])
        values = list(dict.fromkeys(row.get(args.by, "") for row in rows))
        if len(values) < 2:
            raise UsageError(f"--by {args.by}: the archive holds one value only ({values})")
        base = [row for row in rows if row.get(args.by, "") == values[0]]
        sections = [(f"A = {args.by} {values[0]}, B = {args.by} {value}",
                     compare_rows(base, [row for row in rows if row.get(args.by, "") == value],
                                  skip=args.by, match=match)) for value in values[1:]]
    else:
        raise UsageError("compare takes two archives, or one archive and --by COLUMN")
    if not any(comparisons for _, comparisons in sections):
        raise UsageError("no configuration appears on both sides",
                         hint=f"rows are matched on {', '.join(match)}; --match chooses")
    console = make_console()
    for title, comparisons in sections:
        render_comparison(title, comparisons, console)
    return 0
