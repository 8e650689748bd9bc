"""The rates and fixed costs a rejoin archive measured, each from the op that measures it,
fitted over the shard sizes the archive ran (`stampede rejoin --sizes A,B`). Pure: rows in.

A rejoin run of config (W working nodes of k ranks, L lost, the replicas' placement and
peers) is matched with the archive's other rejoin runs of the same config (job, ranks,
ranks per node, lost and spare nodes, peers, placement, cache) and another shard size S;
the latest run of each size is a point. The busiest NIC's bytes X(S) of a point are
stampede.model.placement's (a spare node's k S, or a survivor sending the shards of several
lost nodes).
  B_node     the peer op (first send to last arrival, median over iterations): its time
             = a + X / B_node over the points, B_node from the slope (the intercept a: the
             replica's read before the first byte, MPI's start): bytes over time, overhead
             included, extrapolates a fixed cost linearly and was 30% off when the size
             doubled. One size only: X / the peer op's time (overhead included, said).
  B_storage  the restart's restore (time to last rank of all P ranks): its time =
             F_restart + P S / B_storage over the points (one size: P S / its time, F 0).
  B_local    one rank reading its own local tier: a block / the rejoin's read op's median.
  F_rejoin   the rejoin's fixed part (the peer's read of its replica, the spare's hash,
             MPI): the rejoin's time to last rank less its modelled transfer
             (stampede.model.rejoin.transfer_s at the rates above), the mean over the points.
  T_pod_init the spares' own start-up, when the run measured it (layout spare-start:
             launch -> MPI ready of the spare ranks started after the loss, op startup).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stampede.model.placement import Recovery, adjacent_loss, recovery
from stampede.results.tiers import REJOIN, RESTART, SPARE_START, TIER_RESTORES
from stampede.units import format_bytes, format_rate, format_seconds

if TYPE_CHECKING:
    from stampede.results.archived import Archive
    from stampede.results.cells import Row

# what makes two rejoin runs points of one fit (all but the shard size the same)
SAME_CONFIG = ("job", "nranks", "ranks_per_node", "lost_nodes", "spare_nodes", "tier_peers",
               "tier_placement", "cache", "hosts")


@dataclass(frozen=True)
class Rates:
    """What the runs measured, bytes per second (NaN: not measured), fixed seconds, and
    how each was found (`how`, by name: B_node, B_storage, B_local, F_rejoin, F_restart)."""

    node_bps: float      # B_node: a node's NIC (the peer op)
    storage_bps: float   # B_storage: the storage's aggregate (the restart)
    local_bps: float     # B_local: one rank from its own local tier (the read op)
    rejoin_fixed_s: float = 0.0
    restart_fixed_s: float = 0.0
    how: tuple[tuple[str, str], ...] = ()
    peer_fixed_s: float = 0.0   # the peer op's intercept (its own fixed part, inside F_rejoin)

    def said(self, name: str) -> str:
        return dict(self.how).get(name, "")


@dataclass(frozen=True)
class Point:
    """One rejoin run at one shard size, as a point of the fit."""

    run_id: str
    size: int                 # S, bytes per rank
    positions: int            # P = W k
    nic_bytes: float          # the busiest NIC's bytes in the rejoin, per iteration
    peer_s: float             # the peer op's time (NaN: no peer transfer)
    rejoin_s: float           # the rejoin's time to last rank
    restart_s: float          # the restart's time to last rank
    recovery: Recovery


def point(rows: Sequence[Row]) -> Point | None:
    """A rejoin run's point (its rows), None unless both restores are there and valid."""
    done = {row["layout"]: row for row in rows if row["op"] == "restore"
            and row["layout"] in TIER_RESTORES and row["valid"]}
    if len(done) < len(TIER_RESTORES):
        return None
    rejoin = done[REJOIN]
    k = rejoin["ranks_per_node"] or 1
    working = max(rejoin["nranks"] // k, 1)
    lost = rejoin["lost_nodes"] or 1
    where = recovery(working, k, adjacent_loss(working, lost), rejoin["tier_placement"] or "ring",
                     rejoin["tier_peers"] or 1)
    size = rejoin["bytes_per_rank"]
    peer = next((row for row in rows if row["op"] == "peer" and row["layout"] == REJOIN
                 and row["op_bytes"]), None)
    return Point(rejoin["run_id"], size, rejoin["nranks"], where.nic_bytes(size),
                 peer["elapsed_s"] if peer else math.nan, rejoin["time_to_last_rank_s"],
                 done[RESTART]["time_to_last_rank_s"], where)


def points(archive: Archive, run_id: str) -> list[Point]:
    """The run's point and, of the archive's rejoin runs of its config at other shard
    sizes, the latest of each size; smallest size first."""
    mine = archive.run_rows(run_id)
    key = next(tuple(row[column] for column in SAME_CONFIG) for row in mine
               if row["op"] == "restore" and row["layout"] == REJOIN)
    latest: dict[int, Point] = {}
    for other in archive.rejoin_runs():
        rows = archive.run_rows(other)
        restore = next((row for row in rows if row["op"] == "restore" and row["layout"] == REJOIN),
                       None)
        if restore is None or tuple(restore[column] for column in SAME_CONFIG) != key:
            continue
        found = point(rows)
        if found is not None:
            latest[found.size] = found
    own = point(mine)
    if own is not None:
        latest[own.size] = own
    return [latest[size] for size in sorted(latest)]


def local_rate(rows: Sequence[Row]) -> float:
    """B_local: a block over the rejoin's read op's median (the survivors' own tier)."""
    read = next((row for row in rows if row["op"] == "read" and row["layout"] == REJOIN), None)
    if read is None or not read["lat_p50_s"] > 0:
        return math.nan
    return float(read["block_bytes"]) / read["lat_p50_s"]


def spare_start_s(rows: Sequence[Row]) -> float:
    """The spares' start-up (launch -> last spare rank MPI-ready); NaN when not measured."""
    found = next((row for row in rows if row["op"] == "startup" and row["layout"] == SPARE_START
                  and row["valid"]), None)
    return found["time_to_last_rank_s"] if found else math.nan


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of least squares through the points."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return slope, mean_y - slope * mean_x


def fit_rates(found: Sequence[Point], local_bps: float) -> Rates:
    """The rates and fixed costs over the points (module docstring)."""
    largest = found[-1]
    sizes = ", ".join(format_bytes(p.size) for p in found)
    peers = [p for p in found if math.isfinite(p.peer_s) and p.peer_s > 0]
    how = {"B_local": "a block / the rejoin's read op p50 (a survivor's own tier)"}
    slope, peer_fixed = line([p.nic_bytes for p in peers], [p.peer_s for p in peers]) \
        if len(peers) > 1 else (0.0, 0.0)
    if slope > 0:
        node_bps = 1 / slope
        how["B_node"] = (f"the peer op's time over the busiest NIC's bytes at {sizes} per rank "
                         "(the slope; its intercept is the replica's read and MPI)")
    elif peers:
        node_bps, peer_fixed = peers[-1].nic_bytes / peers[-1].peer_s, 0.0
        how["B_node"] = (f"the busiest NIC's bytes / the peer op's time at "
                         f"{format_bytes(peers[-1].size)} per rank (one size: overhead included)")
    else:
        node_bps, peer_fixed = math.nan, 0.0
        how["B_node"] = "not measured (no peer transfer: every spare read storage)"
    slope, intercept = line([p.positions * p.size for p in found], [p.restart_s for p in found]) \
        if len(found) > 1 else (0.0, 0.0)
    if slope > 0 and intercept >= 0:
        storage_bps, restart_fixed = 1 / slope, intercept
        how["B_storage"] = f"the restart's time to last rank over all ranks' bytes at {sizes} per rank"
        how["F_restart"] = "that line's intercept"
    else:
        storage_bps = largest.positions * largest.size / largest.restart_s
        restart_fixed = 0.0
        how["B_storage"] = (f"all ranks' bytes / the restart's time to last rank at "
                            f"{format_bytes(largest.size)} per rank (overhead included)")
    rates = Rates(node_bps, storage_bps, local_bps, 0.0, restart_fixed)
    rest = [p.rejoin_s - transfer_s(p.recovery, p.size, rates) for p in found]
    if len(found) > 1 and all(math.isfinite(value) for value in rest):
        rejoin_fixed = max(statistics.fmean(rest), 0.0)
        how["F_rejoin"] = (f"the rejoin's time to last rank less its transfer, mean over "
                           f"{sizes} per rank")
    else:
        rejoin_fixed = 0.0
        how["F_rejoin"] = ("not fitted: one shard size (stampede rejoin --sizes A,B fits it); "
                           "its overhead is inside B_node")
    return Rates(node_bps, storage_bps, local_bps, rejoin_fixed, restart_fixed,
                 tuple(how.items()), max(peer_fixed, 0.0))


def bounds(where: Recovery, size: float, rates: Rates) -> list[tuple[float, str]]:
    """The rejoin's transfer bounds, seconds and what each is: the busiest NIC (a spare
    node's k S, or a survivor sending several lost nodes' shards), the storage serving the
    positions with no replica left (few clients: at the storage's whole rate, B_storage),
    a survivor's own tier. A bound with no bytes is left out."""
    k = where.per_node
    found = []
    senders = where.busiest_sender_nodes
    if senders > 1:   # its NIC carries more than any spare node's
        found.append((senders * k * size / rates.node_bps,
                      f"a survivor's NIC sends {senders} lost nodes' shards: {senders} k S / B_node"))
    elif senders or math.isfinite(rates.node_bps):
        found.append((k * size / rates.node_bps, "a spare node's NIC: k S / B_node"))
    stored = where.storage_bytes(size)
    if stored:
        found.append((stored / rates.storage_bps,
                      f"storage fall-back, {len(where.from_storage)} node(s) with no replica: "
                      f"{len(where.from_storage)} k S / B_storage"))
    found.append((size / rates.local_bps, "a survivor's own tier: S / B_local"))
    return found


def transfer_s(where: Recovery, size: float, rates: Rates) -> float:
    """The slowest of the rejoin's transfer bounds (NaN when a rate it needs is not
    measured)."""
    return rejoin_load(where, size, rates)[0] - rates.rejoin_fixed_s


def rejoin_load(where: Recovery, size: float, rates: Rates) -> tuple[float, str]:
    """The rejoin's load term, F_rejoin + the slowest bound, and its name."""
    found = bounds(where, size, rates)
    if any(math.isnan(seconds) for seconds, _ in found):
        return math.nan, "not priced: " + ", ".join(name for seconds, name in found
                                                   if math.isnan(seconds))
    seconds, name = max(found, key=lambda bound: bound[0])
    return rates.rejoin_fixed_s + seconds, f"F_rejoin + {name}"


def restart_load_s(ranks: int, per_node: int, size: float, rates: Rates) -> float:
    """F_restart + every shard from storage: the storage's aggregate, or a node's NIC,
    whichever is slower (a NIC not measured: the storage alone)."""
    nic = per_node * size / rates.node_bps if math.isfinite(rates.node_bps) else 0.0
    return rates.restart_fixed_s + max(ranks * size / rates.storage_bps, nic)


def describe_rates(rates: Rates) -> str:
    """B_node, B_storage, B_local and the fixed terms, each with the op it came from."""
    def rate(bps: float) -> str:
        return format_rate(bps, "B/s") if math.isfinite(bps) else "not measured"
    def fixed(name: str, seconds: float) -> str:
        how = rates.said(name)
        if not how or how.startswith("not fitted"):
            return how.replace("not fitted", f"{name} not fitted", 1) if how else \
                f"{name} not fitted"
        return f"{name} {format_seconds(seconds)} ({how})"
    return "; ".join((
        f"B_node {rate(rates.node_bps)} ({rates.said('B_node')})",
        f"B_storage {rate(rates.storage_bps)} ({rates.said('B_storage')})",
        f"B_local {rate(rates.local_bps)} per rank ({rates.said('B_local')})",
        fixed("F_rejoin", rates.rejoin_fixed_s), fixed("F_restart", rates.restart_fixed_s)))
