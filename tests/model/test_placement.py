"""Where a lost node's shards come back from (stampede.model.placement): adjacent losses,
ring and buddy placement, k peers; which positions lose every replica (exact sets), who
sends what through its own NIC, and the same answer as the run's own roles
(stampede.run.roles) on every small shape."""

from __future__ import annotations

import itertools

import pytest

from stampede.model.placement import Recovery, adjacent_loss, holders, recovery
from stampede.run.roles import plan_roles


def lost(working: int, per_node: int, count: int, placement: str, peers: int) -> Recovery:
    return recovery(working, per_node, adjacent_loss(working, count), placement, peers)


def test_holders_ring_and_buddy() -> None:
    assert holders(1, 4, "ring", 2) == (2, 3)
    assert holders(3, 4, "ring", 2) == (0, 1)     # wraps
    assert holders(2, 4, "buddy", 1) == (3,) and holders(3, 4, "buddy", 1) == (2,)
    assert holders(4, 5, "buddy", 1) == (0,)      # an odd last node pairs with node 0
    assert adjacent_loss(8, 3) == (5, 6, 7)


@pytest.mark.parametrize(("working", "per_node", "count", "placement", "peers", "stored",
                          "servers"), [
    # one lost node: its replica survives, on the next node (ring) or its buddy
    (3, 1, 1, "ring", 1, set(), {2: 0}),
    # two adjacent, one peer: node 1's only replica was on node 2
    (3, 1, 2, "ring", 1, {1}, {1: -1, 2: 0}),
    # two adjacent, two peers: node 0 holds a replica of both and serves both
    (3, 1, 2, "ring", 2, set(), {1: 0, 2: 0}),
    # three adjacent of eight, 2 ranks per node, one peer: nodes 5 and 6 lose everything
    (8, 2, 3, "ring", 1, {10, 11, 12, 13}, {5: -1, 6: -1, 7: 0}),
    # ... with two peers only node 5 does (holders 6, 7), node 0 serves 6 and 7
    (8, 2, 3, "ring", 2, {10, 11}, {5: -1, 6: 0, 7: 0}),
    # ... with three peers none does: node 0 serves all three
    (8, 2, 3, "ring", 3, set(), {5: 0, 6: 0, 7: 0}),
    # buddy: a lost pair loses both its shards
    (4, 1, 2, "buddy", 1, {2, 3}, {2: -1, 3: -1}),
    (4, 2, 3, "buddy", 1, {4, 5, 6, 7}, {1: 0, 2: -1, 3: -1}),
    # buddy on an odd count: nodes 1 and 2 both pair with node 0, which sends both
    (3, 1, 2, "buddy", 1, set(), {1: 0, 2: 0}),
])
def test_which_positions_lose_every_replica_and_who_sends(
        working: int, per_node: int, count: int, placement: str, peers: int, stored: set[int],
        servers: dict[int, int]) -> None:
    where = lost(working, per_node, count, placement, peers)
    assert where.positions_lost_everywhere() == stored
    assert dict(where.server) == servers


def test_the_busiest_nic_and_the_storage_bytes() -> None:
    size = 100.0
    one_peer = lost(3, 1, 2, "ring", 1)
    assert one_peer.nic_bytes(size) == 100 and one_peer.storage_bytes(size) == 100
    two_peers = lost(3, 1, 2, "ring", 2)   # node 0 sends two shards through its NIC
    assert two_peers.busiest_sender_nodes == 2 and two_peers.nic_bytes(size) == 200
    assert two_peers.storage_bytes(size) == 0
    wide = lost(8, 4, 3, "ring", 3)        # node 0: 3 nodes of 4 shards
    assert wide.nic_bytes(size) == 3 * 4 * 100
    single = lost(8, 4, 1, "ring", 1)      # the spare node's 4 shards
    assert single.nic_bytes(size) == 4 * 100 and single.busiest_sender_nodes == 1


SHAPES = [(working, per_node, count, placement, peers)
          for working, per_node, count in itertools.product((2, 3, 4, 5), (1, 2), (1, 2, 3))
          for placement, peers in (("ring", 1), ("ring", 2), ("ring", 3), ("buddy", 1))
          if count < working and peers < working]


@pytest.mark.parametrize(("working", "per_node", "count", "placement", "peers"), SHAPES)
def test_the_model_agrees_with_the_runs_roles(working: int, per_node: int, count: int,
                                              placement: str, peers: int) -> None:
    """The positions a run's spares read from storage, and the node that serves each other
    lost position, as stampede.run.roles decides them in `stampede rejoin`."""
    spare_nodes = count
    hosts = tuple(f"n{node}" for node in range(working + spare_nodes) for _ in range(per_node))
    roles = plan_roles(hosts, spare_nodes, count, peers, placement)
    where = lost(working, per_node, count, placement, peers)
    lost_positions = [p for p, rank in enumerate(roles.working) if rank in roles.lost]
    from_storage = {p for p in lost_positions if roles.server(p) < 0}
    assert where.positions_lost_everywhere() == from_storage
    servers = dict(where.server)
    for p in lost_positions:
        rank = roles.server(p)
        expected = roles.node_of[rank] if rank >= 0 else -1
        assert servers[p // per_node] == expected
