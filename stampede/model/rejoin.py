"""A node lost: rejoin from the tiers, or restart from storage? What an archive of
`stampede rejoin` says, as measured and at the target workload. Pure: rows in, numbers out.

The rates and fixed costs come from the latest rejoin run and the runs of its config at
other shard sizes (stampede.model.rejoin_fit: B_node from the peer op, B_storage from the
restart, B_local from the rejoin's reads, F_rejoin and F_restart fitted over the sizes).
At the target (N ranks, k per node, S bytes per rank, L lost nodes adjacent, as the run
loses them, the run's placement and peers; a pool of spare nodes):
  restart  load = F_restart + max(N S / B_storage, k S / B_node)   every shard through the
           storage at the rate the runs measured (as if it delivered no more at N ranks),
           and a node's k shards through its NIC
  rejoin   load = F_rejoin + the slowest of (stampede.model.placement says which apply):
             k S / B_node        a spare node's NIC takes its lost node's k shards
             m k S / B_node      a survivor holding the replicas of m lost nodes sends them
                                 all through its own NIC
             f k S / B_storage   the f lost nodes whose every replica was lost with them
                                 (correlated loss): their spares read storage
             S / B_local         the survivors read their own tier
  A rejoin needs a spare node per lost node (L <= the pool); else it is not possible and
  the restart is what is left.
T_MTTR each way = T_detect + T_cordon_swap + T_pod_init + load + T_barrier_sync, the terms
other than the load as stampede.model.mttr measures them for that layout; the rejoin's
T_pod_init is the spares' own start-up when the run measured it (spare ranks started after
the loss: only they start), the restart's `stampede startup`'s (the whole job starts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stampede.errors import UsageError
from stampede.model.mttr import EXAMPLE, Breakdown, Term, measured_model, synced_at_target
from stampede.model.placement import Recovery, adjacent_loss, recovery
from stampede.model.rejoin_fit import (
    Point,
    Rates,
    describe_rates,
    fit_rates,
    local_rate,
    points,
    rejoin_load,
    restart_load_s,
    spare_start_s,
)
from stampede.model.workload import Workload
from stampede.results.tiers import (
    REJOIN,
    RESTART,
    TIER_RESTORES,
    TIERS,
    tier_column,
)
from stampede.units import BYTES_PER_GB, format_bytes, format_duration, format_percent

if TYPE_CHECKING:
    from stampede.results.archived import Archive

SPARE_POOL_FRACTION = 0.02   # the pool at the target, of the nodes (the seed's 2-5%)
STORAGE_TERM = "S_weights / BW_rank_io"
__all__ = ["Rates", "rejoin_load", "restart_load_s"]


@dataclass(frozen=True)
class RejoinRun:
    """The latest `stampede rejoin` run of an archive: its restores and what they used,
    with the rates fitted over it and its config's runs at other sizes."""

    run_id: str
    nranks: int                    # the restored job's (survivors and spares)
    ranks_per_node: int
    bytes_per_rank: int
    lost_nodes: int
    placement: str
    peers: int
    time_to_last_rank_s: Mapping[str, float]       # layout -> median
    tier_bytes: Mapping[str, Mapping[str, int]]    # layout -> tier -> bytes
    notes: Mapping[str, tuple[str, ...]]           # layout -> what it said
    rates: Rates
    points: tuple[Point, ...] = ()                 # the fit's runs, smallest size first
    spare_start_s: float = math.nan                # the spares' start-up (NaN: not measured)

    @property
    def fallback(self) -> tuple[str, ...]:
        """The rejoin's falls back to storage, as its ranks said them (empty: none)."""
        if not self.tier_bytes[REJOIN].get("storage"):
            return ()
        return tuple(note for note in self.notes[REJOIN] if note.endswith("read from storage"))


def rejoin_run(archive: Archive) -> RejoinRun | None:
    """The archive's latest rejoin run, valid both ways; None without one."""
    for run_id in reversed(archive.rejoin_runs()):
        mine = archive.run_rows(run_id)
        done = {row["layout"]: row for row in mine if row["op"] == "restore"
                and row["layout"] in TIER_RESTORES and row["valid"]}
        if len(done) < len(TIER_RESTORES):
            continue
        rejoin = done[REJOIN]
        found = points(archive, run_id)
        return RejoinRun(
            run_id, rejoin["nranks"], rejoin["ranks_per_node"] or 1, rejoin["bytes_per_rank"],
            rejoin["lost_nodes"] or 1, rejoin["tier_placement"] or "ring", rejoin["tier_peers"] or 1,
            {name: row["time_to_last_rank_s"] for name, row in done.items()},
            {name: {tier: row[tier_column(tier)] for tier in TIERS}
             for name, row in done.items()},
            {name: tuple(filter(None, row["notes"].split(" | "))) for name, row in done.items()},
            fit_rates(found, local_rate(mine)), tuple(found), spare_start_s(mine))
    return None


