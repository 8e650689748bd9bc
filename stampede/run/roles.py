"""Who does what in a rejoin (`stampede rejoin`, stampede.run.rejoin): the same answer on
every rank, from the ranks' hosts and the job's tiers.* keys. Pure: no MPI, no I/O.

Nodes are numbered in the order of their first rank. The last `spare_nodes` nodes are hot
spares: their ranks hold nothing and wait. Every other rank holds one position (a shard
of the checkpoint, numbered in rank order). Each position's replicas go to `peers` ranks
on other nodes: ring (replica j of a rank on working node i goes to the rank at the same
place on node i + j) or buddy (nodes in pairs, 0-1, 2-3, ...; an odd last node with node
0; one replica). The last `lost_nodes` working nodes are lost (node 0, whose rank 0
reports, never is); their positions pass, in order, to the spare ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from stampede.errors import UsageError
from stampede.replicas import adjacent_loss
from stampede.replicas import holders as holder_nodes


@dataclass(frozen=True)
class Roles:
    nodes: tuple[str, ...]                  # host names, in order of first rank
    node_of: tuple[int, ...]                # rank -> node index
    working: tuple[int, ...]                # position -> the rank that saved it
    spares: tuple[int, ...]                 # ranks on spare nodes, in rank order
    lost_nodes: tuple[int, ...]             # node indexes
    holders: tuple[tuple[int, ...], ...]    # position -> the ranks holding its replicas

    @property
    def lost(self) -> frozenset[int]:
        """Working ranks on lost nodes."""
        return frozenset(rank for rank in self.working if self.node_of[rank] in self.lost_nodes)

    @property
    def restorer(self) -> tuple[int, ...]:
        """position -> the rank that restores it after the loss: its own rank, or a spare."""
        lost_positions = [p for p, rank in enumerate(self.working) if rank in self.lost]
        taken = dict(zip(lost_positions, self.spares))
        return tuple(taken.get(p, rank) for p, rank in enumerate(self.working))

    @property
    def active(self) -> tuple[int, ...]:
        """The ranks of the restored job (survivors and the spares that stand in), sorted."""
        return tuple(sorted(self.restorer))

    def position_of(self, rank: int, after_loss: bool) -> int:
        """The position a rank holds before (saving) or after the loss; -1 for none."""
        order = self.restorer if after_loss else self.working
        return order.index(rank) if rank in order else -1

    def server(self, position: int) -> int:
        """The rank that sends a lost position's replica to its spare: the first holder
        that survived; -1 when none did (the spare then reads storage)."""
        return next((rank for rank in self.holders[position] if rank not in self.lost), -1)

    def held_by(self, rank: int) -> list[int]:
        """The positions whose replicas this rank holds (in the order of its buffers)."""
        return [p for p, holders in enumerate(self.holders) if rank in holders]

    def served_by(self, rank: int) -> list[int]:
        """The lost positions this surviving rank sends to their spares."""
        return [p for p, holder in enumerate(self.working)
                if holder in self.lost and self.server(p) == rank]


def plan_roles(hosts: tuple[str, ...], spare_nodes: int, lost_nodes: int, peers: int,
               placement: str) -> Roles:
    """The roles of a job on these hosts (UsageError when the tiers cannot be placed)."""
    nodes = tuple(dict.fromkeys(hosts))
    node_of = tuple(nodes.index(host) for host in hosts)
    working_nodes = len(nodes) - spare_nodes
    if working_nodes < 1 + lost_nodes:
        raise UsageError(f"tiers: {len(nodes)} node(s) of which {spare_nodes} spare leave "
                         f"{working_nodes} working; losing {lost_nodes} needs at least "
                         f"{lost_nodes + 1} (node 0, with rank 0, survives)",
                         hint="more nodes (mpiexec -hosts, emulate-cluster --nodes), or "
                              "fewer tiers.spare_nodes / tiers.lost_nodes")
    if peers >= working_nodes:
        raise UsageError(f"tiers.peers = {peers}: each replica goes to a working node other "
                         f"than its saver's, and {len(nodes)} node(s) of which {spare_nodes} "
                         f"spare leave {working_nodes} working: at most {working_nodes - 1} "
                         "peer(s)",
                         hint=f"tiers.peers = {working_nodes - 1}, or more nodes")
    if placement == "buddy" and peers > 1:
        raise UsageError(f"tiers.placement = buddy keeps one replica (on the buddy node); "
                         f"tiers.peers = {peers}", hint="tiers.placement = \"ring\"")
    working = tuple(rank for rank, node in enumerate(node_of) if node < working_nodes)
    spares = tuple(rank for rank, node in enumerate(node_of) if node >= working_nodes)
    lost = adjacent_loss(working_nodes, lost_nodes)
    lost_ranks = sum(1 for rank in working if node_of[rank] in lost)
    if lost_ranks > len(spares):
        raise UsageError(f"tiers: the {lost_nodes} lost node(s) held {lost_ranks} ranks and "
                         f"the spare node(s) have {len(spares)}: every lost rank needs a spare",
                         hint="more ranks per spare node, or more tiers.spare_nodes")
    on_node = [[rank for rank in working if node_of[rank] == node] for node in range(working_nodes)]
    holders = []
    for rank in working:
        node = node_of[rank]
        place = on_node[node].index(rank)
        holders.append(tuple(on_node[target][place % len(on_node[target])]
                             for target in holder_nodes(node, working_nodes, placement, peers)))
    return Roles(nodes, node_of, working, spares, lost, tuple(holders))

