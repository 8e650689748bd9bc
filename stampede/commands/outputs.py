"""Every flag that names something stampede writes, declared once and checked once.

A command declares such a flag with add_output (never add_argument): its action is an
Output, which says what the flag names (a file written whole, an archive appended to, a
directory written into: stampede.values.OUTPUT_KINDS) and, where the value stands for
other paths (a stem for several figures) or has a default made from another flag (the
archive's name with .html), those paths. stampede.cli runs check_outputs over every
Output of the command's parser after parsing and before the handler, so that a command
cannot forget it: each path goes through stampede.values.refuse_overwrite, against the
command's inputs, before any work. `tests/commands/test_outputs.py` finds the flags from the parsers
and refuses each kind of bad path on each; a flag that looks like an output and is not
declared here fails it.

The command's inputs are found, not listed: every other argument's value that names a
regular file (an archive, a trace, a job file, a peer tool's output), and for one inside
an archive's ARCHIVE.runs/ (a trace, a sidecar) the archive beside it; and each file
output checked before is an input of the next (two flags never name one file).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from stampede.values import (
    OUTPUT_ARCHIVE,
    OUTPUT_DIRECTORY,
    OUTPUT_FILE,
    SIDECARS_SUFFIX,
    TRACE_SUFFIX,
)

# The paths a flag's value stands for (figures of a stem), or its default's (the archive's
# name with .html) when it is not given: called with the parsed flags.
Paths = Callable[[argparse.Namespace], Iterable[Path]]

__all__ = ["OUTPUT_ARCHIVE", "OUTPUT_DIRECTORY", "OUTPUT_FILE", "Output", "add_output",
           "check_outputs", "outputs_of"]


class Output(argparse.Action):
    """A flag naming something stampede writes (stored as given, like "store"); add_output
    sets what it names."""

    kind: str = OUTPUT_FILE
    paths: Paths | None = None
    given_as = ""   # the name it was given by (-o or --output): errors echo it

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        self.given_as = option_string or ""

    @property
    def flag(self) -> str:
        return self.given_as or (self.option_strings[0] if self.option_strings else self.dest)


def add_output(sub: argparse.ArgumentParser, *names: str, kind: str = OUTPUT_FILE,
               paths: Paths | None = None, default: str | None = "", metavar: str | None = None,
               required: bool = False, help: str = "") -> Output:
    """Add a flag that names a file, an archive or a directory stampede writes (`kind`):
    stampede.cli checks it before the command runs. `paths`: what it stands for beyond its
    own value (a stem's files, a default made from another flag)."""
    action = sub.add_argument(*names, action=Output, default=default, metavar=metavar,
                              required=required, help=help)
    assert isinstance(action, Output)
    action.kind, action.paths = kind, paths
    return action


def outputs_of(parser: argparse.ArgumentParser) -> list[Output]:
    """The output flags of one command's parser."""
    return [action for action in parser._actions if isinstance(action, Output)]


def check_outputs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Before the command runs: each output flag's path (and what it stands for) through
    stampede.values.refuse_overwrite, against the command's inputs and the outputs before
    it; a UsageError (exit 2) on the first that cannot be written or would replace one."""
    from stampede.values import refuse_overwrite

    outputs = outputs_of(parser)
    if not outputs:
        return
    inputs = inputs_of(parser, args)
    for action in outputs:
        value = getattr(args, action.dest, None)
        given = [value] if isinstance(value, str | Path) and str(value) else []
        for path in given:   # as given: "./" is a directory, before a stem is made of it
            refuse_overwrite(action.flag, path, inputs, action.kind)
            if action.kind == OUTPUT_ARCHIVE:   # and one that exists has this schema's header
                from stampede.results.archive import check_appendable

                check_appendable(path, flag=action.flag)
        derived = [Path(p) for p in action.paths(args)] if action.paths else []
        for path in derived:
            if str(path) not in map(str, given):
                refuse_overwrite(action.flag, path, inputs, OUTPUT_FILE)
        if action.kind != OUTPUT_DIRECTORY:   # another output may go inside a directory
            for path in [*given, *derived]:
                inputs[f"{action.flag} output"] = Path(path)


def inputs_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Path]:
    """What the command reads, in words -> path: every argument that is not an output and
    names a regular file; the archive beside one inside ARCHIVE.runs/."""
    found: dict[str, Path] = {}

    def add(what: str, path: Path) -> None:
        key = what if what not in found else f"{what} {path}"
        found[key] = path

    for action in parser._actions:
        if isinstance(action, Output) or action.dest in (argparse.SUPPRESS, "help"):
            continue
        value = getattr(args, action.dest, None)
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str) and item and os.path.isfile(item):
                add(_what(Path(item), action.dest), Path(item))
                archive = archive_beside(Path(item))
                if archive is not None:
                    add(f"archive of {item}", archive)
    return found


def _what(path: Path, dest: str) -> str:
    """An input in words: what its name says it is, else its argument's name."""
    for suffix, what in ((TRACE_SUFFIX, "trace"), (".csv", "archive"), (".toml", "job file"),
                         (".json", "JSON file")):
        if path.name.endswith(suffix):
            return what
    return dest.replace("_", " ")


def archive_beside(path: Path) -> Path | None:
    """The archive whose ARCHIVE.runs/ holds `path` (a trace, a sidecar), where it exists."""
    runs = path.parent if path.parent.name else path.absolute().parent   # spelled as given
    if not runs.name.endswith(SIDECARS_SUFFIX) or len(runs.name) == len(SIDECARS_SUFFIX):
        return None
    stem = runs.name[:-len(SIDECARS_SUFFIX)]
    found = sorted((candidate for candidate in runs.parent.glob(f"{stem}.*")
                    if candidate.is_file()), key=lambda candidate: candidate.suffix != ".csv")
    return found[0] if found else None
