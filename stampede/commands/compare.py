"""`stampede compare`: two archives (or one archive's groups) side by side; the matching
and the verdicts are stampede.results.compare's."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from stampede.results import compare as model
from stampede.results.compare import MATCH_COLUMNS, compare_rows

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "compare", formatter_class=formatter,
        help="Compare two archives (or one archive's groups, --by layout) over all their runs: "
             "ratios of the medians of GB/s, ops/s, time to last rank and p99, marked when "
             "within the runs' spread.",
        description="Compare archived runs matched on configuration.",
        epilog=model.__doc__)
    sub.add_argument("archives", nargs="+", metavar="ARCHIVE", help="one or two CSV archives")
    sub.add_argument("--by", default="", metavar="COLUMN",
                     help="with one archive: compare the groups of this column (e.g. layout, "
                          "cache, job); the baseline is the first value seen whose runs share a "
                          "configuration with another value's")
    sub.add_argument("--match", default=",".join(MATCH_COLUMNS), metavar="COLUMNS",
                     help="columns that must be equal for rows to be compared (default: the "
                          "whole configuration); e.g. --match op,layout,nranks to set IOR rows "
                          "imported with `stampede import` against stampede's, or "
                          "op,nranks,cache for mdtest's stat rows against a stat storm")
    sub.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.present.report import make_console
    from stampede.present.report_models import render_comparison
    from stampede.results.archive import COLUMNS
    from stampede.results.archived import Archive
    from stampede.results.cells import cell

    match = tuple(column.strip() for column in args.match.split(",") if column.strip())
    unknown = [column for column in match if column not in COLUMNS]
    if unknown or not match:
        raise UsageError(f"--match {args.match!r}: not archive columns: {unknown}")
    if len(args.archives) == 2 and not args.by:
        base, other = (Archive.open(path).rows for path in args.archives)
        sections = [(f"A = {args.archives[0]}, B = {args.archives[1]}",
                     compare_rows(base, other, match=match))]
    elif len(args.archives) == 1 and args.by:
        if args.by not in COLUMNS:
            raise UsageError(f"--by {args.by!r}: not an archive column (e.g. layout, cache, job)")
        rows = Archive.open(args.archives[0]).rows
        # a row without a value of the column (a startup run has no layout) is in no group
        values = [value for value in dict.fromkeys(cell(row[args.by]) for row in rows) if value]
        if len(values) < 2:
            raise UsageError(f"--by {args.by}: the archive holds one value only ({values})")
        groups = {value: [row for row in rows if cell(row[args.by]) == value] for value in values}
        # the baseline: the first value whose rows share a configuration with another's (a
        # demo's archive starts with startup runs, layout "startup", which match no restore)
        sections = []
        for first in values:
            sections = [(f"A = {args.by} {first}, B = {args.by} {value}",
                         compare_rows(groups[first], groups[value], skip=args.by, match=match))
                        for value in values[values.index(first) + 1:]]
            if any(comparisons for _, comparisons in sections):
                break
    else:
        raise UsageError("compare takes two archives, or one archive and --by COLUMN")
    if not any(comparisons for _, comparisons in sections):
        raise UsageError("no configuration appears on both sides",
                         hint=f"rows are matched on {', '.join(match)}; --match chooses")
    console = make_console()
    for title, comparisons in sections:
        render_comparison(title, comparisons, console)
    return 0
