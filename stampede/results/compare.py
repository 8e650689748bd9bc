"""`stampede compare`: two archives (or one archive grouped by a column) side by side.

Rows are matched on their configuration (MATCH_COLUMNS, less the grouping column, or
the columns of --match). Every valid run of a configuration counts, not the latest one
alone: for each side and metric, each run's value (a stampede row holds the median over
its iterations) is taken, and the side is summed up as the median over its runs, the
range of those run values (min-max) and the per-iteration range of all its runs (the
lowest _min to the highest _max). B / A is the ratio of the two medians. The metrics:
aggregate GB/s, ops/s (where bytes do not move on both sides: stat, open, mdtest's rows),
time to last rank, and p99 latency (not of the pseudo-ops, restore, save and their kin:
time to last rank says it).

The verdict follows pyperf's compare_to, with ranges instead of its t-test (an archive
keeps each run's min and max, not its samples): with two or more runs on each side, a
difference is "within spread" when the two ranges of run values overlap, else "better"
or "worse". With one run on a side (n=1), how much runs differ is unknown: the verdict
carries "(n=1)" and rests on the per-iteration ranges; where there are none (p99), on
the direction alone, with a "?", and a difference under NO_SPREAD_TOLERANCE is
"similar?". Cells are read with results.cells: a cell that is not a number is one error
naming the archive, line, column and value.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stampede.ops import PSEUDO_OPS
from stampede.results.cells import Row, cell
from stampede.results.columns import IDENTITY_COLUMNS
from stampede.results.tiers import TIER_SAVES

NO_SPREAD_TOLERANCE = 0.05
# Two rows measure the same thing when these are equal (the registry's identity columns:
# what they are of, layout, op, rank count, bytes per rank, and their configuration).
MATCH_COLUMNS = IDENTITY_COLUMNS
# metric column, its per-iteration spread columns (or None), and whether higher is better
METRICS = (
    ("agg_gbps", ("agg_gbps_min", "agg_gbps_max"), True),
    ("ops_per_s", ("ops_per_s_min", "ops_per_s_max"), True),
    ("time_to_last_rank_s", ("time_to_last_rank_min_s", "time_to_last_rank_max_s"), False),
    ("lat_p99_s", None, False),
)

Key = tuple[tuple[str, str], ...]


def within_spread(low_a: float, high_a: float, low_b: float, high_b: float) -> bool:
    """The one "tie within spread" rule, of compare's verdicts and the report's ranking:
    two measurements tie when their ranges [low, high] overlap (touching counts). A NaN
    bound (no range kept) ties nothing."""
    return low_a <= high_b and low_b <= high_a


@dataclass(frozen=True)
class Side:
    """One side's runs of one configuration, for one metric."""
    values: tuple[float, ...]   # each run's value (a run's row: its median over iterations)
    iteration_low: float        # the lowest per-iteration value of any run; NaN: none kept
    iteration_high: float

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a side of a comparison needs at least one run")

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def has_iteration_range(self) -> bool:
        return not (math.isnan(self.iteration_low) or math.isnan(self.iteration_high))


@dataclass(frozen=True)
class Comparison:
    key: Key                    # (column, value) that both sides share
    metric: str
    base: Side
    other: Side
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return self.other.median / self.base.median if self.base.median else math.nan

    @property
    def judged_by(self) -> str:
        """"runs" (n >= 2 on both sides), "iterations" (n=1 somewhere) or "direction"
        (n=1 and no per-iteration range: p99)."""
        if min(self.base.n, self.other.n) >= 2:
            return "runs"
        if self.base.has_iteration_range and self.other.has_iteration_range:
            return "iterations"
        return "direction"

    @property
    def within_spread(self) -> bool | None:
        """Whether the two sides' ranges overlap; None: no range to judge by."""
        a, b = self.base, self.other
        if self.judged_by == "runs":
            return within_spread(a.low, a.high, b.low, b.high)
        if self.judged_by == "iterations":
            return within_spread(a.iteration_low, a.iteration_high, b.iteration_low,
                                 b.iteration_high)
        return None

    @property
    def verdict(self) -> str:
        single = "" if self.judged_by == "runs" else " (n=1)"
        if self.within_spread:
            return "within spread" + single
        if self.within_spread is None and abs(self.ratio - 1) < NO_SPREAD_TOLERANCE:
            return "similar?" + single
        better = (self.other.median > self.base.median) == self.higher_is_better
        return ("better" if better else "worse") + \
            ("?" if self.within_spread is None else "") + single