def at_scale(run: RejoinRun, nodes: int, per_node: int, lost: int) -> Recovery:
    """Where the lost nodes' shards come from on `nodes` working nodes of `per_node`, `lost`
    of them adjacent, with the run's placement and peers (fewer peers where the nodes are
    too few to hold them)."""
    return recovery(nodes, per_node, adjacent_loss(nodes, lost), run.placement,
                    min(run.peers, max(nodes - 1, 1)))


def spare_pool(nodes: int, fraction: float = SPARE_POOL_FRACTION) -> int:
    """Spare nodes in a pool of `fraction` of the nodes (at least one)."""
    return max(1, round(nodes * fraction))


@dataclass(frozen=True)
class Side:
    """One way back (rejoin or restart): its T_MTTR with the load term it needs."""

    layout: str
    model: Breakdown | None        # None: not possible (why_not says why)
    why_not: str = ""
    load_name: str = ""            # the load term's name in `model`

    @property
    def dominant(self) -> str:
        return ", ".join(term.name for term in self.model.dominant) if self.model else ""

    def term(self, name: str) -> str:
        """A term's time and whether it was measured ("-" when not possible)."""
        found = next((term for term in self.model.terms if term.name == name),
                     None) if self.model else None
        if found is None:
            return "-"
        return f"{format_duration(found.seconds)} ({'measured' if found.measured else 'assumed'})"

    @property
    def load(self) -> str:
        """The load term, named, with its time ("-" when not possible)."""
        term = next((term for term in self.model.terms if term.name == self.load_name),
                    None) if self.model else None
        return f"{term.name} {format_duration(term.seconds)}" if term else "-"


@dataclass(frozen=True)
class RejoinVerdict:
    """Rejoin beside restart, as measured and at the workload."""

    run: RejoinRun
    workload: Workload
    per_node: int                  # k at the target
    size: float                    # S at the target
    lost_nodes: int                # L at the target
    spares: int                    # the pool at the target
    spare_fraction: float          # of the nodes there
    measured: tuple[Side, Side]    # rejoin, restart, at the run's scale
    at_target: tuple[Side, Side]
    recovery: Recovery | None = None   # where the lost shards come from at the target

    def summary(self) -> list[str]:
        """The terminal's lines (`stampede assess`): T_MTTR both ways at the workload,
        what dominates, the bytes per tier, the falls back to storage."""
        lines = [f"a node lost (run {self.run.run_id}), at {self.workload.ranks} ranks:"]
        for side in self.at_target:
            lines.append(f"  {side.layout}: T_MTTR {format_duration(side.model.total_s)}, "
                         f"dominant: {side.dominant}" if side.model else
                         f"  {side.layout}: not possible: {side.why_not}")
        lines.append("  bytes by tier: " + "; ".join(
            f"{layout} " + ", ".join(f"{tier} {format_bytes(nbytes)}"
                                     for tier, nbytes in tiers.items() if nbytes)
            for layout, tiers in self.run.tier_bytes.items()))
        return lines + [f"  fell back to storage: {note}" for note in self.run.fallback]

    def describe(self) -> str:
        nodes = self.workload.nodes(self.per_node)
        where = self.recovery
        loss = (f"{self.lost_nodes} adjacent node(s) lost ({self.run.placement}, "
                f"{self.run.peers} peer(s)"
                + (f"; {len(where.from_storage)} of them with no replica left: storage"
                   if where and where.from_storage else "")
                + (f"; one survivor sends {where.busiest_sender_nodes} lost nodes' shards"
                   if where and where.busiest_sender_nodes > 1 else "") + ")")
        return (f"{self.workload.ranks} ranks on {nodes} node(s) of {self.per_node}, "
                f"{format_bytes(self.size)} per rank; {loss}, a pool of {self.spares} spare "
                f"node(s) ({format_percent(self.spare_fraction)} of the nodes). As run "
                f"{self.run.run_id} measured them: {describe_rates(self.run.rates)}")


