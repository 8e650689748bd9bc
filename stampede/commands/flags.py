"""The flags several commands share, spelled once, and what turns them into the pipeline's
values: the job file and its --set overrides (and the target's lock the command declares
with them, taken by job_world), --trace, the target's scale (--target-ranks and the
workload at the target, a rejoin's lost nodes), a flag's old name kept one release.

Imported by the command modules' top levels, so it imports the stdlib and this package
only (stampede.commands' rule); the rest in the functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from stampede.checkpoint.lock import Access
    from stampede.model.workload import Workload
    from stampede.mpi import Comm
    from stampede.spec import JobSpec

Spec = TypeVar("Spec", bound="JobSpec")


def set_words(pairs: Iterable[str]) -> list[str]:
    """KEY=VALUE pairs as a command line's words: --set KEY=VALUE each."""
    return [word for pair in pairs for word in ("--set", pair)]


class _Renamed(argparse.Action):
    """A flag that had another name: stored under the new one; given by its old name, it
    warns on stderr (rank 0) that the old name goes in the next release."""

    def __init__(self, *args: Any, command: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.command = command

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        new = self.option_strings[0]
        if option_string is not None and option_string != new:
            from stampede.launcher import launcher_rank

            if launcher_rank() == 0:
                print(f"stampede: {option_string} is now {new} for {self.command}; the old name "
                      "goes in the next release", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed(sub: argparse.ArgumentParser, new: str, *old: str, **kwargs: Any) -> None:
    """Add the flag `new`, still read under its `old` names for one release (with a warning):
    help, usage and completion show the new name only."""
    action = sub.add_argument(new, *old, action=_Renamed, command=sub.prog.split()[-1], **kwargs)
    action.option_strings = [new]   # the parser still maps the old names to this action


def alias_note(old: str, new: str) -> None:
    """What a command kept as an alias says when used: which command it is now."""
    print(f"stampede {old}: note: this is `stampede {new}` now; `{old}` stays as its alias",
          file=sys.stderr)


def add_job_arguments(sub: argparse.ArgumentParser, set_help: str = "", *,
                      access: Access) -> None:
    """The job file and its --set overrides, as every command that takes a job spells them,
    and how the command uses the job's target (stampede.checkpoint.lock): `write`
    (exclusive), `read` (shared with readers) or `none` (it launches other commands, or
    touches no target); job_world takes the lock as declared."""
    sub.set_defaults(target_access=access)
    sub.add_argument("job", help="job file (TOML), e.g. jobs/quickstart.toml")
    sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help=set_help or "override a job key, e.g. --set target.path=/lustre/me/ckpt"
                                      " (a key of an exclusive pair, such as checkpoint.size and"
                                      " checkpoint.size_per_rank, replaces the other)")


def job_world(args: argparse.Namespace, spec: JobSpec) -> Comm:
    """The one place a job command gets its ranks: COMM_WORLD, the target held
    (hold_target)."""
    from stampede import mpi

    comm = mpi.world()
    hold_target(args, spec, comm)
    return comm


def hold_target(args: argparse.Namespace, spec: JobSpec, comm: Comm | None) -> None:
    """The job's target locked as the command's registration declared (add_job_arguments'
    access), by rank 0 of `comm` (None: this process alone, as clean runs) until the
    command ends (stampede.cli lets it go). A checkpoint stampede did not make
    (checkpoint.source = existing) is only read, and never gets a lock file."""
    from stampede.checkpoint import lock

    access = args.target_access
    if access != "none" and spec.checkpoint_source != "existing":
        lock.hold(comm, spec.target_path, spec.storage_options, f"stampede {args.command}",
                  access)


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


# The target's scale, checked where argparse reads it (so every command that takes a target
# flag refuses a bad value in one line, exit 2, before any output: stampede.cli's _Parser):
# a count is a whole number from 1 to this many (a billion nodes of 1,000 ranks: more is no
# machine, and a typo), a size a size with a unit above 0 bytes.
MOST_TARGET_RANKS = 10**12


def target_count(flag: str, most: int = MOST_TARGET_RANKS) -> Callable[[str], int]:
    """The argparse type of a target count (--target-ranks, --target-ranks-per-node,
    --lost-nodes): a whole number from 1 to `most`."""
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", "").replace(",", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (e.g. 16384)") \
                from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"{text}: must be from 1 to {most:,}")
        return value
    parse.__name__ = flag   # argparse names a failed type by it
    return parse


def target_size(text: str) -> str:
    """The argparse type of a target size (--target-size, --target-bytes-per-rank): a size
    above 0 bytes, kept as typed (workload_from reads it)."""
    from stampede.units import parse_size

    try:
        size = parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 bytes")
    return text


