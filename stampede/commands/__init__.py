"""Every `stampede` command, one module each (a module may hold a family, such as the
job commands run, prepare, plan, clean): `register(commands, formatter)` adds its parsers
with their handlers, and a handler turns the parsed flags into calls of the pipeline
(spec -> checkpoint -> run -> results). The commands only glue: what they measure, model
or render lives in the folders by role.

The CLI imports only the module of the command being run (all of them for --help): at
16,384 ranks every module a worker rank imports is a metadata storm of its own. So the
modules' top levels import the stdlib and this package only; the rest is imported in
the handlers. The flags several commands share, and what turns them into the pipeline's
values, are stampede.commands.flags; the flags that name what a command writes,
stampede.commands.outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from typing import TypeAlias

    # what `register(commands, formatter)` adds its parsers to: the CLI's add_subparsers()
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

# The commands by what they are for, as `stampede --help` lists them (git's and gh's grouped
# help): group -> (what the group is for, {command: (its module, one line about it)}).
GROUPS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "measure": ("time a checkpoint's life on every rank at once", {
        "run": ("stampede.commands.job", "restore the prepared checkpoint on every rank, timed"),
        "save": ("stampede.commands.save", "save a new checkpoint version on every rank, timed"),
        "cycle": ("stampede.commands.save", "K saves, then K restores of what they wrote"),
        "startup": ("stampede.commands.startup",
                    "the start-up stampede per rank: interpreter, imports, MPI init"),
        "loaders": ("stampede.commands.loaders",
                    "real loaders (safetensors, torch.load, DCP...) beside the raw restore"),
        "gpu": ("stampede.commands.gpu", "host -> device copies per rank over a size sweep"),
        "rejoin": ("stampede.commands.rejoin",
                   "save in tiers, lose nodes, rejoin with hot spares from the tiers"),
    }),
    "lifecycle": ("the job files and the checkpoints they write", {
        "jobs": ("stampede.commands.jobs", "list the bundled job files, or copy them"),
        "plan": ("stampede.commands.job", "dry run: validate the job, print who reads what"),
        "prepare": ("stampede.commands.job", "write the job's checkpoint, with its manifest"),
        "clean": ("stampede.commands.job", "remove what prepare and save wrote"),
    }),
    "analyse": ("read an archive", {
        "report": ("stampede.commands.report",
                   "the archive in the terminal, and as HTML (--html) or PNGs (--png)"),
        "compare": ("stampede.commands.compare", "two archives (or one's layouts), run by run"),
        "analyze": ("stampede.commands.analyze", "a run's trace (run --trace) over time"),
        "import": ("stampede.commands.import_results", "append IOR or mdtest results to an archive"),
        "html": ("stampede.commands.html", "alias of report --html"),
        "plot": ("stampede.commands.plot", "alias of report --png"),
    }),
    "model": ("project what cannot be run", {
        "project": ("stampede.commands.project",
                    "fit the contention model, project to --target-ranks"),
        "mttr": ("stampede.commands.mttr", "the recovery time T_MTTR, measured terms and assumed"),
    }),
    "orchestrate": ("launch many runs", {
        "demo": ("stampede.commands.demo", "prepare, restore, save and clean the default job"),
        "sweep": ("stampede.commands.sweep", "one job at several rank counts (local mpiexec)"),
        "assess": ("stampede.commands.assess",
                   "probe, sweep to a time budget, fit, and write one HTML verdict"),
        "slurm": ("stampede.commands.slurm", "render (or submit) an sbatch script for a job"),
    }),
    "emulate": ("a cluster's storage on one machine (root)", {
        "emulate-mds": ("stampede.commands.emulate_mds",
                        "a FUSE metadata server of C slots of S seconds each"),
        "emulate-s3": ("stampede.commands.emulate_s3",
                       "an S3 front with per-prefix rate limits: 503 SlowDown"),
        "emulate-cluster": ("stampede.commands.emulate_cluster",
                            "N nodes of k ranks: namespaces, shaped NICs, an S3 host"),
    }),
    "shell": ("stampede in your shell", {
        "completion": ("stampede.commands.completion", "a bash or zsh completion script"),
    }),
}
# command -> module
COMMANDS = {command: module for _, commands in GROUPS.values()
            for command, (module, _) in commands.items()}


def commands_text() -> str:
    """The commands by group, one line each: `stampede --help`'s listing."""
    width = max(map(len, COMMANDS)) + 2
    blocks = []
    for group, (purpose, commands) in GROUPS.items():
        lines = [f"{group}: {purpose}"]
        lines += [f"  {command:<{width}}{line}" for command, (_, line) in commands.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def metrics_text() -> str:
    """What stampede measures: `stampede --help`'s epilog and `run --help`'s, made only
    when help is printed (stampede.cli's epilog_text)."""
    from stampede.results.definitions import METRICS

    return METRICS
