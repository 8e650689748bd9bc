"""`stampede --help`: the commands listed by group, as git and gh list theirs; every
command the parsers register in exactly one group."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from stampede.cli import build_parser
from stampede.commands import GROUPS


def registered(parser: argparse.ArgumentParser) -> list[str]:
    """The commands the parser registers."""
    return list(next(action for action in parser._actions
                     if isinstance(action, argparse._SubParsersAction)).choices)


def test_every_command_is_in_exactly_one_group() -> None:
    grouped = [command for _, commands in GROUPS.values() for command in commands]
    assert len(grouped) == len(set(grouped)), sorted(grouped)
    assert sorted(grouped) == sorted(registered(build_parser([])))


def test_help_lists_each_command_once_under_its_group() -> None:
    shown = subprocess.run([sys.executable, "-m", "stampede", "--help"], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    listing = shown.stdout.split("\n\n", 2)[2].split("\noptions:")[0]
    found: dict[str, list[str]] = {}
    for block in listing.split("\n\n"):
        heading, *lines = block.splitlines()
        group = re.fullmatch(r"(\w+): .+", heading)
        assert group, heading
        found[group.group(1)] = []
        for line in lines:
            command = re.fullmatch(r"  ([\w-]+) {2,}\S.*", line)
            assert command, line
            found[group.group(1)].append(command.group(1))
    assert list(found) == ["measure", "lifecycle", "analyse", "model", "orchestrate", "emulate",
                           "shell"]
    assert {group: list(commands) for group, (_, commands) in GROUPS.items()} == found
    assert found["model"] == ["project", "mttr"]
    assert "\n  emulate-cluster  N nodes of k ranks" in listing


def test_a_commands_usage_and_errors_name_the_command_alone() -> None:
    """`stampede run --help` begins `usage: stampede run`, and a usage error `stampede run:
    error:` (not the top usage's `[-h] [--version] COMMAND ...` before the command)."""
    for command in registered(build_parser([])):
        helped = subprocess.run([sys.executable, "-m", "stampede", command, "--help"],
                                capture_output=True, text=True, timeout=60)
        assert helped.stdout.startswith(f"usage: stampede {command} "), helped.stdout[:200]
    refused = subprocess.run([sys.executable, "-m", "stampede", "run"], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1].startswith("stampede run: error:"), refused.stderr