def target_percent(text: str) -> float:
    """The argparse type of --spare-pool-pct: a percentage above 0 and at most 100."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 2)") from None
    if not (math.isfinite(value) and 0 < value <= 100):
        raise argparse.ArgumentTypeError(f"{text}: must be above 0 and at most 100")
    return value


def add_target_ranks(sub: argparse.ArgumentParser, *old: str, help: str,
                     default: int | None = None, required: bool = False) -> None:
    """--target-ranks, checked (target_count); `old` its former spellings."""
    kind = target_count("--target-ranks")
    if old:
        add_renamed(sub, "--target-ranks", *old, type=kind, default=default,
                    required=required, metavar="N", help=help)
    else:
        sub.add_argument("--target-ranks", type=kind, default=default, required=required,
                         metavar="N", help=help)


def add_workload_arguments(sub: argparse.ArgumentParser, old_names: bool = False) -> None:
    """The workload at the target (stampede.model.workload), as assess, html, mttr and
    project spell it (--target-…); the rank count itself each command adds. With old_names
    project's own spellings before --target- (--model, --size...) are still read, warned."""
    from stampede.spec import WORKLOAD_RANKS

    def add(name: str, **kwargs: Any) -> None:
        if old_names:
            add_renamed(sub, f"--target-{name}", f"--{name}", **kwargs)
        else:
            sub.add_argument(f"--target-{name}", **kwargs)

    add("ranks-per-node", type=target_count("--target-ranks-per-node"), default=None,
        metavar="K",
        help="ranks per node at the target (default: as the largest run)")
    add("model", default=None, choices=tuple(WORKLOAD_RANKS),
        help="the target's checkpoint: an MLPerf Storage Llama 3 model, its files and bytes per "
             "rank at the target's rank count (TP x PP x DP, ZeRO)")
    add("size", type=target_size, default=None, metavar="SIZE",
        help="the target's checkpoint: its total size (e.g. 900GiB), split over the ranks")
    add("bytes-per-rank", type=target_size, default=None, metavar="SIZE",
        help="the target's checkpoint: the bytes each rank restores (default for all three: "
             "the job's checkpoint as archived, a per-rank size kept, a total split over the "
             "ranks)")


def add_rejoin_arguments(sub: argparse.ArgumentParser) -> None:
    """A `stampede rejoin` archive at the target (stampede.model.rejoin): nodes lost there
    and the spare pool (mttr, project)."""
    sub.add_argument("--lost-nodes", type=target_count("--lost-nodes"), default=None, metavar="L",
                     help="a rejoin archive: nodes lost at the target (default: as the run)")
    sub.add_argument("--spare-pool-pct", type=target_percent, default=None, metavar="P",
                     help="a rejoin archive: hot spare nodes at the target, %% of its nodes "
                          "(default 2: a rejoin needs one per lost node)")


def rejoin_options(args: argparse.Namespace) -> tuple[int | None, float]:
    """--spare-pool-pct checked (exit 2; --lost-nodes is by its argparse type): (L or
    None, the pool's fraction)."""
    import math

    from stampede.errors import UsageError
    from stampede.model.rejoin import SPARE_POOL_FRACTION

    percent = args.spare_pool_pct
    if percent is not None and not (math.isfinite(percent) and 0 < percent <= 100):
        raise UsageError(f"--spare-pool-pct {percent:g}: must be above 0 and at most 100")
    return args.lost_nodes, SPARE_POOL_FRACTION if percent is None else percent / 100


def workload_from(args: argparse.Namespace, ranks: int) -> Workload:
    """The stampede.model.workload.Workload that add_workload_arguments' flags name (exit 2
    on a size that does not parse, a model the rank count does not fit)."""
    from stampede.errors import UsageError
    from stampede.model.workload import workload_of
    from stampede.units import parse_size

    def flag(name: str) -> object:
        return getattr(args, f"target_{name}".replace("-", "_"))

    sizes = {}
    for name in ("size", "bytes-per-rank"):
        text = flag(name)
        if text is not None:
            try:
                sizes[name] = float(parse_size(text))
            except ValueError as error:
                raise UsageError(f"--target-{name} {text!r}: {error}") from None
    preset = None
    if flag("model") is not None:
        from stampede.checkpoint.mlperf import MODELS, at_scale, display_name

        model = MODELS[str(flag("model"))]
        try:
            largest, total, files = at_scale(model, ranks)
        except ValueError as error:
            raise UsageError(f"--target-model {model.name}: {error}") from None
        dp = ranks // model.model_parallel
        preset = (display_name(model), f"TP {model.tp} x PP {model.pp} x DP {dp}, ZeRO "
                  f"{model.zero}", float(largest), float(total), files)
    per_node = flag("ranks-per-node")
    return workload_of(ranks, per_node if isinstance(per_node, int) else None,
                       sizes.get("bytes-per-rank"), sizes.get("size"), preset)
