"""`stampede report`: archived runs re-rendered from the CSV alone (the report `run`
prints is rendered from the same rows, so the two agree)."""

from __future__ import annotations

import argparse
from typing import Any

from stampede.results.definitions import METRICS


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    report = commands.add_parser("report", help="Re-render archived runs from a CSV archive.",
                                 description="Re-render archived runs from the CSV alone: the "
                                             "last run in full, then every run's restore.",
                                 formatter_class=formatter, epilog=METRICS)
    report.add_argument("archive", help="CSV archive, e.g. results/quickstart.csv")
    report.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                        help="show this run in full (repeatable)")
    report.add_argument("--last", type=int, default=1, help="show the last N runs in full")
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.present.report import make_console, render_archive
    from stampede.results.archive import read_rows

    if args.last < 1:   # 0 once showed 1 without a word
        raise UsageError(f"--last {args.last}: must be at least 1")
    rows = read_rows(args.archive)
    if not rows:
        raise UsageError(f"{args.archive}: the archive holds no runs")
    render_archive(rows, make_console(), args.run, args.last)
    return 0
