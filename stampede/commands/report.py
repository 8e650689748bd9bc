"""`stampede report`: an archive presented, one way: the terminal report re-rendered from
the CSV alone (the report `run` prints is rendered from the same rows, so the two agree),
and with --html the verdict as one HTML page (stampede.commands.html), with --png the
figures as PNGs (stampede.commands.plot), in the same call."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.html import add_target_arguments
from stampede.commands.outputs import OUTPUT_DIRECTORY, add_output
from stampede.results.definitions import METRICS

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    report = commands.add_parser("report", help="Present an archive: its runs re-rendered in "
                                                "the terminal, with --html one self-contained "
                                                "HTML verdict, with --png its figures.",
                                 description="Re-render archived runs from the CSV alone: the "
                                             "last run in full, then every run's restore; "
                                             "--html and --png also write the page and the "
                                             "figures.",
                                 formatter_class=formatter, epilog=METRICS)
    report.add_argument("archive", help="CSV archive, e.g. results/quickstart.csv")
    report.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                        help="show this run in full (repeatable); the last one given is the "
                             "run of the cdf and timeline figures (--png)")
    report.add_argument("--last", type=int, default=1, help="show the last N runs in full")
    add_output(report, "--html", default="", metavar="FILE",
               help="also write one self-contained HTML page: the verdict (which "
                    "layout, time to last rank and T_MTTR projected to the --target-… "
                    "workload, the dominant term, the band), tables, figures")
    add_output(report, "--png", kind=OUTPUT_DIRECTORY, default="", metavar="DIR",
               help="also draw the figures as PNGs in DIR (made if missing; needs "
                    "matplotlib): ARCHIVE-cdf.png, ARCHIVE-scaling.png, ARCHIVE-timeline.png")
    add_target_arguments(report)
    report.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from stampede.commands.html import target_of, write_verdict
    from stampede.commands.plot import figure_paths, write_figures
    from stampede.errors import UsageError
    from stampede.present.plot import KINDS
    from stampede.present.report import make_console, render_archive
    from stampede.results.archived import Archive

    if args.last < 1:   # 0 once showed 1 without a word
        raise UsageError(f"--last {args.last}: must be at least 1")
    target = target_of(args) if args.html else None   # --html and --png: commands.outputs
    figures = figure_paths(Path(args.png) / Path(args.archive).stem, KINDS) if args.png else {}
    archive = Archive.open(args.archive)   # read once: the terminal, the figures, the page
    if not archive:
        raise UsageError(f"{args.archive}: the archive holds no runs")
    render_archive(archive.rows, make_console(), args.run, args.last)
    if figures:
        write_figures(archive, figures, args.run[-1] if args.run else None, None)
    if target is not None:
        write_verdict(archive, args.html, target)
    return 0
