"""Every `stampede` command, one module each (a module may hold a family, such as the
job commands run, prepare, plan, clean): `register(commands, formatter)` adds its parsers
with their handlers, and a handler turns the parsed flags into calls of the pipeline
(spec -> checkpoint -> run -> results). The commands only glue: what they measure, model
or render lives in the folders by role.

The CLI imports only the module of the command being run (all of them for --help): at
16,384 ranks every module a worker rank imports is a metadata storm of its own. So the
modules' top levels import the stdlib and this package only; the rest is imported in
the handlers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable

# command -> module, in the order `stampede --help` lists them
COMMANDS = {
    "run": "stampede.commands.job", "prepare": "stampede.commands.job",
    "plan": "stampede.commands.job", "clean": "stampede.commands.job",
    "save": "stampede.commands.save", "cycle": "stampede.commands.save",
    "report": "stampede.commands.report", "startup": "stampede.commands.startup",
    "demo": "stampede.commands.demo", "jobs": "stampede.commands.jobs",
    "sweep": "stampede.commands.sweep", "compare": "stampede.commands.compare",
    "import": "stampede.commands.import_results", "slurm": "stampede.commands.slurm",
    "plot": "stampede.commands.plot", "gpu": "stampede.commands.gpu",
    "mttr": "stampede.commands.mttr", "emulate-mds": "stampede.commands.emulate_mds",
    "emulate-cluster": "stampede.commands.emulate_cluster",
    "project": "stampede.commands.project", "loaders": "stampede.commands.loaders",
    "html": "stampede.commands.html", "assess": "stampede.commands.assess",
}


def set_words(pairs: Iterable[str]) -> list[str]:
    """KEY=VALUE pairs as a command line's words: --set KEY=VALUE each."""
    return [word for pair in pairs for word in ("--set", pair)]


def add_job_arguments(sub: argparse.ArgumentParser, set_help: str = "") -> None:
    """The job file and its --set overrides, as every command that takes a job spells them."""
    sub.add_argument("job", help="job file (TOML), e.g. jobs/quickstart.toml")
    sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help=set_help or "override a job key, e.g. --set target.path=/lustre/me/ckpt"
                                      " (a key of an exclusive pair, such as checkpoint.size and"
                                      " checkpoint.size_per_rank, replaces the other)")


def overrides(args: argparse.Namespace) -> list[str]:
    """--set, plus what --checkpoint (run, plan) and --from (prepare, run, clean) stand for."""
    found = list(args.set)
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint is not None:
        found += ["checkpoint.source=existing", f"target.path={json.dumps(checkpoint)}"]
    from_path = getattr(args, "from_path", None)
    if from_path is not None:   # a copy in stampede's layouts, whatever the job's source
        found += [f"checkpoint.from={json.dumps(from_path)}", "checkpoint.source=synthetic"]
    return found
