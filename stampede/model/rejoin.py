"""A node lost: rejoin from the tiers, or restart from storage? What an archive of
`stampede rejoin` says, as measured and at the target workload. Pure: rows in, numbers out.

From the latest rejoin run of the rows (stampede.results.tiers names its layouts):
  B_node     a node NIC's rate, from the spares' peer transfer: the bytes the spares
             received from peers per iteration / the peer op's elapsed time (first send
             to last arrival, median over iterations) / the spare nodes receiving
             (tiers.lost_nodes: each takes one lost node's ranks)
  B_storage  the restart's aggregate rate: all ranks' bytes / its time to last rank
  B_local    one survivor reading its own local tier: bytes per rank / the rejoin's
             first done
At the target (N ranks, k per node, S bytes per rank, L lost nodes, a pool of spare nodes):
  restart  load = max(N S / B_storage, k S / B_node)   every shard through the storage,
           at the rate the run measured (one rank count: nothing fitted, so as if the
           storage delivered no more at N ranks than it did here), and a node's k shards
           through its NIC
  rejoin   load = max(k S / B_node, S / B_local)       each spare node takes a lost
           node's k shards from their peers through its NIC (the losses independent, so
           no two lost nodes share a holder), while the survivors read their own tier
  A rejoin needs a spare node per lost node (L <= the pool); else it is not possible and
  the restart is what is left.
T_MTTR each way = T_detect + T_cordon_swap + T_pod_init + load + T_barrier_sync, the terms
other than the load as stampede.model.mttr measures them for that layout (T_pod_init from
`stampede startup` rows in the archives, else assumed; T_barrier_sync its straggler wait).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stampede.errors import UsageError
from stampede.model.mttr import EXAMPLE, Breakdown, Term, measured_model, synced_at_target
from stampede.model.workload import Workload
from stampede.results.tiers import REJOIN, RESTART, TIER_RESTORES, TIERS, tier_column
from stampede.units import BYTES_PER_GB, format_bytes, format_duration, format_percent, format_rate

if TYPE_CHECKING:
    from stampede.results.archived import Archive

SPARE_POOL_FRACTION = 0.02   # the pool at the target, of the nodes (the seed's 2-5%)
PEER_TERM = "peer transfer k S / B_node"
STORAGE_TERM = "S_weights / BW_rank_io"


@dataclass(frozen=True)
class Rates:
    """What the run measured, bytes per second (NaN: not measured)."""

    node_bps: float      # a node NIC (the spares' peer transfer)
    storage_bps: float   # the storage's aggregate (the restart)
    local_bps: float     # one rank from its own local tier


@dataclass(frozen=True)
class RejoinRun:
    """The latest `stampede rejoin` run of an archive: its restores and what they used."""

    run_id: str
    nranks: int                    # the restored job's (survivors and spares)
    ranks_per_node: int
    bytes_per_rank: int
    lost_nodes: int
    time_to_last_rank_s: Mapping[str, float]       # layout -> median
    tier_bytes: Mapping[str, Mapping[str, int]]    # layout -> tier -> bytes
    notes: Mapping[str, tuple[str, ...]]           # layout -> what it said
    rates: Rates

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
        rejoin, restart = done[REJOIN], done[RESTART]
        size = rejoin["bytes_per_rank"]
        lost = rejoin["lost_nodes"] or 1
        peer = next((row for row in mine if row["op"] == "peer" and row["layout"] == REJOIN), None)
        received = peer["op_bytes"] / max(rejoin["iterations"], 1) if peer else 0
        elapsed = peer["elapsed_s"] if peer else math.nan
        rates = Rates(node_bps=received / elapsed / lost if received and elapsed > 0 else math.nan,
                      storage_bps=size * restart["nranks"]
                      / restart["time_to_last_rank_s"],
                      local_bps=size / rejoin["first_done_s"])
        return RejoinRun(
            run_id, rejoin["nranks"], rejoin["ranks_per_node"] or 1, size, lost,
            {name: row["time_to_last_rank_s"] for name, row in done.items()},
            {name: {tier: row[tier_column(tier)] for tier in TIERS}
             for name, row in done.items()},
            {name: tuple(filter(None, row["notes"].split(" | "))) for name, row in done.items()},
            rates)
    return None


def restart_load_s(ranks: int, per_node: int, size: float, rates: Rates) -> float:
    """Every shard from storage: the storage's aggregate, or a node's NIC, whichever is
    slower (a NIC not measured: the storage alone)."""
    nic = per_node * size / rates.node_bps if math.isfinite(rates.node_bps) else 0.0
    return max(ranks * size / rates.storage_bps, nic)


def rejoin_load_s(per_node: int, size: float, rates: Rates) -> float:
    """A spare node's k shards through its NIC, or a survivor's own read, whichever is
    slower; NaN when no peer transfer was measured."""
    return max(per_node * size / rates.node_bps, size / rates.local_bps)


def spare_pool(nodes: int, fraction: float = SPARE_POOL_FRACTION) -> int:
    """Spare nodes in a pool of `fraction` of the nodes (at least one)."""
    return max(1, round(nodes * fraction))


@dataclass(frozen=True)
class Side:
    """One way back (rejoin or restart): its T_MTTR with the load term it needs."""

    layout: str
    model: Breakdown | None        # None: not possible (why_not says why)
    why_not: str = ""

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
        term = next((term for term in self.model.terms if term.name in (PEER_TERM, STORAGE_TERM)),
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
        return (f"{self.workload.ranks} ranks on {nodes} node(s) of {self.per_node}, "
                f"{format_bytes(self.size)} per rank; {self.lost_nodes} node(s) lost, a pool of "
                f"{self.spares} spare node(s) ({format_percent(self.spare_fraction)} of the nodes); B_node "
                f"{_rate(self.run.rates.node_bps)}, B_storage {_rate(self.run.rates.storage_bps)}, "
                f"B_local {_rate(self.run.rates.local_bps)} per rank, as run {self.run.run_id} "
                "measured them")


def _rate(bps: float) -> str:
    return format_rate(bps, "B/s") if math.isfinite(bps) else "not measured"


def with_load(model: Breakdown, name: str, seconds: float, source: str, size: float) -> Breakdown:
    """`model` with its load term replaced (S_weights the bytes per rank given)."""
    terms = tuple(Term(name, seconds, source) if term.name == STORAGE_TERM else term
                  for term in model.terms)
    return replace(model, terms=terms, weights_gb=size / BYTES_PER_GB,
                   bw_rank_gbps=size / seconds / BYTES_PER_GB if seconds > 0 else math.inf)


def _side(model: Breakdown, layout: str, seconds: float, source: str, size: float) -> Side:
    """One way back: `model` (the layout's measured terms) with the load term `seconds`."""
    if not (seconds > 0 and math.isfinite(seconds)):
        return Side(layout, None, "no peer transfer measured (every spare fell back to "
                                  "storage)" if layout == REJOIN else "no restore time")
    name = PEER_TERM if layout == REJOIN else STORAGE_TERM
    return Side(layout, with_load(model, name, seconds, source, size))


def rejoin_verdict(archive: Archive, workload: Workload,
                   lost_nodes: int | None = None, spare_fraction: float = SPARE_POOL_FRACTION,
                   inputs: Mapping[str, float] = EXAMPLE,
                   sources: Mapping[str, str] | None = None) -> RejoinVerdict | None:
    """Rejoin and restart of the archives' latest rejoin run, as measured and at the
    workload (its ranks per node and bytes per rank, or the run's; L the run's unless
    given), the other terms `inputs` (from `sources`) where not measured; None without a
    rejoin run. Every term comes from that run (and the archives' other runs: startup's),
    never from another rejoin run's restores."""
    run = rejoin_run(archive)
    if run is None:
        return None
    archive = archive.without(run_id for run_id in archive.rejoin_runs() if run_id != run.run_id)
    k = workload.ranks_per_node or run.ranks_per_node
    size = workload.bytes_per_rank or float(run.bytes_per_rank)
    lost = lost_nodes or run.lost_nodes
    if lost > workload.nodes(k):   # more nodes lost than the target has: a typo, not a verdict
        raise UsageError(f"--lost-nodes {lost}: more than the target's {workload.nodes(k):,} "
                         f"node(s) ({workload.ranks} ranks, {k} per node)")
    spares = spare_pool(workload.nodes(k), spare_fraction)
    # after the refusal above: choosing the runs reads their sidecars
    runs = {layout: archive.term_runs(layout) for layout in TIER_RESTORES}   # chosen once
    models = {layout: measured_model(chosen, inputs, sources)[0] for layout, chosen in runs.items()}
    measured = tuple(_side(models[layout], layout, run.time_to_last_rank_s[layout],
                           f"measured: run {run.run_id} {layout}, time to last rank of "
                           f"{run.nranks} ranks", run.bytes_per_rank)
                     for layout in TIER_RESTORES)
    # the whole job syncs again either way back: the barrier at the target's ranks
    models = {layout: synced_at_target(model, runs[layout], workload.ranks)
              for layout, model in models.items()}
    rejoin = _side(models[REJOIN], REJOIN, rejoin_load_s(k, size, run.rates),
                   f"projected: {k} x {format_bytes(size)} into a spare node at B_node as run "
                   f"{run.run_id} measured it", size)
    if lost > spares:
        rejoin = Side(REJOIN, None, f"{lost} lost node(s) and {spares} spare(s) in the pool: "
                                    "the lost ranks have no node to rejoin on")
    restart = _side(models[RESTART], RESTART, restart_load_s(workload.ranks, k, size, run.rates),
                    f"projected: {workload.ranks} x {format_bytes(size)} at B_storage as run "
                    f"{run.run_id} measured it", size)
    return RejoinVerdict(run, workload, k, size, lost, spares, spare_fraction,
                         (measured[0], measured[1]), (rejoin, restart))

