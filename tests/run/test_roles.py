"""Who does what in a rejoin (stampede.run.roles): placement of the replicas by node (ring,
buddy; never on the saver's node), the lost nodes and the spares standing in, and the
placements that cannot be made refused with the reason."""

from __future__ import annotations

import pytest

from stampede.errors import UsageError
from stampede.run.roles import plan_roles

# 4 nodes x 2 ranks: nodes a, b, c working, d spare
HOSTS = ("a", "a", "b", "b", "c", "c", "d", "d")


def test_ring_places_replicas_on_the_next_nodes_and_spares_take_the_lost_places() -> None:
    roles = plan_roles(HOSTS, spare_nodes=1, lost_nodes=1, peers=1, placement="ring")
    assert roles.nodes == ("a", "b", "c", "d")
    assert roles.working == (0, 1, 2, 3, 4, 5) and roles.spares == (6, 7)
    assert roles.holders == ((2,), (3,), (4,), (5,), (0,), (1,))   # a->b, b->c, c->a
    assert roles.lost == {4, 5}                                    # node c, the last working
    assert roles.restorer == (0, 1, 2, 3, 6, 7)
    assert roles.active == (0, 1, 2, 3, 6, 7)
    assert [roles.server(p) for p in (4, 5)] == [0, 1]             # their replicas on node a
    assert roles.served_by(0) == [4] and roles.served_by(2) == []
    assert roles.held_by(0) == [4] and roles.held_by(2) == [0]      # replicas it keeps
    assert roles.position_of(6, after_loss=True) == 4 and roles.position_of(6, after_loss=False) == -1
    for position, holders in enumerate(roles.holders):             # never on its own node
        saver = roles.working[position]
        assert all(roles.node_of[h] != roles.node_of[saver] for h in holders)


def test_two_peers_and_buddies() -> None:
    ring = plan_roles(HOSTS, spare_nodes=1, lost_nodes=1, peers=2, placement="ring")
    assert ring.holders[0] == (2, 4) and ring.holders[4] == (0, 2)
    buddy = plan_roles(("a", "b", "c", "d", "e"), spare_nodes=1, lost_nodes=1, peers=1,
                       placement="buddy")
    assert buddy.holders == ((1,), (0,), (3,), (2,))             # a-b, c-d
    assert buddy.lost == {3} and buddy.server(3) == 2 and buddy.restorer == (0, 1, 2, 4)


def test_a_lost_replica_holder_leaves_the_spare_to_storage() -> None:
    """Two lost nodes of three working, one peer: c's replica is on a (survives), b's on c
    (lost with it): b's spare has no peer to ask."""
    roles = plan_roles(("a", "b", "c", "d", "e"), spare_nodes=2, lost_nodes=2, peers=1,
                       placement="ring")
    assert roles.lost == {1, 2}
    assert roles.server(1) == -1 and roles.server(2) == 0
    assert roles.restorer == (0, 3, 4)


@pytest.mark.parametrize(("hosts", "spare", "lost", "peers", "placement", "said"), [
    (("a", "b"), 1, 1, 1, "ring", "needs at least 2"),
    (("a", "b", "c"), 1, 1, 2, "ring", "tiers.peers = 2"),
    (("a", "b", "c", "d"), 1, 1, 2, "buddy", "buddy keeps one replica"),
    (("a", "b", "b", "c"), 1, 1, 1, "ring", "every lost rank needs a spare"),
])
def test_placements_that_cannot_be_made_are_refused(hosts: tuple[str, ...], spare: int,
                                                    lost: int, peers: int, placement: str,
                                                    said: str) -> None:
    with pytest.raises(UsageError, match=said):
        plan_roles(hosts, spare, lost, peers, placement)


def test_too_many_peers_says_how_many_fit() -> None:
    """The count it refuses, the working nodes there are, and the most peers they allow
    (it once said "tiers.peers = 2: ... there are 2", which reads as a contradiction)."""
    with pytest.raises(UsageError) as refused:
        plan_roles(("a", "b", "c"), spare_nodes=1, lost_nodes=1, peers=2, placement="ring")
    assert refused.value.message == (
        "tiers.peers = 2: each replica goes to a working node other than its saver's, and "
        "3 node(s) of which 1 spare leave 2 working: at most 1 peer(s)")
    assert refused.value.hint == "tiers.peers = 1, or more nodes"
