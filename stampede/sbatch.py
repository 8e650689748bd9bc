"""sbatch scripts from the bundled templates (stampede/bundled/slurm, the repository's
slurm/): the allocation a restore or a sweep needs, checked, and the script rendered with
every placeholder filled. Pure: nothing here submits (stampede.commands.slurm does, when
asked). The stdlib only: the CLI imports it for `stampede slurm --help`.

Without steps the script is one restore (restore.sbatch: prepare, then run, on every
allocated rank); with steps it is a scaling sweep (sweep.sbatch: one prepare + run pair of
srun steps per rank count, all appended to the job's one archive). Steps launch as
`srun --mpi=pmi2 python -m mpi4py -m stampede ...` with the Python that rendered the
script, so an exception on one rank aborts the step instead of hanging it.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stampede.bundled import SLURM_DIR

DEFAULT_TIME = "01:00:00"


# Slurm's --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME_FORMAT = re.compile(r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2})")


PARTITION_FORMAT = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")


# A placeholder is `${lowercase_name}` and nothing else: no `$$` escape, no bare `$name`.
PLACEHOLDER = r"""
    \$(?:
        (?P<escaped>(?!))                |
        (?P<named>(?!))                  |
        \{(?P<braced>[a-z][a-z0-9_]*)\}  |
        (?P<invalid>(?!))
    )
"""


class SbatchTemplate(string.Template):
    """string.Template that fills only `${lowercase_name}`: the script's own shell
    variables ($RANKS, ${OVERRIDES[@]}) are upper case and pass through untouched."""

    flags = re.VERBOSE
    pattern = PLACEHOLDER  # type: ignore[assignment]  # a str: Template compiles it


@dataclass(frozen=True)
class Step:
    """One srun step of a sweep: `ranks` ranks spread over `nodes` nodes."""

    ranks: int
    nodes: int


@dataclass(frozen=True)
class Allocation:
    """What the script asks Slurm for, and the steps it runs inside it."""

    nodes: int
    ntasks_per_node: int
    steps: tuple[Step, ...]   # empty: one restore on every allocated rank


def parse_count(flag: str, text: str | None) -> int | None:
    """A node or task count: a whole number >= 1 (None when the flag was not given)."""
    from stampede.errors import UsageError

    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise UsageError(f"{flag} {text!r}: must be a whole number >= 1")
    return int(text)


def parse_steps(text: str) -> tuple[tuple[int, int | None], ...]:
    """'1,2,8:2' -> ((1, None), (2, None), (8, 2)): rank counts, each with nodes or None."""
    from stampede.errors import UsageError

    steps = []
    for part in (item.strip() for item in text.split(",")):
        ranks, _, nodes = part.partition(":")
        if not ranks.isdigit() or int(ranks) < 1 or (nodes and (not nodes.isdigit() or int(nodes) < 1)):
            raise UsageError(f"--ranks {text!r}: {part!r} is not a rank count >= 1 (R, or R:N for "
                             "R ranks on N nodes)", hint="e.g. --ranks 1,2,4,8 or --ranks 8:1,8:2")
        steps.append((int(ranks), int(nodes) if nodes else None))
    if len(set(steps)) != len(steps):
        raise UsageError(f"--ranks {text!r}: a step is repeated")
    return tuple(steps)


def allocation_for(nodes: int | None, ntasks_per_node: int | None, ranks: str | None) -> Allocation:
    """The allocation and steps for the user's counts; a UsageError if they cannot fit."""
    from stampede.errors import UsageError

    if ranks is None:
        return Allocation(nodes or 1, ntasks_per_node or 1, ())
    wanted = parse_steps(ranks)
    node_count = nodes or max(step_nodes or 1 for _, step_nodes in wanted)
    per_node = ntasks_per_node or max(math.ceil(count / (step_nodes or node_count))
                                      for count, step_nodes in wanted)
    steps = []
    for count, step_nodes in wanted:
        used = step_nodes or math.ceil(count / per_node)
        where = f"--ranks {count}" + (f":{step_nodes}" if step_nodes else "")
        if used > node_count:
            raise UsageError(f"{where}: needs {used} nodes at {per_node} ranks per node, but "
                             f"--nodes is {node_count}")
        if count < used:
            raise UsageError(f"{where}: fewer ranks than nodes")
        if count > used * per_node:
            raise UsageError(f"{where}: {count} ranks do not fit on {used} node(s) at "
                             f"--ranks-per-node {per_node}")
        steps.append(Step(count, used))
    return Allocation(node_count, per_node, tuple(steps))


def check_time(text: str) -> str:
    from stampede.errors import UsageError

    if not TIME_FORMAT.fullmatch(text) or not any(char != "0" for char in text if char.isdigit()):
        raise UsageError(f"--time {text!r}: not a Slurm time limit",
                         hint="HH:MM:SS, e.g. --time 00:30:00, or D-HH:MM:SS")
    return text


def check_partition(text: str) -> str:
    from stampede.errors import UsageError

    if text and not PARTITION_FORMAT.fullmatch(text):
        raise UsageError(f"--partition {text!r}: not a partition name (letters, digits, _ . -; "
                         "several separated by commas)")
    return text


def directive_path(path: str) -> str:
    """A path for an #SBATCH line: sbatch takes it quoted, but not with quotes inside."""
    from stampede.errors import UsageError

    if any(char in path for char in "'\"\n"):
        raise UsageError(f"{path!r}: a quote or newline in the path cannot go into an #SBATCH line",
                         hint="render the script from another directory")
    return shlex.quote(path)


def render(job_file: Path, job_name: str, overrides: list[str], allocation: Allocation,
           time_limit: str, partition: str, clean: bool, command: str,
           save: Sequence[str] = ()) -> str:
    """The sbatch script: a template from slurm/ with every placeholder filled in; `save`:
    the --set overrides of a save after each step's run (the sweep only; none: no save)."""
    from stampede.errors import UsageError

    template_path = SLURM_DIR / ("sweep.sbatch" if allocation.steps else "restore.sbatch")
    try:
        template = SbatchTemplate(template_path.read_text())
    except OSError as error:
        raise UsageError(f"{template_path}: cannot read the sbatch template ({error.strerror})",
                         hint="the install lost its bundled templates: "
                              "pip install --force-reinstall stampede") from None
    partition_directive = f"#SBATCH --partition={partition}" if partition else \
        "##SBATCH --partition=(none given)"
    return template.substitute(
        command=" ".join(command.split()),    # one line: it sits in a comment
        job_name=re.sub(r"[^A-Za-z0-9_.-]", "_", job_name),
        nodes=allocation.nodes, ntasks_per_node=allocation.ntasks_per_node,
        time=time_limit, partition_directive=partition_directive,
        workdir=directive_path(os.getcwd()), python=shlex.quote(sys.executable),
        job_file=shlex.quote(str(job_file)),
        overrides=_set_words(overrides),
        clean=int(clean),
        steps=" ".join(f"{step.ranks}:{step.nodes}" for step in allocation.steps),
        save=_set_words(save))


def _set_words(pairs: Sequence[str]) -> str:
    """KEY=VALUE pairs as the script's words: --set 'KEY=VALUE' each, quoted for bash."""
    return " ".join(f"--set {shlex.quote(pair)}" for pair in pairs)
