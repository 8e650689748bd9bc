"""The one output guard (stampede.commands.outputs): every output flag of every registered
command, found from the parsers, is tried with each kind of path it must refuse; each
refusal is exit 2, one line, before the command's handler, and nothing is written or
replaced. A flag that looks like an output and is not declared through the guard fails
here, so a new command is covered with no new test."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stampede import cli
from stampede.commands.outputs import Output, outputs_of
from stampede.values import OUTPUT_ARCHIVE, OUTPUT_DIRECTORY, OUTPUT_FILE

# Words of a flag's names (its dest and option strings, split at - and _) that say it
# names something written: such a flag that takes a value must be an Output.
OUTPUT_WORDS = {"output", "out", "html", "png", "chrome", "dxt", "json", "csv", "archive", "log",
                "sbatch", "copy", "dir", "write", "save", "dump", "export", "summary"}
# ...unless it is one of these, each with why it is not an output.
NOT_OUTPUTS = {
    ("emulate-mds", "--log-limit"): "a count of requests the log keeps",
    ("emulate-s3", "--log-limit"): "a count of requests the log keeps",
    ("mttr", "--save-layout"): "a layout's name, read from the archives",
}
SIDECAR = "20260101T000000Z-0000abcd"


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser([])
    return dict(next(action for action in parser._actions
                     if isinstance(action, argparse._SubParsersAction)).choices)


def every_output() -> list[tuple[str, Output]]:
    return [(name, action) for name, sub in commands().items() for action in outputs_of(sub)]


def test_every_flag_that_looks_like_an_output_is_declared_through_the_guard() -> None:
    undeclared, checked = [], []
    for name, sub in commands().items():
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0:
                continue   # positionals are what a command reads; a switch names nothing
            words = set(re.split(r"[-_]", action.dest)) | {
                word for flag in action.option_strings for word in re.split(r"[-_]", flag)}
            if isinstance(action, Output):
                checked.append(f"{name} {'/'.join(action.option_strings)} ({action.kind})")
            elif words & OUTPUT_WORDS and (name, action.option_strings[-1]) not in NOT_OUTPUTS:
                undeclared.append(f"{name} {action.option_strings[-1]}")
    assert not undeclared, f"declare these with stampede.commands.outputs.add_output: {undeclared}"
    print("\noutput flags checked by the guard:\n  " + "\n  ".join(checked))
    assert len(checked) >= 17


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory no one may write in: mode 0555, or (root writes anyway) a read-only
    tmpfs."""
    where = tmp_path_factory.mktemp("read-only")
    if os.geteuid() != 0:
        where.chmod(0o555)
        yield where
        where.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"a read-only tmpfs cannot be mounted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def inputs(tmp_path: Path) -> Path:
    """An archive with a run's sidecar and trace (what the guard must never write over),
    and a directory, a link, a FIFO beside it; the archive's path."""
    archive = tmp_path / "in.csv"
    archive.write_text("schema,run_id\n")
    (tmp_path / "in.runs").mkdir()
    (tmp_path / "in.runs" / f"{SIDECAR}.json").write_text("{}")
    (tmp_path / "in.runs" / f"{SIDECAR}.trace.npz").write_bytes(b"PK")
    (tmp_path / "dir").mkdir()
    (tmp_path / "other.txt").write_text("other")
    (tmp_path / "link").symlink_to(tmp_path / "other.txt")
    os.mkfifo(tmp_path / "fifo")
    return archive


def forbidden(kind: str, tmp_path: Path, read_only: Path) -> dict[str, str]:
    """What a flag of `kind` must refuse: what the path is -> the path."""
    runs = tmp_path / "in.runs"
    common = {
        "a sidecar": str(runs / f"{SIDECAR}.json"),
        "a trace": str(runs / f"{SIDECAR}.trace.npz"),
        "a new file under ARCHIVE.runs/": str(runs / "new.out"),
        "a trace's name": str(tmp_path / "new.trace.npz"),
        "a symbolic link": str(tmp_path / "link"),
        "a FIFO": str(tmp_path / "fifo"),
        "/dev/full": "/dev/full",
        "a path in /proc": "/proc/stampede-outputs-test",
        "a read-only directory": str(read_only / "new.out"),
        "a path under a file": str(tmp_path / "other.txt" / "new.out"),
    }
    if kind == OUTPUT_DIRECTORY:   # "." is a directory to write into: fine
        return {**common, "ARCHIVE.runs/ itself": str(runs), "a file": str(tmp_path / "other.txt"),
                "a read-only directory": str(read_only)}
    return {**common, "./": "./", ".": ".", "a directory": str(tmp_path / "dir"),
            "ARCHIVE.runs/ itself": str(runs),
            **({"a missing directory": str(tmp_path / "missing" / "new.out")}
               if kind == OUTPUT_FILE else {})}


