"""`stampede report --html` (and its old name, `stampede html`): the archive's verdict
(stampede.model.assessment: the layouts ranked, `stampede project`'s projection to
--target-ranks, `stampede mttr`'s T_MTTR) and its runs as one self-contained HTML file
(stampede.present.html): no network, readable on a phone, printable."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.flags import add_target_ranks, add_workload_arguments, workload_from
from stampede.commands.outputs import add_output

if TYPE_CHECKING:

    from stampede.commands import Subparsers
    from stampede.model.assessment import Assessment
    from stampede.model.workload import Workload
    from stampede.results.archived import Archive

DEFAULT_TARGET_RANKS = 16384
DEFAULT_TARGET_MTTR = "60s"   # the seed's sub-minute recovery


def add_target_arguments(sub: argparse.ArgumentParser) -> None:
    """The workload the verdict projects, and the recovery time the sizing aims at."""
    add_target_ranks(sub, default=DEFAULT_TARGET_RANKS,
                     help=f"rank count to project to (default {DEFAULT_TARGET_RANKS})")
    add_workload_arguments(sub)
    sub.add_argument("--target-mttr", default=DEFAULT_TARGET_MTTR, metavar="DURATION",
                     help="the recovery time the sizing aims at: what the storage must deliver "
                          f"for T_MTTR within it (default {DEFAULT_TARGET_MTTR})")


def target_of(args: argparse.Namespace) -> tuple[Workload, float]:
    """(the Workload, the target T_MTTR in seconds) of add_target_arguments' flags."""
    from stampede.errors import UsageError
    from stampede.units import parse_duration

    if args.target_ranks < 1:
        raise UsageError(f"--target-ranks {args.target_ranks}: must be at least 1")
    try:
        target_mttr_s = parse_duration(args.target_mttr)
    except ValueError as error:
        raise UsageError(f"--target-mttr: {error}") from None
    if target_mttr_s <= 0:
        raise UsageError(f"--target-mttr {args.target_mttr}: must be above 0")
    return workload_from(args, args.target_ranks), target_mttr_s


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "html", formatter_class=formatter,
        help="Write one self-contained HTML report of an archive: the verdict (which layout, "
             "time to last rank and T_MTTR projected to --target-ranks, the dominant term, "
             "the band), tables, CDFs, scaling curves, per-rank timelines, context.",
        description="One self-contained HTML file from an archive and its sidecars.")
    sub.add_argument("archive", metavar="ARCHIVE", help="a CSV archive (its sidecars beside it)")
    add_output(sub, "-o", "--output", default="", metavar="FILE", paths=_report_path,
               help="where to write it (default: the archive's name with .html)")
    add_target_arguments(sub)
    sub.set_defaults(func=cmd_html)


def _report_path(args: argparse.Namespace) -> list[Path]:
    """-o, or its default: the archive's name with .html."""
    return [Path(args.output or Path(args.archive).with_suffix(".html"))]


def write_report(archive: Archive, output: str, workload: Workload, target_mttr_s: float,
                 notes: tuple[str, ...] = ()) -> tuple[Path, Assessment]:
    """Assess the archive for the workload, render it, write the file (the path checked
    before: stampede.commands.outputs, or assess's outputs()); its path and the assessment."""
    from stampede.errors import UsageError
    from stampede.model.assessment import assess
    from stampede.present.html import render_html

    path = Path(output or archive.paths[0].with_suffix(".html"))
    rows = archive.rows
    if not rows:
        raise UsageError(f"{archive.label}: the archive holds no runs")
    assessment = assess(archive, workload, target_mttr_s)
    shown = archive.beside([rows[-1]["run_id"],
                            *(verdict.run_id for verdict in assessment.phases.values())])
    missing = shown.notes
    if not shown.sidecars and rows[-1]["warnings"].startswith("imported from"):
        missing = []   # an import has no sidecar by design
    for note in (*missing, *shown.damaged):   # the page says them too
        print(f"stampede: note: {note}", file=sys.stderr)
    page = render_html(archive.label, rows, shown.sidecars, assessment,
                       (*notes, *missing, *shown.damaged), shown.traces)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"-o {path}: cannot write it ({error.strerror})") from None
    return path, assessment


def cmd_html(args: argparse.Namespace) -> int:
    from stampede.commands.flags import alias_note
    from stampede.results.archived import Archive

    alias_note("html", "report ARCHIVE --html FILE")
    target = target_of(args)
    write_verdict(Archive.open(args.archive), args.output, target)
    return 0


def write_verdict(archive: Archive, output: str, target: tuple[Workload, float]) -> None:
    """write_report for add_target_arguments' target; what was written and the verdict's
    summary printed."""
    path, assessment = write_report(archive, output, *target)
    print(f"wrote {path}")
    for line in assessment.summary():
        print(f"  {line}")
