"""`stampede jobs`: the job files an install carries (stampede.bundled), listed, or copied
into a directory to start from: an install has no clone's jobs/ directory."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_DIRECTORY, add_output
from stampede.errors import UsageError

if TYPE_CHECKING:
    from stampede.commands import Subparsers


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "jobs", formatter_class=formatter,
        help="List the job files stampede ships (jobs/*.toml), or copy them (and the "
             "archive's README) into a directory with --copy DIR.",
        description="The job files stampede ships with, listed or copied out.")
    add_output(sub, "--copy", kind=OUTPUT_DIRECTORY, metavar="DIR", default=None,
               help="copy every bundled job file, and results-README.md (every archive "
                    "column explained), into DIR (created; existing files are kept)")
    sub.set_defaults(func=cmd_jobs)


def cmd_jobs(args: argparse.Namespace) -> int:
    from stampede.bundled import RESULTS_README, job_files

    files = job_files()
    if not files:
        raise UsageError("this install carries no job files (a broken install?)",
                         hint="pip install --force-reinstall stampede")
    if args.copy is None:
        for path in files:
            first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines()
                          if line.startswith("#")), "")
            print(f"{path.name:<28} {first}")
        print(f"(in {files[0].parent}; `stampede jobs --copy DIR` copies them)")
        return 0
    target = Path(args.copy)
    if target.exists() and not target.is_dir():
        raise UsageError(f"--copy {args.copy}: exists and is not a directory")
    target.mkdir(parents=True, exist_ok=True)
    copied, kept = [], []
    for path in [*files, RESULTS_README]:
        destination = target / path.name
        if destination.exists():
            kept.append(destination.name)
            continue
        shutil.copyfile(path, destination)
        copied.append(destination.name)
    print(f"copied {len(copied)} file(s) into {target}"
          + (f"; kept {len(kept)} that were there: {', '.join(kept)}" if kept else ""))
    return 0
