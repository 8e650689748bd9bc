"""Where a rejoin's replicas go and which nodes a loss takes, node by node: the one rule
`stampede rejoin` places them by (stampede.run.roles) and its model prices them by
(stampede.model.placement). Pure.

Working nodes 0..W-1. A node's positions have `peers` replicas on other nodes: ring (node
i + j mod W, j = 1..peers) or buddy (nodes in pairs 0-1, 2-3, ...; an odd last node with
node 0; one replica). A loss of L nodes takes the last L working nodes (node 0, with rank
0, survives).
"""

from __future__ import annotations


def holders(node: int, working: int, placement: str, peers: int) -> tuple[int, ...]:
    """The nodes holding the replicas of node `node`'s positions, nearest first."""
    if placement == "buddy":
        partner = node ^ 1
        return ((partner if partner < working else 0),)[:peers]
    return tuple((node + j) % working for j in range(1, peers + 1))


def adjacent_loss(working: int, lost: int) -> tuple[int, ...]:
    """L adjacent nodes lost: the last L working nodes (node 0, with rank 0, survives)."""
    return tuple(range(working - lost, working))
