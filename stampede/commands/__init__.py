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
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from stampede.model.workload import Workload
    from stampede.spec import JobSpec

Spec = TypeVar("Spec", bound="JobSpec")

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
    "analyze": "stampede.commands.analyze", "rejoin": "stampede.commands.rejoin",
}


def metrics_text() -> str:
    """What stampede measures: `stampede --help`'s epilog and `run --help`'s, made only
    when help is printed (stampede.cli's epilog_text)."""
    from stampede.results.definitions import METRICS

    return METRICS


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


TRACE_LIMIT = "1GiB"


def add_trace_arguments(sub: argparse.ArgumentParser) -> None:
    """--trace and --trace-limit, as run, save, cycle and plan spell them."""
    sub.add_argument("--trace", action="store_true",
                     help="keep every timed op of every rank (op, file, offset, bytes, start "
                          "and stop on its node's axis, ok) in ARCHIVE.runs/RUN_ID.trace.npz "
                          "beside the sidecar, for `stampede analyze`; the rows are the ones "
                          "the statistics are made of, kept, with each op's file and offset "
                          "noted after its stop stamp: nothing is added inside a timed op")
    sub.add_argument("--trace-limit", default=TRACE_LIMIT, metavar="SIZE",
                     help=f"the most the trace may hold, 72 bytes an op (default {TRACE_LIMIT}): "
                          "a run that would write more is refused before its first phase")


def traced(args: argparse.Namespace, spec: Spec) -> Spec:
    """The spec with its trace limit set by --trace (exit 2 on a size that does not parse)."""
    from dataclasses import replace

    from stampede.errors import UsageError
    from stampede.units import parse_size

    if not getattr(args, "trace", False):
        return spec
    try:
        limit = parse_size(args.trace_limit)
    except ValueError as error:
        raise UsageError(f"--trace-limit: {error}") from None
    if limit < 1:
        raise UsageError(f"--trace-limit {args.trace_limit}: must be more than 0 bytes")
    return replace(spec, trace_limit=limit)


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


def add_workload_arguments(sub: argparse.ArgumentParser, prefix: str = "target-") -> None:
    """The workload at the target (stampede.model.workload), as assess, html, mttr
    (--target-…) and project (its --ranks is the target: no prefix) spell it; the rank
    count itself each command adds."""
    from stampede.spec import WORKLOAD_RANKS

    sub.add_argument(f"--{prefix}ranks-per-node", type=int, default=None, metavar="K",
                     help="ranks per node at the target (default: as the largest run)")
    sub.add_argument(f"--{prefix}model", default=None, choices=tuple(WORKLOAD_RANKS),
                     help="the target's checkpoint: an MLPerf Storage Llama 3 model, its files "
                          "and bytes per rank at the target's rank count (TP x PP x DP, ZeRO)")
    sub.add_argument(f"--{prefix}size", default=None, metavar="SIZE",
                     help="the target's checkpoint: its total size (e.g. 900GiB), split over "
                          "the ranks")
    sub.add_argument(f"--{prefix}bytes-per-rank", default=None, metavar="SIZE",
                     help="the target's checkpoint: the bytes each rank restores (default for "
                          "all three: the job's checkpoint as archived, a per-rank size kept, a "
                          "total split over the ranks)")


def add_rejoin_arguments(sub: argparse.ArgumentParser) -> None:
    """A `stampede rejoin` archive at the target (stampede.model.rejoin): nodes lost there
    and the spare pool (mttr, project)."""
    sub.add_argument("--lost-nodes", type=int, default=None, metavar="L",
                     help="a rejoin archive: nodes lost at the target (default: as the run)")
    sub.add_argument("--spare-pool-pct", type=float, default=None, metavar="P",
                     help="a rejoin archive: hot spare nodes at the target, %% of its nodes "
                          "(default 2: a rejoin needs one per lost node)")


def rejoin_options(args: argparse.Namespace) -> tuple[int | None, float]:
    """--lost-nodes and --spare-pool-pct checked (exit 2): (L or None, the pool's fraction)."""
    import math

    from stampede.errors import UsageError
    from stampede.model.rejoin import SPARE_POOL_FRACTION

    if args.lost_nodes is not None and args.lost_nodes < 1:
        raise UsageError(f"--lost-nodes {args.lost_nodes}: must be at least 1")
    percent = args.spare_pool_pct
    if percent is not None and not (math.isfinite(percent) and 0 < percent <= 100):
        raise UsageError(f"--spare-pool-pct {percent:g}: must be above 0 and at most 100")
    return args.lost_nodes, SPARE_POOL_FRACTION if percent is None else percent / 100


def workload_from(args: argparse.Namespace, ranks: int, prefix: str = "target-") -> Workload:
    """The stampede.model.workload.Workload that add_workload_arguments' flags name (exit 2
    on a size that does not parse, a model the rank count does not fit)."""
    from stampede.errors import UsageError
    from stampede.model.workload import workload_of
    from stampede.units import parse_size

    def flag(name: str) -> object:
        return getattr(args, f"{prefix}{name}".replace("-", "_"))

    sizes = {}
    for name in ("size", "bytes-per-rank"):
        text = flag(name)
        if text is not None:
            try:
                sizes[name] = float(parse_size(text))
            except ValueError as error:
                raise UsageError(f"--{prefix}{name} {text!r}: {error}") from None
    preset = None
    if flag("model") is not None:
        from stampede.checkpoint.mlperf import MODELS, at_scale, display_name

        model = MODELS[str(flag("model"))]
        try:
            largest, total, files = at_scale(model, ranks)
        except ValueError as error:
            raise UsageError(f"--{prefix}model {model.name}: {error}") from None
        dp = ranks // model.model_parallel
        preset = (display_name(model), f"TP {model.tp} x PP {model.pp} x DP {dp}, ZeRO "
                  f"{model.zero}", float(largest), float(total), files)
    per_node = flag("ranks-per-node")
    return workload_of(ranks, per_node if isinstance(per_node, int) else None,
                       sizes.get("bytes-per-rank"), sizes.get("size"), preset)
