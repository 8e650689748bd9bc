"""Where a layout's bytes go across nodes (stampede.model.traffic), the data term it gives,
and the fit of B_agg, B_node and B_client from runs on several nodes."""

from __future__ import annotations

import math

import pytest

from stampede.model.contention import Params, predict
from stampede.model.traffic import (
    Geometry,
    Traffic,
    bcast_rounds,
    data_seconds,
    fit_rates,
    traffic,
)

MB = 1e6


def test_the_table_at_four_nodes_of_two() -> None:
    # 8 ranks, 4 replicas of 2 shards: node i holds ranks 2i, 2i + 1 (shards 0 and 1)
    geometry = Geometry(nranks=8, ranks_per_node=2, replicas=4)
    assert geometry.nnodes == 4 and geometry.shards == 2
    assert traffic("sharded", geometry) == Traffic(storage=8, node=2, rank=1, exchange=0)
    # one reader per shard (ranks 0 and 1, both on node 0), then a binomial tree over the 4
    # nodes of each group: 2 rounds, node 0 sending both shards in each
    assert traffic("broadcast", geometry) == Traffic(storage=2, node=2, rank=1, exchange=4)
    by_node = Geometry(8, 2, 4, broadcast_group="node")
    assert traffic("broadcast", by_node) == Traffic(storage=8, node=2, rank=1, exchange=0)
    # a quarter each, then every rank takes 3/4 of its shard from a neighbour elsewhere
    assert traffic("striped", geometry) == Traffic(storage=2, node=0.5, rank=0.25, exchange=1.5)
    # all on one node: the node is the storage for every reader
    assert traffic("sharded", Geometry(8)) == Traffic(storage=8, node=8, rank=1, exchange=0)
    assert traffic("broadcast", Geometry(8, replicas=4)).exchange == 0   # shared memory


def test_whole_file_carries_every_shard_to_every_rank() -> None:
    # 4 ranks on 2 nodes of 2, one replica: each rank reads the 4 shards, each node 8
    geometry = Geometry(nranks=4, ranks_per_node=2)
    assert traffic("whole-file", geometry) == Traffic(storage=16, node=8, rank=4, exchange=0)
    assert traffic("shared", geometry) == Traffic(storage=4, node=2, rank=1, exchange=0)
    # with replicas the file holds S = N / R shards: what each rank reads
    assert traffic("whole-file", Geometry(8, 2, replicas=4)).rank == 2


def test_broadcast_rounds_follow_mpichs_algorithms() -> None:
    assert [bcast_rounds(g) for g in (1, 2, 3, 4, 5, 7)] == [0, 1, 2, 2, 3, 3]
    assert bcast_rounds(8) == pytest.approx(2 * 7 / 8)      # scatter + ring allgather


def test_the_trade_off_the_model_makes() -> None:
    """Broadcast ahead of sharded when the storage is the bottleneck (B_s << n B_n), behind
    when the NICs are; striped never behind sharded."""
    def at(layout: str, storage_bps: float, node_bps: float, nodes: int = 4) -> float:
        params = Params(rtt_s=0, service_s=0, threads=1, agg_bps=storage_bps, node_bps=node_bps,
                        ops_per_rank=0, bytes_per_rank=4 * MB, ranks_per_node=2, replicas=nodes)
        return predict(params, 2 * nodes, layout).total_s

    assert at("broadcast", 20 * MB, 50 * MB) < at("sharded", 20 * MB, 50 * MB)
    assert at("broadcast", 80 * MB, 10 * MB) > at("sharded", 80 * MB, 10 * MB)
    for storage, node in ((20 * MB, 50 * MB), (80 * MB, 10 * MB)):
        assert at("striped", storage, node) <= at("sharded", storage, node) * (1 + 1e-9)
    read, exchange, limit = data_seconds(traffic("sharded", Geometry(8, 2, 4)), 4 * MB, 80 * MB,
                                         10 * MB, math.inf)
    assert (limit, exchange) == ("B_node", 0.0) and read == pytest.approx(2 * 4 * MB / (10 * MB))