def _key(row: Row, match: tuple[str, ...], skip: str) -> Key:
    return tuple((column, cell(row[column])) for column in match if column != skip)


def runs_by_config(rows: Iterable[Row], skip: str = "", match: tuple[str, ...] = MATCH_COLUMNS
                   ) -> dict[Key, dict[str, list[Row]]]:
    """The valid rows of each configuration, by run (archive order is time order). A run
    holds several rows of one configuration only when --match leaves out what tells them
    apart (e.g. layout)."""
    found: dict[Key, dict[str, list[Row]]] = {}
    for row in rows:
        if not row["valid"]:
            continue
        found.setdefault(_key(row, match, skip), {}).setdefault(row["run_id"], []).append(row)
    return found


def _side(runs: dict[str, list[Row]], metric: str, spread: tuple[str, str] | None) -> Side | None:
    """One side of a metric: a value per run (the median of its rows); None when no run
    has the metric."""
    values, lows, highs = [], [], []
    for rows in runs.values():
        measured = [value for value in (row[metric] for row in rows) if not math.isnan(value)]
        if not measured:
            continue
        values.append(statistics.median(measured))
        if spread is not None:
            lows += [row[spread[0]] for row in rows]
            highs += [row[spread[1]] for row in rows]
    if not values:
        return None
    low = min((value for value in lows if not math.isnan(value)), default=math.nan)
    high = max((value for value in highs if not math.isnan(value)), default=math.nan)
    return Side(tuple(values), low, high)


def _metrics_of(op: str) -> list[tuple[str, tuple[str, str] | None, bool]]:
    """The metrics that mean something for an op: across ranks, the completion op's time
    to last rank says what its p99 would, with a spread."""
    return [entry for entry in METRICS
            if not (entry[0] == "lat_p99_s" and op in PSEUDO_OPS)]


def compare_rows(base_rows: list[Row], other_rows: list[Row], skip: str = "",
                 match: tuple[str, ...] = MATCH_COLUMNS) -> list[Comparison]:
    """Every metric of every configuration present on both sides, over all their runs (the
    rows' cells checked when they were read: stampede.results.archived)."""
    base = runs_by_config(base_rows, skip, match)
    other = runs_by_config(other_rows, skip, match)
    result: list[Comparison] = []
    for key in base.keys() & other.keys():
        op = next(iter(base[key].values()))[0]["op"]
        found = {}
        for metric, spread, higher in _metrics_of(op):
            side_a, side_b = _side(base[key], metric, spread), _side(other[key], metric, spread)
            if side_a is not None and side_b is not None:
                found[metric] = Comparison(key, metric, side_a, side_b, higher)
        if "agg_gbps" in found:  # where bytes move on both sides, GB/s says what ops/s would
            found.pop("ops_per_s", None)
        result += found.values()
    return sorted(result, key=lambda c: ([value for _, value in c.key], c.metric))


INVALID = "INVALID"   # the standing of a layout whose run was not valid
LOW, HIGH = "time_to_last_rank_min_s", "time_to_last_rank_max_s"   # a row's spread


def ranked(rows: Sequence[Row], op: str = "restore") -> list[tuple[Row, str]]:
    """Rows of the completion op (restore, save), valid ones by time to last rank first,
    each with how it stands against the best: a tie when their per-iteration min-max
    ranges overlap (within_spread, the rule of `stampede compare` too), else how much
    slower. The tiers of one save in tiers (stampede rejoin) are not alternatives: they
    come in their order, nearest first, each standing "-"."""
    restores = [row for row in rows if row["op"] == op]
    if restores and all(row["layout"] in TIER_SAVES for row in restores):
        return [(row, "-" if row["valid"] else INVALID) for row in
                sorted(restores, key=lambda row: TIER_SAVES.index(row["layout"]))]
    valid = sorted((row for row in restores if row["valid"]),
                   key=lambda row: row["time_to_last_rank_s"])
    ranked: list[tuple[Row, str]] = []
    for row in valid:
        best = valid[0]
        if row is best:
            standing = "best" if len(valid) > 1 else "-"
        elif within_spread(row[LOW], row[HIGH], best[LOW],
                           best[HIGH]):
            standing = "tie (within spread)"
        else:
            ratio = row["time_to_last_rank_s"] / best["time_to_last_rank_s"]
            standing = f"+{ratio - 1:.0%}"
        ranked.append((row, standing))
    ranked += [(row, INVALID) for row in restores if not row["valid"]]
    return ranked
