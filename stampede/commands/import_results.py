"""`stampede import`: IOR's JSON summary or mdtest's output appended to a stampede archive
(the parsing is stampede.results.importers')."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_ARCHIVE, add_output
from stampede.results import importers

if TYPE_CHECKING:
    from stampede.commands import Subparsers

# IOR's JSON and mdtest's text of a run are kilobytes (per-op CSVs are not imported): a
# larger file is not one, and is never read whole into memory (/dev/zero once took 24 GiB)
PEER_OUTPUT_LIMIT_BYTES = 64 << 20


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "import", formatter_class=formatter,
        help="Append IOR (JSON summary) or mdtest (standard output) results to an archive, "
             "to compare them with stampede runs.",
        description="Import IOR or mdtest results into a stampede archive.", epilog=importers.__doc__)
    sub.add_argument("tool", choices=("ior", "mdtest"))
    sub.add_argument("result", help="IOR JSON summary file, or mdtest's saved output")
    add_output(sub, "--archive", kind=OUTPUT_ARCHIVE, required=True, help="CSV archive to append to")
    sub.add_argument("--cache", default="unknown", choices=("warm", "cold", "direct", "unknown"),
                     help="the cache state the tool ran in (it does not record it)")
    sub.add_argument("--job", default="", help="job name for the rows (default: the tool's)")
    sub.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.results.archive import append_rows, check_appendable
    from stampede.values import read_text

    path = Path(args.result)
    text = read_text(path, f"{args.tool} output", PEER_OUTPUT_LIMIT_BYTES)
    check_appendable(args.archive)
    job = args.job or args.tool
    if args.tool == "ior":
        start = text.find("{")  # IOR may print its banner before the JSON
        try:
            document = json.loads(text[start:]) if start >= 0 else None
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(document, dict):
            raise UsageError(f"{path}: no JSON object: not IOR's JSON summary")
        rows = importers.ior_rows(document, job, args.cache, str(path))
    else:
        rows = importers.mdtest_rows(text, job, args.cache, str(path))
    append_rows(args.archive, rows)  # the archive writes each cell (results.cells)
    print(f"imported {len(rows)} {args.tool} row(s) into {args.archive}")
    return 0
