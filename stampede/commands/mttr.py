"""`stampede mttr`: the recovery-time model (stampede.model.mttr) with the terms the
archives hold measured and the rest assumed from flags or a job's [mttr] section."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.flags import (
    add_rejoin_arguments,
    add_target_ranks,
    add_workload_arguments,
    rejoin_options,
    workload_from,
)
from stampede.errors import UsageError
from stampede.model import mttr as model
from stampede.model.mttr import EXAMPLE, EXTRA_DEFAULTS, SECTION_KEYS, WORKED
from stampede.spec import JOB_LIMIT_BYTES
from stampede.units import format_plain

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.model.assessment import PhaseVerdict
    from stampede.model.mttr import Breakdown
    from stampede.model.projection import Projection
    from stampede.model.rejoin import RejoinVerdict
    from stampede.model.workload import Workload
    from stampede.results.archived import Archive, TermRuns


def _section(path: str) -> dict[str, float]:
    from stampede.values import read_text

    text = read_text(Path(path), "job file", JOB_LIMIT_BYTES)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: cannot read it as TOML ({error})") from None
    table = document.get("mttr", {})
    for key, value in table.items():
        if key not in SECTION_KEYS:
            import difflib
            close = difflib.get_close_matches(key, SECTION_KEYS, n=1)
            raise UsageError(f"{path}: unknown key 'mttr.{key}'"
                             + (f' (did you mean "mttr.{close[0]}"?)' if close else ""))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise UsageError(f"{path}: mttr.{key} = {value!r}: must be a number >= 0")
    if "spares" in table and (not float(table["spares"]).is_integer() or table["spares"] < 1):
        raise UsageError(f"{path}: mttr.spares = {table['spares']!r}: must be a whole number >= 1")
    return {key: float(value) for key, value in table.items()}


# Flags that must be positive (a count, a rate divided by); every other number only >= 0.
POSITIVE_FLAGS = ("gpus", "nodes", "bw_rank_gbps")


def _check_flags(args: argparse.Namespace) -> None:
    """Every number given on the command line is finite and not negative (exit 2)."""
    from stampede.values import number_at_least

    for key in (*EXAMPLE, *EXTRA_DEFAULTS):
        value = getattr(args, key)
        if value is None:
            continue
        try:
            number_at_least(0.0, strictly=key in POSITIVE_FLAGS)(value)
        except ValueError as error:
            raise UsageError(f"--{key.replace('_', '-')} {value:g}: {error}") from None


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "mttr", formatter_class=formatter,
        help="The recovery-time model T_MTTR with the terms stampede measured (restore "
             "bandwidth of the slowest rank, start-up, barrier, torch.distributed process "
             "group initialisation) and the rest assumed.",
        description="T_MTTR = T_detect + T_cordon_swap + T_pod_init + S_weights/BW_rank_io "
                    "+ T_barrier_sync", epilog=model.__doc__)
    sub.add_argument("archives", nargs="*", metavar="ARCHIVE",
                     help="archives to take measured terms from (restore, startup and save runs)")
    sub.add_argument("--job", default="", help="a TOML file whose [mttr] section sets the inputs")
    sub.add_argument("--layout", default="", help="restore layout to take BW_rank_io from "
                     "(default: the latest run's fastest layout)")
    for key, default in EXAMPLE.items():
        sub.add_argument(f"--{key.replace('_', '-')}", type=float, default=None,
                         help=f"default {default:g} (the worked example)")
    add_target_ranks(sub, default=None,
                     help="the load term at this rank count: the restore layout's time to last "
                          "rank projected there (as stampede project and the HTML verdict), "
                          "S_weights the workload's bytes per rank")
    add_workload_arguments(sub)
    add_rejoin_arguments(sub)
    sub.add_argument("--gpus", type=float, default=None,
                     help="GPUs of the job (default --target-ranks, else 16384)")
    sub.add_argument("--save-layout", default="", help="save layout to take the checkpoint's "
                     "blocking time C from (default: the latest save run's least blocking one)")
    sub.add_argument("--mtbf-h", type=float, default=None,
                     help="the job's mean time between failures, hours: GPU-hours lost per day "
                          "and, with C, the Young/Daly checkpoint interval sqrt(2 C MTBF)")
    sub.add_argument("--checkpoint-interval-s", type=float, default=None,
                     help="seconds between checkpoints: half of it is redone after a failure")
    sub.add_argument("--checkpoint-cost-s", type=float, default=None,
                     help="C, seconds a checkpoint blocks training (default: measured by a "
                          "save run in the archives, else none)")
    sub.add_argument("--nodes", type=float, default=None, help="nodes in the cluster (default 2048)")
    sub.add_argument("--node-failures-per-day", type=float, default=None,
                     help="failures per node per day (default 0.001)")
    sub.add_argument("--replenish-h", type=float, default=None,
                     help="hours to return a spare to the pool (default 24)")
    sub.add_argument("--cold-swap-s", type=float, default=None,
                     help="seconds to bring in a node when no warm spare is left (default 1800)")
    sub.set_defaults(func=cmd_mttr)


def _check_layouts(args: argparse.Namespace, archive: Archive | None) -> None:
    """--layout and --save-layout name a layout the archives measured (a layout they do not
    hold once gave the worked example, every term "assumed", exit 0)."""
    from stampede.values import did_you_mean

    asked = [(flag, value) for flag, value in (("--layout", args.layout),
                                               ("--save-layout", args.save_layout)) if value]
    if not asked:
        return
    if archive is None:
        raise UsageError(f"{asked[0][0]} {asked[0][1]}: a layout of the archives' runs, and "
                         "no ARCHIVE is given", hint="stampede mttr ARCHIVE --layout LAYOUT")
    rows = [row for row in archive.rows if row["valid"]]
    held = {"--layout": {row["layout"] for row in rows if row["op"] == "restore"},
            "--save-layout": {row["layout"] for row in rows if row["op"] == "blocked"}}
    for flag, value in asked:
        if value not in held[flag]:
            what = "restore" if flag == "--layout" else "save"
            raise UsageError(f"{flag} {value}: no valid {what} run of it in "
                             f"{', '.join(args.archives)} (they hold: "
                             f"{', '.join(sorted(held[flag])) or 'none'})"
                             f"{did_you_mean(value, held[flag])}")


def cmd_mttr(args: argparse.Namespace) -> int:
    from stampede.model.mttr import (
        SavesAtTarget,
        checkpoint_cost_at_target,
        checkpointing,
        costs,
        measured_checkpoint_cost,
        measured_model,
        spare_pools,
    )
    from stampede.present.report import make_console
    from stampede.present.report_models import render_mttr
    from stampede.results.archived import Archive

    _check_flags(args)
    at_target_rejoin = rejoin_options(args)
    archive = Archive.open(*args.archives) if args.archives else None   # read once, here
    _check_layouts(args, archive)
    inputs = dict(EXAMPLE)
    sources = dict.fromkeys(EXAMPLE, WORKED)
    section = _section(args.job) if args.job else {}
    for key in EXAMPLE:
        if key in section:
            inputs[key], sources[key] = section[key], f"assumed ({args.job} [mttr])"
        if getattr(args, key) is not None:
            inputs[key], sources[key] = getattr(args, key), "assumed (flag)"
    workload_line, nodes, layout, projected, save = "", 0, args.layout, None, None
    rejoin = not args.layout and archive is not None and bool(archive.rejoin_runs())
    if args.target_ranks is not None and not rejoin:
        layout, projected, save = target_projection(args, archive)
    runs = archive.term_runs(layout) if archive is not None else None
    model, measured = measured_model(runs, inputs, sources)
    if projected is not None:
        model, workload_line, nodes = at_target(model, *projected, runs)
    if archive is None:
        cost_s, cost_source = 0.0, ""
    elif projected is not None:   # Young/Daly at the target: the save there, not 4 ranks'
        cost_s, cost_source = checkpoint_cost_at_target(
            archive, args.save_layout, save.saves_at_target if save else SavesAtTarget({}),
            projected[1])
    else:
        cost_s, cost_source = measured_checkpoint_cost(archive, args.save_layout)
    if archive is not None and not measured and not cost_s:
        raise UsageError(f"{', '.join(args.archives)}: no valid restore, startup or save run "
                         "to measure from")
    # the rejoin's verdict before any line is printed: a flag it refuses (--lost-nodes above
    # the target's nodes) is one line, not the restart's answer and then the error
    verdict = (_rejoin_beside_restart(args, archive, at_target_rejoin, inputs, sources)
               if rejoin and archive is not None else None)
    # a flag beats the [mttr] section, which beats the built-in default
    defaults = dict(EXTRA_DEFAULTS)
    if verdict is not None:   # one target for the spare pools and the rejoin: the rejoin's
        defaults["gpus"] = float(verdict.workload.ranks)
        defaults["nodes"] = float(verdict.workload.nodes(verdict.per_node))
    elif args.target_ranks is not None:   # the workload's GPUs and nodes
        defaults["gpus"] = float(args.target_ranks)
        defaults["nodes"] = float(nodes)
    extras = {key: float(getattr(args, key)) if getattr(args, key) is not None
              else section.get(key, defaults[key]) for key in EXTRA_DEFAULTS}
    pools = spare_pools(extras["nodes"], extras["node_failures_per_day"], extras["replenish_h"],
                        extras["cold_swap_s"], int(section["spares"]) if "spares" in section else None)
    context = (f"{format_plain(extras['nodes'])} nodes, "
               f"{format_plain(extras['node_failures_per_day'])} failures/node/day, "
               f"{format_plain(extras['replenish_h'])} h to replenish")
    if args.checkpoint_cost_s is not None or "checkpoint_cost_s" in section or not cost_s:
        cost_s = extras["checkpoint_cost_s"]
        cost_source = "assumed (flag)" if args.checkpoint_cost_s is not None else \
            f"assumed ({args.job} [mttr])"
    console = make_console()
    if verdict is not None:   # one T_MTTR per way back, and nothing else called T_MTTR
        from stampede.present.report_models import render_costs, render_rejoin

        ways = {side.layout: side.model for side in verdict.at_target if side.model}
        render_rejoin(verdict, console)
        # the checkpointing priced with the first way back there is: the rejoin's where
        # it is possible, else the restart's (always priced); the output names which
        first_way, first = next(iter(ways.items()))
        render_costs({way: costs(priced, extras["gpus"], extras["checkpoint_interval_s"],
                                 extras["mtbf_h"]) for way, priced in ways.items()},
                     pools, context, console,
                     checkpointing(first, extras["gpus"], cost_s, cost_source, extras["mtbf_h"],
                                   extras["checkpoint_interval_s"]), first_way)
        return 0
    saving = checkpointing(model, extras["gpus"], cost_s, cost_source, extras["mtbf_h"],
                           extras["checkpoint_interval_s"])
    if workload_line:
        console.print(f"workload: {workload_line}", markup=False)
    render_mttr(model, costs(model, extras["gpus"], extras["checkpoint_interval_s"],
                             extras["mtbf_h"]), pools, context, console, saving)
    return 0


def _rejoin_beside_restart(args: argparse.Namespace, archive: Archive,
                           at_target: tuple[int | None, float],
                           inputs: dict[str, float], sources: dict[str, str],
                           ) -> RejoinVerdict | None:
    """An archive of `stampede rejoin` holds both restores: T_MTTR each way as measured
    and at the workload (--target-ranks, else 16,384; stampede.model.rejoin: the rejoin's
    load the peer transfer into a spare node's NIC, the restart's the storage's
    aggregate), the terms that differ and what dominates."""
    from stampede.model.rejoin import rejoin_verdict

    workload = workload_from(args, args.target_ranks or int(EXTRA_DEFAULTS["gpus"]))
    return rejoin_verdict(archive, workload, *at_target, inputs, sources)


def target_projection(args: argparse.Namespace, archive: Archive | None
                      ) -> tuple[str, tuple[Projection, Workload], PhaseVerdict | None]:
    """(the restore layout, (its projection at the workload, the workload), the save's
    verdict there): --layout, or the HTML verdict's (stampede.model.assessment), projected
    as the verdict projects it."""
    from stampede.model.assessment import assess

    if archive is None:
        raise UsageError("--target-ranks: projects the archives' restore runs, and no ARCHIVE "
                         "is given", hint="stampede mttr ARCHIVE --target-ranks N")
    if args.weights_gb is not None:
        raise UsageError("--weights-gb and --target-ranks: S_weights is the target workload's "
                         "bytes per rank (give --target-bytes-per-rank, --target-size or "
                         "--target-model instead)")
    workload = workload_from(args, args.target_ranks)
    assessment = assess(archive, workload)
    verdict = assessment.phases.get("restore")
    layout = args.layout or assessment.mttr_layout
    found = [projection for series, projection, _ in (verdict.projections if verdict else ())
             if series.layout == layout]
    if not found:
        why = verdict.why_no_projection if verdict else "no restore run"
        raise UsageError(f"--target-ranks {args.target_ranks}: no projection of restore layout "
                         f"{layout or '-'} ({why or 'not projected'})")
    return layout, (found[0], workload), assessment.phases.get("save")


def at_target(model: Breakdown, projection: Projection, workload: Workload,
              runs: TermRuns | None) -> tuple[Breakdown, str, int]:
    """`model` with its load term the projection's time to last rank at the workload
    and T_barrier_sync there (the verdict's mttr_at_target); the workload's line and its
    node count."""
    from stampede.model.mttr import mttr_at_target

    at_workload = mttr_at_target(model, projection, workload, runs)
    if at_workload is None:
        raise UsageError(f"--target-ranks {workload.ranks}: layout {projection.fit.layout} "
                         "projects no restore time there (no bytes per rank)")
    per_node = projection.params.ranks_per_node or workload.ranks
    return at_workload, workload.describe_projected([projection]), workload.nodes(per_node)