def _points(layout: str, agg: float, node: float, client: float) -> tuple[list, list, list]:
    coefficients, exchange, y = [], [], []
    for nodes in (1, 2, 3, 4):
        flow = traffic(layout, Geometry(2 * nodes, 2, max(nodes, 2)))
        read, moved, _ = data_seconds(flow, 1.0, agg, node, client)
        coefficients.append((flow.storage, flow.node, flow.rank))
        exchange.append(flow.exchange)
        y.append(read + moved)
    return coefficients, exchange, y


@pytest.mark.parametrize("layout", ["broadcast", "striped"])
def test_the_fit_recovers_the_storage_and_the_nics(layout: str) -> None:
    rates = fit_rates(*_points(layout, 20 * MB, 50 * MB, 1e9))
    assert 1 / rates.agg_s_per_byte == pytest.approx(20 * MB, rel=1e-6)
    assert 1 / rates.node_s_per_byte == pytest.approx(50 * MB, rel=1e-6)
    assert "B_agg" not in rates.bound and "B_node" not in rates.bound
    assert "B_client" in rates.bound                  # never the limit: a bound only


def test_a_limit_no_run_reached_is_the_most_pessimistic_bound() -> None:
    """NIC-bound sharded runs: the storage never limited them, so B_agg is put where it
    would start to limit the largest run (4 nodes: 8 readers x b / B_agg = 2 b / B_node)."""
    rates = fit_rates(*_points("sharded", 1e12, 10 * MB, 1e9))
    assert 1 / rates.node_s_per_byte == pytest.approx(10 * MB, rel=1e-6)
    assert "B_agg" in rates.bound
    assert 1 / rates.agg_s_per_byte == pytest.approx(8 / 2 * 10 * MB, rel=1e-6)


def test_every_layouts_bytes_at_the_target_beside_what_the_job_needs() -> None:
    from stampede.model.traffic import layout_bytes

    # 16,384 ranks of 1 MiB each on 2,048 nodes of 8, one replica
    found = {item.layout: item for item in layout_bytes(Geometry(16384, 8), MB)}
    assert "broadcast" not in found and "mlperf" not in found   # one replica; own files
    assert found["sharded"].amplification == 1.0
    whole = found["whole-file"]
    assert whole.needed_bytes == 16384 * MB and whole.amplification == 16384
    assert whole.node_bytes == 8 * 16384 * MB and whole.reader_bytes == 16384 * MB
    # 4 replicas: the replicas read each shard 4 times, one reader per group once
    replicated = {item.layout: item for item in layout_bytes(Geometry(16, 4, replicas=4), MB)}
    assert replicated["replicated"].amplification == 4.0
    assert replicated["broadcast"].amplification == replicated["striped"].amplification == 1.0
    assert replicated["whole-file"].amplification == 16.0


def test_node_once_reads_the_file_once_per_node_and_owners_once_in_all() -> None:
    from stampede.model.traffic import layout_bytes

    # 4 ranks on 2 nodes of 2: each node's reader reads the 4 shards; nothing between nodes
    geometry = Geometry(nranks=4, ranks_per_node=2)
    assert traffic("node-once", geometry) == Traffic(storage=8, node=4, rank=4, exchange=0)
    assert traffic("owners", geometry) == Traffic(storage=4, node=2, rank=1, exchange=0)
    # with replicas, owners reads each of the S shards once, then broadcasts as broadcast does
    replicas = Geometry(8, 2, replicas=4)
    assert traffic("owners", replicas) == traffic("broadcast", replicas)
    assert traffic("node-once", replicas) == Traffic(storage=8, node=2, rank=2, exchange=0)
    # at 16,384 ranks on 2,048 nodes of 8: node-once 2,048x (once per node), owners 1.0x
    found = {item.layout: item for item in layout_bytes(Geometry(16384, 8), MB)}
    assert found["node-once"].amplification == 2048 and found["owners"].amplification == 1.0
    assert found["node-once"].node_bytes == 16384 * MB == found["node-once"].reader_bytes
    # a last node with fewer ranks reads the whole file too
    assert traffic("node-once", Geometry(5, 2)).storage == 3 * 5
