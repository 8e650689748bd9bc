"""`stampede html`: the archive's verdict (stampede.model.assessment: the layouts ranked,
`stampede project`'s projection to --target-ranks, `stampede mttr`'s T_MTTR) and its runs
as one self-contained HTML file (stampede.results.html): no network, readable on a phone,
printable."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEFAULT_TARGET_RANKS = 16384


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "html", formatter_class=formatter,
        help="Write one self-contained HTML report of an archive: the verdict (which layout, "
             "time to last rank and T_MTTR projected to --target-ranks, the dominant term, "
             "the band), tables, CDFs, scaling curves, per-rank timelines, context.",
        description="One self-contained HTML file from an archive and its sidecars.")
    sub.add_argument("archive", metavar="ARCHIVE", help="a CSV archive (its sidecars beside it)")
    sub.add_argument("-o", "--output", default="", metavar="FILE",
                     help="where to write it (default: the archive's name with .html)")
    sub.add_argument("--target-ranks", type=int, default=DEFAULT_TARGET_RANKS,
                     help=f"rank count to project to (default {DEFAULT_TARGET_RANKS})")
    sub.set_defaults(func=cmd_html)


def write_report(archive: str, output: str, target_ranks: int, notes: tuple[str, ...] = ()) -> Path:
    """Assess the archive, render it, write the file; its path."""
    from stampede.errors import UsageError
    from stampede.model.assessment import assess
    from stampede.results.archive import read_rows, sidecar_dir
    from stampede.results.html import render_html
    from stampede.results.plot import load_sidecar
    from stampede.values import refuse_overwrite

    if target_ranks < 1:
        raise UsageError(f"--target-ranks {target_ranks}: must be at least 1")
    path = Path(output or Path(archive).with_suffix(".html"))
    refuse_overwrite("-o", path, {"archive": Path(archive), "archive's sidecars": sidecar_dir(archive)})
    rows = read_rows(archive)
    if not rows:
        raise UsageError(f"{archive}: the archive holds no runs")
    assessment = assess([archive], target_ranks)
    missing: list[str] = []
    sidecars = {}
    for run_id in dict.fromkeys([rows[-1]["run_id"],
                                 *(verdict.run_id for verdict in assessment.phases.values())]):
        sidecar = load_sidecar(archive, run_id, missing)
        if sidecar is not None:
            sidecars[run_id] = sidecar
    if not sidecars and rows[-1].get("warnings", "").startswith("imported from"):
        missing = []   # an import has no sidecar by design
    page = render_html(archive, rows, sidecars, assessment, (*notes, *missing))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"-o {path}: cannot write it ({error.strerror})") from None
    return path


def cmd_html(args: argparse.Namespace) -> int:
    path = write_report(args.archive, args.output, args.target_ranks)
    print(f"wrote {path}")
    return 0
