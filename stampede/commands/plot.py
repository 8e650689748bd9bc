"""`stampede report --png` (and its old name, `stampede plot`): an archive and its sidecars
drawn as PNGs (the figures are stampede.present.plot's). The top level imports the stdlib
only: --help imports it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import add_output
from stampede.present.plot import INSTALL_HINT, KINDS

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.results.archived import Archive

PLOT_HELP = """\
output: with --kind all (the default) -o is a stem: -o out.png (or -o out) writes
  out-cdf.png, out-scaling.png and out-timeline.png; with one kind, -o is that file.
  Default -o: the archive's path with .png (results/job.csv -> results/job-cdf.png, ...).
figures:
  cdf       latency CDF per op (panel) and layout (line) of one run, from the sidecar's
            histograms (buckets 1 ns wide below 100 ns, then 2%; iterations and ranks
            pooled)
  scaling   aggregate GB/s (restore, and read) and time to last rank against ranks, one
            line per layout, over every valid run in the archive; median where runs share
            a rank count, error bars from the *_min/*_max (iteration spread) columns
  timeline  per rank: a bar from its first op's start to done, marks at first byte and
            last read (from the sidecar), one panel per layout, one iteration
--run picks the run of cdf and timeline (default: the archive's last); runs without a
sidecar are skipped with a note. matplotlib is optional: """ + INSTALL_HINT


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    """Add `stampede plot` to the CLI (called on every start: nothing heavy here)."""
    sub = commands.add_parser(
        "plot", formatter_class=formatter, epilog=PLOT_HELP,
        help="Draw an archive as PNGs: latency CDFs, GB/s and time to last rank against "
             "ranks, and one run's per-rank timeline (needs matplotlib).",
        description="Draw an archive (CSV) and its JSON sidecars as PNG figures.")
    sub.add_argument("archive", help="CSV archive, e.g. results/quickstart.csv")
    add_output(sub, "-o", "--output", default=None, metavar="PATH", paths=_figure_files,
               help="output file (one kind) or stem (--kind all); default: the archive's "
                    "path with .png")
    sub.add_argument("--kind", choices=(*KINDS, "all"), default="all",
                     help="which figure to draw (default all)")
    sub.add_argument("--run", default=None, metavar="RUN_ID",
                     help="run of the cdf and timeline figures (default: the last)")
    sub.add_argument("--iteration", type=int, default=None, metavar="N",
                     help="timeline: measured iteration N (0-based; default: the median one)")
    sub.set_defaults(func=cmd_plot)


def _kinds(args: argparse.Namespace) -> tuple[str, ...]:
    return KINDS if args.kind == "all" else (args.kind,)


def _figure_files(args: argparse.Namespace) -> list[Path]:
    """The files -o stands for (a stem's figures), or its default's."""
    from stampede.present.plot import output_paths

    return list(output_paths(args.output or Path(args.archive).with_suffix(".png"),
                             _kinds(args)).values())


def cmd_plot(args: argparse.Namespace) -> int:
    from stampede.commands.flags import alias_note

    alias_note("plot", "report ARCHIVE --png DIR")
    targets = figure_paths(args.output or Path(args.archive).with_suffix(".png"), _kinds(args))
    from stampede.results.archived import Archive

    write_figures(Archive.open(args.archive), targets, args.run, args.iteration)
    return 0


def figure_paths(output: str | Path, kinds: tuple[str, ...]) -> dict[str, Path]:
    """Before any I/O: the file of each kind (output: that file for one kind, a stem for
    several; checked by commands.outputs: -o's files, --png's directory), and matplotlib
    there."""
    from stampede.present.plot import output_paths, require_matplotlib

    require_matplotlib()
    return output_paths(output, kinds)


def write_figures(archive: Archive, targets: dict[str, Path], run: str | None,
                  iteration: int | None) -> None:
    """Draw and write the figures figure_paths named; print each file written and each
    panel skipped."""
    from stampede.present.plot import build_figures, save

    kinds = tuple(targets)
    figures, notes = build_figures(archive, kinds, run, iteration)
    for note in notes:
        print(f"stampede: note: {note}", file=sys.stderr)
    if not figures:
        from stampede.errors import UsageError
        raise UsageError(f"{archive.label}: nothing to draw for {', '.join(kinds)} (see the notes above)")
    for kind, figure in figures.items():
        save(figure, targets[kind])
        print(f"wrote {targets[kind]}")
