"""`stampede project`: the contention model (stampede.model) fitted to archived restore
(or save) runs and projected to a rank count that cannot be run."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from stampede.commands.flags import (
    add_rejoin_arguments,
    add_target_ranks,
    add_workload_arguments,
    rejoin_options,
    workload_from,
)
from stampede.commands.prefix_rates import (
    add_prefix_rate_arguments,
    prefix_rate_flags,
    prefix_rate_table,
)
from stampede.errors import UsageError
from stampede.model import contention as model
from stampede.model.contention import METADATA_OPS, PHASES, SAVE_METADATA_OPS, SAVE_OPS
from stampede.model.fit import Known
from stampede.units import BYTES_PER_GB

if TYPE_CHECKING:
    from collections.abc import Sequence

    from stampede.commands import Subparsers
    from stampede.model.projection import Projection
    from stampede.model.traffic import LayoutBytes
    from stampede.model.workload import Workload
    from stampede.results.archived import Archive
    from stampede.results.cells import Row

# per phase: (the metadata ops fitted by default, those --op may name); what is projected
OPS = {"restore": (METADATA_OPS, METADATA_OPS), "save": (SAVE_METADATA_OPS, SAVE_OPS)}
WHAT = {"restore": "the restore: time to last rank",
        "save": "the save: time until the last rank's bytes are durable"}


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "project", formatter_class=formatter,
        help="Fit a contention model (metadata burst through a server, data through aggregate "
             "and per-client bandwidth) to restore (or, with --phase save, save) runs at several "
             "rank counts, and project time to last rank and the metadata stall to a rank "
             "count you cannot run.",
        description="Project the restore (or the save) to --target-ranks from archived runs at >= 3 "
                    "rank counts. On an object store, with --preset or --prefix-rate (or runs "
                    "that met 503s), also each layout's request-rate table there: 503s, "
                    "backoff, time to last rank, the prefixes or buckets K it needs.",
        epilog=model.__doc__)
    sub.add_argument("archives", nargs="+", metavar="ARCHIVE",
                     help="CSV archives holding restore (or save) runs at three or more rank "
                          "counts (e.g. from stampede sweep, or stampede save at each count)")
    sub.add_argument("--phase", choices=PHASES, default="restore",
                     help="which runs to fit and project: restore (default; time to last rank) "
                          "or save (stampede save's rows: time until the last rank's bytes are "
                          "durable; the metadata ops serialised by the directories' locks)")
    add_target_ranks(sub, "--ranks", required=True,
                help="rank count to project to, e.g. 16384")
    sub.add_argument("--layout", default="", metavar="LAYOUTS",
                     help="comma-separated layouts to project (default: every layout archived)")
    sub.add_argument("--op", default="", metavar="OPS",
                     help="metadata ops that make the stall, comma-separated: these instead of "
                          "the defaults, or +OP to add one to them. Restore: from "
                          f"{', '.join(METADATA_OPS)} (default: all; --op stat projects the stat "
                          "storm alone, the rest falls into the data term). Save: from "
                          f"{', '.join(SAVE_OPS)} (default: {', '.join(SAVE_METADATA_OPS)}; "
                          "--op +fsync where the server's fsync is a metadata request)")
    sub.add_argument("--rtt-s", type=float, default=None,
                     help="known round trip of one metadata op outside the server (seconds)")
    sub.add_argument("--service-s", type=float, default=None,
                     help="known server time of one stampede metadata op, s (seconds); through "
                          "emulate-mds one stat or open of dir/file is 3 requests: pass 3 x its "
                          "--service-s (a save's create is its LOOKUPs at --service-s and one "
                          "CREATE at --create-s)")
    sub.add_argument("--threads", type=float, default=None,
                     help="known server threads c (the drain then counts whole rounds of s)")
    sub.add_argument("--net-gbps", type=float, default=None,
                     help="per-client network bandwidth at the projected scale, GB/s (B_net)")
    sub.add_argument("--node-gbps", type=float, default=None,
                     help="one node's NIC, each direction, GB/s (B_node): held fixed instead of "
                          "fitted (runs on one node cannot tell it from B_agg)")
    sub.add_argument("--replicas", type=int, default=None, metavar="R",
                     help="checkpoint replicas at --target-ranks (default: as the runs grew: one per "
                          "node if every run had one per node, else the largest run's)")
    add_workload_arguments(sub, old_names=True)
    add_rejoin_arguments(sub)
    add_prefix_rate_arguments(sub)
    sub.set_defaults(func=cmd_project)


def _known(args: argparse.Namespace) -> Known:
    rates = ("--net-gbps", "--node-gbps")
    for flag, value, low in (("--rtt-s", args.rtt_s, 0.0), ("--service-s", args.service_s, 0.0),
                             ("--threads", args.threads, 1.0), ("--net-gbps", args.net_gbps, 0.0),
                             ("--node-gbps", args.node_gbps, 0.0)):
        if value is not None and (not math.isfinite(value) or value < low
                                  or (flag in rates and value == 0)):
            raise UsageError(f"{flag} {value}: must be a finite number "
                             f"{'> 0' if flag in rates else f'>= {low:g}'}")
    if args.replicas is not None and not 1 <= args.replicas <= args.target_ranks:
        raise UsageError(f"--replicas {args.replicas}: must be from 1 to --target-ranks "
                         f"({args.target_ranks})")
    if args.replicas is not None and args.target_ranks % args.replicas:
        raise UsageError(f"--replicas {args.replicas} does not divide --target-ranks "
                         f"{args.target_ranks}")
    return Known(rtt_s=args.rtt_s, service_s=args.service_s, threads=args.threads,
                 net_bps=args.net_gbps * BYTES_PER_GB if args.net_gbps is not None else math.inf,
                 node_bps=args.node_gbps * BYTES_PER_GB if args.node_gbps is not None else None)


def chosen_ops(text: str, phase: str) -> tuple[str, ...]:
    """--op: the phase's default ops, or the ops named instead of them, or the defaults
    with the +OPs added (--op fsync alone once replaced the save's ops where the docs
    said it added it: a projection 16x too small)."""
    from stampede.values import did_you_mean

    defaults, allowed = OPS[phase]
    named = [op.strip() for op in text.split(",") if op.strip()]
    added = [op[1:] for op in named if op.startswith("+")]
    if added and len(added) != len(named):
        raise UsageError(f"--op {text!r}: either ops instead of the defaults, or +OPs added to "
                         "them, not both")
    for op in added or named:
        if op not in allowed:
            raise UsageError(f"--op {text!r}: {op!r} is not one of the {phase}'s metadata ops "
                             f"({', '.join(allowed)}){did_you_mean(op, allowed)}")
    if not text.strip():
        return defaults
    if not named:
        raise UsageError(f"--op {text!r}: names no op ({', '.join(allowed)})")
    return tuple(dict.fromkeys((*defaults, *added))) if added else tuple(dict.fromkeys(named))


def cmd_project(args: argparse.Namespace) -> int:
    from stampede.present.report import make_console
    from stampede.results.archived import Archive

    if args.target_ranks < 1:
        raise UsageError(f"--target-ranks {args.target_ranks}: must be at least 1")
    workload = workload_from(args, args.target_ranks)
    known = _known(args)
    ops = chosen_ops(args.op, args.phase)
    at_target_rejoin = rejoin_options(args)
    layouts = tuple(layout.strip() for layout in args.layout.split(",") if layout.strip())
    rates_asked = prefix_rate_flags(args)
    archive = Archive.open(*args.archives)
    # an object store's request-rate limit: the table of stampede.model.prefix_projection
    rated = prefix_rate_table(rates_asked, archive, args.target_ranks, workload.bytes_per_rank,
                              layouts, args.phase)
    try:
        return _fit_and_project(args, archive, workload, known, ops, at_target_rejoin, layouts)
    except UsageError as error:   # the request-rate table shown needs no contention fit
        if not rated:
            raise
        make_console().print(f"[dim]no contention model: {error}[/]")
        return 0


def _fit_and_project(args: argparse.Namespace, archive: Archive, workload: Workload,
                     known: Known, ops: tuple[str, ...],
                     at_target_rejoin: tuple[int | None, float], layouts: tuple[str, ...]) -> int:
    """The contention model fitted to the archive's runs and projected (and a rejoin's)."""
    from stampede.model.projection import project, scale_for
    from stampede.model.rejoin import rejoin_verdict
    from stampede.model.series import projection_notes, series_from_rows
    from stampede.present.report import make_console
    from stampede.present.report_models import render_projection, render_rejoin

    rows = archive.rows
    # a rejoin run (one rank count, two ways back from a lost node) has a model of its own
    series = series_from_rows(archive.without(archive.rejoin_runs()).rows, layouts, ops,
                              args.phase, lambda run_id: archive.sidecar(run_id).value)
    rejoin = rejoin_verdict(archive, workload, *at_target_rejoin) \
        if args.phase == "restore" and not layouts else None
    if rejoin is not None:
        render_rejoin(rejoin, make_console())
    if not series and rejoin is None:
        raise UsageError(f"{', '.join(args.archives)}: no valid {args.phase} run to fit"
                         + _other_phase(rows, args.phase))
    if not series:
        return 0
    projections = []
    for item in series:
        scale = scale_for(item, args.target_ranks, workload.ranks_per_node, args.replicas,
                          workload.bytes_per_rank)
        projection = project(item.points, item.layout, scale, known,
                             item.per_rank_size, locks=item.locks, phase=args.phase)
        projections.append((item, projection, projection_notes(item, projection, args.target_ranks,
                                                               known)))
    given = [name for name, value in (("RTT", known.rtt_s), ("s", known.service_s),
                                      ("c", known.threads), ("B_node", known.node_bps))
             if value is not None]
    served = _bytes_at_target(projections[0][1], args.target_ranks) \
        if args.phase == "restore" else None
    render_projection(projections, workload, args.archives, given, make_console(),
                      WHAT[args.phase], served)
    from stampede.model.mds_drain import mds_drains
    from stampede.present.report_mds import render_mds_drains
    render_mds_drains(mds_drains(archive, projections, args.target_ranks), make_console())
    return 0


def _bytes_at_target(projection: Projection, nranks: int) -> tuple[str, list[LayoutBytes]]:
    """Every layout's bytes from storage at the target, as the projection placed the
    ranks (its ranks per node, replicas and bytes per rank), and where that is."""
    from stampede.model.traffic import Geometry, layout_bytes

    params = projection.params
    geometry = Geometry(nranks, params.ranks_per_node, params.replicas, params.broadcast_group)
    return (f"{nranks} ranks, {geometry.nnodes:,} node(s) of {geometry.per_node:,}",
            layout_bytes(geometry, params.bytes_per_rank))


def _other_phase(rows: Sequence[Row], phase: str) -> str:
    """ (they hold save runs: --phase save), where the other phase is there."""
    from stampede.model.series import row_phase
    other = next((name for name in PHASES if name != phase), "")
    if any(row.get("op") == other and row_phase(row) == other for row in rows):
        return f" (they hold {other} runs: --phase {other})"
    return ""
