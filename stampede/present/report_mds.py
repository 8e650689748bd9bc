"""`stampede project` on a CephFS target: the MDS's drain at the target rank count from the
MDS's own counters (stampede.model.mds_drain), beside the latency-fitted metadata stall.
Values come computed; this only formats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stampede.present.tables import ItemColumn, Verbatim, item_table
from stampede.units import format_duration, format_plain, format_seconds

if TYPE_CHECKING:
    from rich.console import Console

    from stampede.model.mds_drain import MdsDrain, OpDrain
    from stampede.model.projection import Projection

TITLE = "MDS drain, from the MDS's counters (its own requests and mean latency per op, not inferred)"
SERIAL = ("one active MDS serves its requests one at a time (under its lock): they drain in "
          "series, T_MDS = sum over ops of R_op(N) x s_op")


def _count(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{format_plain(value)}"


def _ms(seconds: float) -> str:
    return f"{format_plain(seconds * 1e3)}"


OPS: tuple[ItemColumn[OpDrain], ...] = (
    ItemColumn("op", lambda drain: drain.op, left=True),
    ItemColumn("measured @ranks", lambda drain: ", ".join(
        f"{_count(count)} @{nranks}" for nranks, count in drain.growth.measured), left=True),
    ItemColumn("per rank", lambda drain: format_plain(drain.growth.per_rank)),
    ItemColumn("fixed", lambda drain: ("+" if drain.growth.fixed >= 0 else "")
               + format_plain(drain.growth.fixed)),
    ItemColumn("at target", lambda drain: _count(drain.requests)),
    ItemColumn("s_op ms", lambda drain: f"{_ms(drain.service_s)} @{drain.service_at}"),
    ItemColumn("1/s_op /s", lambda drain: f"{drain.rate_per_s:,.0f}"),
    ItemColumn("range ms", lambda drain: f"{_ms(drain.service_range_s[0])}-"
               f"{_ms(drain.service_range_s[1])}"),
    ItemColumn("drain", lambda drain: format_seconds(drain.drain_s)),
)


def render_mds_drains(drains: Sequence[tuple[MdsDrain, Projection | None]],
                      console: Console) -> None:
    """Per layout whose runs the MDS counted: its requests per op as measured and fitted,
    at the target, each op's service time and the drain, then the latency-fitted metadata
    stall of the same layout beside it. Nothing where no run was counted."""
    if not drains:
        return
    console.print()
    console.print(TITLE, markup=False)
    console.print(f"  {SERIAL}", markup=False)
    for drain, projection in drains:
        _render(drain, projection, console)


def _render(drain: MdsDrain, projection: Projection | None, console: Console) -> None:
    per = "one restore" if drain.phase == "restore" else "one save"
    clients = ("each rank its own client: R = a N + b, b once per job" if drain.client_per_rank
               else f"the ranks of a node share its mount's client: R = a N + b x nodes "
                    f"({drain.nodes:,} nodes)")
    ranks = ", ".join(str(count.nranks) for count in drain.counts)
    if not drain.ops:
        console.print(f"layout {drain.layout} ({drain.phase}): the MDS counted no request at "
                      f"{ranks} ranks: its clients held the caps already (a mount that wrote "
                      "the files, or a client that read them before), so the counts say nothing "
                      "of fresh clients; through cephfs:// each rank is a fresh client of its "
                      "own", markup=False)
        return
    console.print(f"layout {drain.layout} ({drain.phase}; requests per {per.split()[1]}; "
                  f"{clients})", markup=False)
    total: OpDrain | Verbatim = Verbatim(("all", "", "", "", _count(drain.requests), "", "", "",
                                          format_seconds(drain.drain_s)))
    console.print(item_table("", OPS, [*drain.ops, total]))
    low, high = drain.band_s
    revoked = drain.caps_revoked
    console.print(f"  at {drain.nranks:,} ranks: {per} asks the MDS {_count(drain.requests)} "
                  f"requests, drained in {format_duration(drain.drain_s)} (band "
                  f"{format_duration(low)} - {format_duration(high)}: each op at its least and its "
                  f"largest mean), {drain.rate_per_s:,.0f} requests/s; caps revoked "
                  f"{_count(revoked.at(drain.nranks, drain.nodes))}"
                  f" (measured {', '.join(f'{_count(c)} @{n}' for n, c in revoked.measured)})",
                  markup=False)
    if projection is not None:
        console.print(f"  beside it, the latency-fitted metadata stall (above): "
                      f"{format_seconds(projection.prediction.meta_s)}", markup=False)