def command_line(name: str, sub: argparse.ArgumentParser, archive: Path, flag: Output,
                 tmp_path: Path) -> list[str]:
    """A command line the parser takes: each positional and required flag filled (a file
    argument with the archive: the guard must know it as an input), the flag left out."""
    words = [name]
    for action in sub._actions:
        if action is flag or not (action.required or not action.option_strings):
            continue
        if action.nargs == argparse.REMAINDER:
            continue
        if action.choices:
            value = str(next(iter(action.choices)))
        elif isinstance(action, Output):
            value = str(tmp_path / f"fine-{action.dest}.csv")
        elif action.type in (int, float) or action.dest in ("ranks", "target_ranks"):
            value = "4"
        else:
            value = str(archive)
        words += [*action.option_strings[-1:], value]
    return words


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root and what it holds (a FIFO, a directory, a link by their kind)."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = f"link to {os.readlink(path)}"
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path)] = "other"
    return found


@pytest.mark.parametrize(("name", "flag"), [
    pytest.param(name, action.option_strings[-1], id=f"{name} {action.option_strings[-1]}")
    for name, action in every_output()])
def test_each_output_flag_refuses_each_forbidden_path(
        name: str, flag: str, tmp_path: Path, read_only: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    archive = inputs(tmp_path)
    sub = commands()[name]
    action = next(a for a in outputs_of(sub) if flag in a.option_strings)
    base = command_line(name, sub, archive, action, tmp_path)
    refusals = forbidden(action.kind, tmp_path, read_only)
    has_input = any(not a.option_strings and a.choices is None and a.nargs != argparse.REMAINDER
                    for a in sub._actions)
    if has_input and action.kind != OUTPUT_DIRECTORY:
        refusals["the command's input"] = str(archive)
        (tmp_path / "to-input").symlink_to(archive)
        refusals["its input through a link"] = str(tmp_path / "to-input")
    before = snapshot(tmp_path)
    for what, bad in refusals.items():
        argv = [*base, flag, bad]
        parser = cli.build_parser(argv)
        args = parser.parse_args(argv)
        ran = []
        args.func = lambda parsed, ran=ran: ran.append(parsed) or 0
        assert cli.run_command(parser, args) == 2, (what, argv)
        said = capsys.readouterr()
        assert not ran, f"{argv}: the handler ran ({what} not refused)"
        assert said.out == ""
        lines = said.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"stampede {name}: error: {flag} "), \
            (what, said.err)
        assert snapshot(tmp_path) == before, (what, argv)
        assert not os.path.exists("/proc/stampede-outputs-test")
    print(f"\n{name} {flag} ({action.kind}): refused {', '.join(refusals)}")


@pytest.mark.parametrize(("name", "flag"), [
    pytest.param(name, action.option_strings[-1], id=f"{name} {action.option_strings[-1]}")
    for name, action in every_output()])
def test_each_output_flag_takes_a_new_file_beside_its_inputs(
        name: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard is no wall: a new name in a writable directory passes (and an archive to
    append to, an existing directory to write into), and it leaves nothing there."""
    monkeypatch.chdir(tmp_path)
    archive = inputs(tmp_path)
    sub = commands()[name]
    action = next(a for a in outputs_of(sub) if flag in a.option_strings)
    fine = {OUTPUT_FILE: ["new.out", str(tmp_path / "dir" / "new.out")],
            OUTPUT_ARCHIVE: ["new.csv", str(tmp_path / "made" / "new.csv")],
            OUTPUT_DIRECTORY: [".", str(tmp_path / "dir"), "made/deeper"]}[action.kind]
    before = snapshot(tmp_path)
    for good in fine:
        argv = [*command_line(name, sub, archive, action, tmp_path), flag, good]
        parser = cli.build_parser(argv)
        args = parser.parse_args(argv)
        ran: list[argparse.Namespace] = []
        args.func = lambda parsed, ran=ran: ran.append(parsed) or 0
        assert cli.run_command(parser, args) == 0, argv
        assert ran and getattr(ran[0], action.dest) == good
        assert snapshot(tmp_path) == before, argv   # the probe left nothing


@pytest.mark.mpi
def test_a_refusal_under_a_launcher_of_several_ranks_ends_them_all(stampede, tmp_path: Path) -> None:
    """Rank 0 alone checks (and writes) the outputs; the others wait in MPI_Init: its refusal
    ends the whole job with exit 2 at once (they once spun there until killed)."""
    refused = stampede("gpu", "--device", "host", "--modes", "pageable", "--sizes", "1MiB",
                       "--trials", "1", "--archive", "/proc/stampede-outputs.csv", np=2,
                       timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert ("stampede gpu: error: --archive /proc/stampede-outputs.csv: cannot write in /proc"
            in refused.stderr)
    assert os.listdir(tmp_path) == []
