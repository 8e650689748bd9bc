"""Where a lost node's shards come back from, at any scale: the replicas' placement (as
stampede.run.roles places them in a run), a correlated loss, and the bytes each NIC and the
storage carry in the rejoin. Pure: numbers in, numbers out (stampede.model.rejoin prices
them).

Working nodes 0..W-1 of k ranks each; node i holds positions i k .. i k + k - 1. Each
position's replicas go to `peers` other nodes: ring (node i + j mod W, j = 1..peers) or
buddy (nodes in pairs 0-1, 2-3, ...; an odd last node with node 0; one replica), the rank
at the same place there. A correlated loss takes L adjacent nodes (a rack, a switch): the
last L working nodes, as `stampede rejoin` loses them (node 0 survives). A lost position
comes back from its first surviving holder, through that holder node's NIC, into the spare
node standing in for its node (one spare node per lost node, k ranks each); a position
whose every holder was lost too comes back from storage into that spare node.

So with ring placement and p peers, L adjacent losses leave max(0, L - p) nodes' shards
with no replica (their holders i+1..i+p were all lost), and the first survivor after the
block (node 0) serves the lost nodes whose holders reach it: up to min(L, p) nodes' shards
through one NIC. Buddy placement loses a pair's shards when the block holds both buddies.
"""

from __future__ import annotations

from dataclasses import dataclass

from stampede.replicas import adjacent_loss, holders

__all__ = ["Recovery", "adjacent_loss", "holders", "recovery"]   # the rule, with its model


@dataclass(frozen=True)
class Recovery:
    """Who sends each lost node's shards after a loss: node -> its server node, or -1 (no
    replica survived: storage)."""

    working: int                         # W
    per_node: int                        # k
    lost: tuple[int, ...]                # the lost nodes
    server: tuple[tuple[int, int], ...]  # (lost node, the node serving its shards or -1)

    @property
    def from_storage(self) -> tuple[int, ...]:
        """The lost nodes whose every replica was lost with them."""
        return tuple(node for node, server in self.server if server < 0)

    def positions_lost_everywhere(self) -> frozenset[int]:
        """The positions with no replica left (read from storage by their spares)."""
        k = self.per_node
        return frozenset(node * k + place for node in self.from_storage for place in range(k))

    def served_by(self) -> dict[int, int]:
        """Surviving node -> how many lost nodes' shards it sends."""
        count: dict[int, int] = {}
        for _, server in self.server:
            if server >= 0:
                count[server] = count.get(server, 0) + 1
        return count

    @property
    def busiest_sender_nodes(self) -> int:
        """The most lost nodes' shards one survivor sends (0: none sent)."""
        return max(self.served_by().values(), default=0)

    def nic_bytes(self, size: float) -> float:
        """The busiest NIC's bytes: a sender's (all the shards it serves) or a spare node's
        (its lost node's k shards, from a peer or from storage)."""
        k = self.per_node
        received = k * size if self.lost else 0.0
        return max(self.busiest_sender_nodes * k * size, received)

    def storage_bytes(self, size: float) -> float:
        """The bytes the storage serves in the rejoin (the positions with no replica)."""
        return len(self.from_storage) * self.per_node * size


def recovery(working: int, per_node: int, lost: tuple[int, ...], placement: str,
             peers: int) -> Recovery:
    """Where each lost node's shards come from (module docstring)."""
    gone = set(lost)
    server = []
    for node in lost:
        alive = [holder for holder in holders(node, working, placement, peers)
                 if holder not in gone]
        server.append((node, alive[0] if alive else -1))
    return Recovery(working, per_node, tuple(lost), tuple(server))