def with_load(model: Breakdown, name: str, seconds: float, source: str, size: float) -> Breakdown:
    """`model` with its load term replaced (S_weights the bytes per rank given)."""
    terms = tuple(Term(name, seconds, source) if term.name == STORAGE_TERM else term
                  for term in model.terms)
    return replace(model, terms=terms, weights_gb=size / BYTES_PER_GB,
                   bw_rank_gbps=size / seconds / BYTES_PER_GB if seconds > 0 else math.inf)


def with_init(model: Breakdown, seconds: float, source: str) -> Breakdown:
    """`model` with its T_pod_init measured elsewhere (the spares' own start-up)."""
    return replace(model, terms=tuple(Term(term.name, seconds, source)
                                      if term.name == "T_pod_init" else term
                                      for term in model.terms))


def _side(model: Breakdown, layout: str, seconds: float, name: str, source: str,
          size: float) -> Side:
    """One way back: `model` (the layout's measured terms) with the load term `seconds`."""
    if not (seconds > 0 and math.isfinite(seconds)):
        return Side(layout, None, name if name.startswith("not priced") else "no restore time")
    return Side(layout, with_load(model, name, seconds, source, size), load_name=name)


def rejoin_verdict(archive: Archive, workload: Workload,
                   lost_nodes: int | None = None, spare_fraction: float = SPARE_POOL_FRACTION,
                   inputs: Mapping[str, float] = EXAMPLE,
                   sources: Mapping[str, str] | None = None) -> RejoinVerdict | None:
    """Rejoin and restart of the archives' latest rejoin run, as measured and at the
    workload (its ranks per node and bytes per rank, or the run's; L the run's unless
    given), the other terms `inputs` (from `sources`) where not measured; None without a
    rejoin run. Every term comes from that run, its config's runs at other sizes and the
    archives' startup runs, never from another rejoin run's restores."""
    run = rejoin_run(archive)
    if run is None:
        return None
    fitted = {point.run_id for point in run.points}
    archive = archive.without(run_id for run_id in archive.rejoin_runs() if run_id not in fitted)
    k = workload.ranks_per_node or run.ranks_per_node
    size = workload.bytes_per_rank or float(run.bytes_per_rank)
    lost = lost_nodes or run.lost_nodes
    nodes = workload.nodes(k)
    if lost >= nodes:   # more nodes lost than the target has: a typo, not a verdict
        raise UsageError(f"--lost-nodes {lost}: the target's {nodes:,} node(s) "
                         f"({workload.ranks} ranks, {k} per node) must keep one working: "
                         f"at most {nodes - 1:,} lost")
    spares = spare_pool(nodes, spare_fraction)
    # after the refusal above: choosing the runs reads their sidecars
    runs = {layout: archive.term_runs(layout) for layout in TIER_RESTORES}   # chosen once
    models = {layout: measured_model(chosen, inputs, sources)[0] for layout, chosen in runs.items()}
    if math.isfinite(run.spare_start_s):
        models[REJOIN] = with_init(models[REJOIN], run.spare_start_s,
                                   f"measured: run {run.run_id} spare-start, the spares' ranks "
                                   "started after the loss, launch -> last MPI ready")
    measured = tuple(_side(models[layout], layout, run.time_to_last_rank_s[layout],
                           f"{layout} as measured", f"measured: run {run.run_id} {layout}, time "
                           f"to last rank of {run.nranks} ranks", run.bytes_per_rank)
                     for layout in TIER_RESTORES)
    # the whole job syncs again either way back: the barrier at the target's ranks
    models = {layout: synced_at_target(model, runs[layout], workload.ranks)
              for layout, model in models.items()}
    where = at_scale(run, nodes, k, lost)
    seconds, name = rejoin_load(where, size, run.rates)
    rejoin = _side(models[REJOIN], REJOIN, seconds, name,
                   f"projected: {k} x {format_bytes(size)} per node, {lost} adjacent node(s) "
                   f"lost, at the rates of run {run.run_id}", size)
    if lost > spares:
        rejoin = Side(REJOIN, None, f"{lost} lost node(s) and {spares} spare(s) in the pool: "
                                    "the lost ranks have no node to rejoin on")
    nic_bound = k * size / run.rates.node_bps > workload.ranks * size / run.rates.storage_bps
    restart = _side(models[RESTART], RESTART, restart_load_s(workload.ranks, k, size, run.rates),
                    f"F_restart + {'k S / B_node' if nic_bound else 'N S / B_storage'}",
                    f"projected: {workload.ranks} x {format_bytes(size)} at B_storage as run "
                    f"{run.run_id} measured it", size)
    return RejoinVerdict(run, workload, k, size, lost, spares, spare_fraction,
                         (measured[0], measured[1]), (rejoin, restart), where)
