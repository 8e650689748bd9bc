"""The rejoin-or-restart model (stampede.model.rejoin) on numbers: the rates read from a
rejoin run's rows, the load terms at the target, the spare pool, a fall-back said."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from stampede.model.placement import adjacent_loss, recovery
from stampede.model.rejoin import rejoin_run, rejoin_verdict, spare_pool
from stampede.model.rejoin_fit import Rates, rejoin_load, restart_load_s
from stampede.model.workload import Workload
from stampede.results.archived import Archive
from stampede.results.cells import Row, typed

MIB = 2**20


def rows(run_id: str = "r1", storage: int = 0, lost: int = 1, size: int = 8 * MIB,
         peer_s: float = 0.1, rejoin_s: float = 0.2, restart_s: float = 0.5,
         spare_start_s: float | None = None) -> list[Row]:
    """A rejoin run as archived and read back (typed): 4 ranks restored (2 per node), 8 MiB
    each, 2 iterations; the spares received 2 x 8 MiB per iteration from peers in 0.1 s;
    a 1 MiB block read from the local tier in 1 ms."""
    common = {"run_id": run_id, "valid": "true", "bytes_per_rank": str(size), "nranks": "4",
              "ranks_per_node": "2", "lost_nodes": str(lost), "iterations": "2",
              "tier_peers": "1", "tier_placement": "ring", "job": "tiers", "block_bytes": str(MIB)}
    fell = "rank 5: position 3's replica missing on its peer on rank 1: read from storage" \
        if storage else ""
    written = [
        {**common, "op": "peer", "layout": "rejoin", "op_bytes": str(2 * 2 * size),
         "elapsed_s": str(peer_s)},
        {**common, "op": "read", "layout": "rejoin", "lat_p50_s": "0.001"},
        {**common, "op": "restore", "layout": "rejoin", "time_to_last_rank_s": str(rejoin_s),
         "first_done_s": "0.008", "tier_local_bytes": str(2 * size),
         "tier_peer_bytes": str(2 * size - storage), "tier_storage_bytes": str(storage),
         "notes": " | ".join(filter(None, ["tier by rank: 0@a local", fell]))},
        {**common, "op": "restore", "layout": "restart", "time_to_last_rank_s": str(restart_s),
         "first_done_s": "0.4", "tier_storage_bytes": str(4 * size)}]
    if spare_start_s is not None:   # with a singleton's barrier: no job's T_barrier_sync
        written += [{**common, "op": op, "layout": "spare-start", "phase": "startup",
                     "time_to_last_rank_s": str(spare_start_s), "lat_p50_s": "1e-06",
                     "nranks": "1"} for op in ("startup", "barrier")]
    return [typed(row) for row in written]


def test_the_rates_come_from_the_op_that_measures_each() -> None:
    """One shard size: B_node from the peer op (the spare node's k S), B_storage from the
    restart, B_local from the rejoin's reads (once a survivor's first done: a spare's
    peer transfer, mislabelled); no fixed term (said)."""
    run = rejoin_run(Archive(rows()))
    assert run is not None and run.run_id == "r1"
    assert run.rates.node_bps == pytest.approx(2 * 8 * MIB / 0.1)      # k S into the spare
    assert run.rates.storage_bps == pytest.approx(4 * 8 * MIB / 0.5)
    assert run.rates.local_bps == pytest.approx(MIB / 0.001)
    assert run.rates.rejoin_fixed_s == 0 and "one shard size" in run.rates.said("F_rejoin")
    assert run.tier_bytes["rejoin"] == {"local": 16 * MIB, "peer": 16 * MIB, "storage": 0}
    assert run.fallback == ()
    assert math.isnan(run.spare_start_s)


def test_the_fixed_terms_and_the_rates_are_fitted_from_two_sizes() -> None:
    """time = fixed + bytes / B, exactly, from runs at 8 and 16 MiB of one config (a run
    of another config is not a point): B_node from the peer op's slope, F_rejoin what the
    rejoin takes beyond its transfer, B_storage and F_restart from the restart's line."""
    node_bps, storage_bps = 400e6, 100e6
    def timed(run_id: str, size: int, **changed: str) -> list[Row]:
        spare = 2 * size   # k S into the spare node
        made = rows(run_id, size=size, peer_s=0.03 + spare / node_bps,
                    rejoin_s=0.05 + spare / node_bps, restart_s=0.01 + 4 * size / storage_bps)
        return [typed({**row, **changed}) for row in made]
    other = timed("r0", 2 * MIB, lost_nodes=2)   # another config: never a point
    run = rejoin_run(Archive(other + timed("r1", 8 * MIB) + timed("r2", 16 * MIB)))
    assert run is not None and run.run_id == "r2"
    assert [point.run_id for point in run.points] == ["r1", "r2"]
    rates = run.rates
    assert rates.node_bps == pytest.approx(node_bps)
    assert rates.rejoin_fixed_s == pytest.approx(0.05)
    assert rates.storage_bps == pytest.approx(storage_bps)
    assert rates.restart_fixed_s == pytest.approx(0.01)
    # out of sample: 32 MiB predicted from the line, where bytes / time at 16 MiB was off
    where = recovery(2, 2, adjacent_loss(2, 1), "ring", 1)
    seconds, name = rejoin_load(where, 32 * MIB, rates)
    assert seconds == pytest.approx(0.05 + 2 * 32 * MIB / node_bps)
    assert name == "F_rejoin + a spare node's NIC: k S / B_node"
    single = rejoin_run(Archive(timed("r2", 16 * MIB))).rates   # type: ignore[union-attr]
    assert single.node_bps < node_bps   # its overhead inside the rate


def test_the_load_terms_with_correlated_losses() -> None:
    rates = Rates(node_bps=1e9, storage_bps=100e9, local_bps=10e9, rejoin_fixed_s=0.05,
                  restart_fixed_s=0.2)
    size = 1e9
    # restart: 16,384 x 1 GB through 100 GB/s = 163.84 s (a node's 8 GB through its NIC: 8 s)
    assert restart_load_s(16384, 8, size, rates) == pytest.approx(0.2 + 163.84)
    assert restart_load_s(8, 8, size, Rates(1e7, 100e9, 10e9)) == pytest.approx(800)
    assert restart_load_s(4, 2, size, Rates(math.nan, 1e9, 1e9)) == pytest.approx(4)
    one = recovery(2048, 8, adjacent_loss(2048, 1), "ring", 1)
    assert rejoin_load(one, size, rates) == (pytest.approx(0.05 + 8), "F_rejoin + a spare "
                                             "node's NIC: k S / B_node")
    # two adjacent nodes, one peer: one lost node's 8 shards from storage (8 GB / 100 GB/s),
    # the other's through a spare node's NIC: the NIC still the slower
    two = recovery(2048, 8, adjacent_loss(2048, 2), "ring", 1)
    assert rejoin_load(two, size, rates)[0] == pytest.approx(0.05 + 8)
    slow_storage = Rates(1e9, 0.5e9, 10e9)
    seconds, name = rejoin_load(two, size, slow_storage)
    assert seconds == pytest.approx(8e9 / 0.5e9) and name.startswith("F_rejoin + storage fall-back")
    # two peers: node 0 sends both lost nodes' 16 shards through its own NIC
    both = recovery(2048, 8, adjacent_loss(2048, 2), "ring", 2)
    seconds, name = rejoin_load(both, size, rates)
    assert seconds == pytest.approx(0.05 + 16) and "2 lost nodes' shards" in name
    local_bound = recovery(2048, 1, adjacent_loss(2048, 1), "ring", 1)
    assert rejoin_load(local_bound, size, Rates(1e12, 1e9, 1e9))[0] == pytest.approx(1)
    seconds, name = rejoin_load(one, size, Rates(math.nan, 1e9, 1e9))
    assert math.isnan(seconds) and name.startswith("not priced")


def test_the_spare_pool_is_a_share_of_the_nodes_and_never_empty() -> None:
    assert spare_pool(2048) == 41              # 2% of 2,048 nodes
    assert spare_pool(2048, 0.05) == 102
    assert spare_pool(10) == 1


def archived(*runs: list[dict[str, str]], startup_s: float | None = None) -> Archive:
    """The runs' rows as an archive in memory, with a `stampede startup` run after them
    when given."""
    written = [{**row, "schema": "5", "phase": row.get("phase") or "restore", "tool": "stampede",
                "job": "tiers", "cache": "cold"} for run in runs for row in run]
    if startup_s is not None:
        written.append({"schema": "5", "run_id": "s1", "phase": "startup", "tool": "stampede",
                        "job": "startup", "layout": "-", "op": "startup", "valid": "true",
                        "nranks": "4", "time_to_last_rank_s": str(startup_s)})
    return Archive(written)


@pytest.mark.parametrize(("startup_s", "spare_s"),
                         [(None, None), (2.5, None), (2.5, 0.7), (None, 0.7)])
def test_t_mttr_both_ways_at_the_target_with_the_spares_start_up_measured_or_assumed(
        startup_s: float | None, spare_s: float | None) -> None:
    """The rejoin's T_pod_init is the spares' own start-up when the run measured it (its
    layout spare-start), never taken for the restart's (the whole job starts again)."""
    archive = archived(rows(spare_start_s=spare_s), startup_s=startup_s)
    workload = Workload(16384, ranks_per_node=8, bytes_per_rank=1e9)
    verdict = rejoin_verdict(archive, workload)
    assert verdict is not None and verdict.spares == 41 and verdict.lost_nodes == 1
    rejoin, restart = verdict.at_target
    assert rejoin.model is not None and restart.model is not None
    node_bps, storage_bps = 2 * 8 * MIB / 0.1, 4 * 8 * MIB / 0.5
    terms = {term.name: term for term in rejoin.model.terms}
    load = terms["F_rejoin + a spare node's NIC: k S / B_node"]
    assert load.seconds == pytest.approx(8 * 1e9 / node_bps)
    assert rejoin.load.startswith("F_rejoin + a spare node's NIC")
    restart_terms = {term.name: term for term in restart.model.terms}
    assert restart_terms["F_restart + N S / B_storage"].seconds == \
        pytest.approx(16384 * 1e9 / storage_bps)
    expected = spare_s if spare_s is not None else startup_s if startup_s is not None else 5.0
    assert terms["T_pod_init"].seconds == expected
    assert terms["T_pod_init"].measured == (expected != 5.0)
    assert ("spare-start" in terms["T_pod_init"].source) == (spare_s is not None)
    assert restart_terms["T_pod_init"].seconds == (startup_s if startup_s is not None else 5.0)
    assert "startup barriers at" not in terms["T_barrier_sync"].source
    assert restart.dominant == "F_restart + N S / B_storage"   # 16 TB through 0.5 GB/s
    alone = rejoin_verdict(archive, workload, lost_nodes=42)   # > the pool
    assert alone is not None and alone.at_target[0].model is None
    assert "42 lost node(s) and 41 spare(s)" in alone.at_target[0].why_not


def test_every_term_of_the_verdict_comes_from_the_run_it_chose() -> None:
    """Two rejoin runs; the later one's restart failed: the verdict is the earlier run's,
    and so is every measured term (its rejoin restore's rate once came from the later run:
    "the latest rejoin row" beside "the latest run with both")."""
    def measured(run_id: str, gbps: str) -> list[dict[str, str]]:
        return [{**row, "slowest_rank_gbps": gbps} for row in rows(run_id)]

    later = measured("r2", "9.0")
    later[-1]["valid"] = "false"
    verdict = rejoin_verdict(archived(measured("r1", "1.0"), later), Workload(16384))
    assert verdict is not None and verdict.run.run_id == "r1"
    for side in (*verdict.measured, *verdict.at_target):
        assert side.model is not None
        sources = " ".join(term.source for term in side.model.terms)
        assert " run r2" not in sources and "run r1" in sources, sources


@pytest.mark.parametrize(("flags", "nodes", "pool"), [((), "16,384", 328),
                                                    (("--target-ranks", "1024"), "1,024", 20)])
def test_mttr_of_a_rejoin_prices_one_target_in_both_spare_tables(
        stampede: Any, tmp_path: Path, flags: tuple[str, ...], nodes: str, pool: int) -> None:
    """The hot spares and the rejoin's pool are of the same nodes (the table once said
    "Hot spares: 0 nodes" above "a pool of 20 spare node(s)" at --target-ranks)."""
    from tests.present.test_golden import unpack

    unpack(tmp_path)
    result = stampede("mttr", str(tmp_path / "rejoin.csv"), *flags)
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert f"Hot spares: {nodes} nodes" in said and f"a pool of {pool} spare node(s)" in said
    assert f"2% {pool} " in said, said   # the hot spares' 2% row: the rejoin's pool
    # one T_MTTR per way back, from one run: no breakdown of the run's restart beside them
    # (it once printed 2.22 min from the worked example's bytes, then rejoin and restart)
    assert "T_MTTR = T_detect" not in said and said.count("one T_MTTR each") == 1
    totals = [line.split() for line in result.stdout.splitlines()
              if line.split()[:2] in (["T_MTTR", "at"], ["T_MTTR", "as"])]
    assert [line[:3] for line in totals] == [["T_MTTR", "at", nodes.replace(",", "")],
                                             ["T_MTTR", "as", "measured"]], totals
    assert all(len([cell for cell in line if cell in ("s", "min") or cell[-1:] == "s"]) >= 2
               for line in totals)   # a value for each way, on each line
    assert re.search(r"GPU-hours lost per failure at [\d,]+ GPUs: rejoin [\d.]+; restart "
                     r"[\d.]+", said), said


def test_lost_nodes_above_the_target_are_refused_before_a_sidecar_is_read(tmp_path: Path
                                                                            ) -> None:
    """Bad input before any I/O: the refusal comes before the runs behind the terms are
    chosen (choosing reads the chosen restore's sidecar)."""
    from stampede.errors import UsageError

    measured = [{**row, "slowest_rank_gbps": "1.0", "phase": "restore"} for row in rows()]
    archive = Archive(measured, (tmp_path / "rejoin.csv",))   # its sidecars would be on disk
    with pytest.raises(UsageError, match="--lost-nodes 9: the target's 8 node"):
        rejoin_verdict(archive, Workload(16, ranks_per_node=2), lost_nodes=9)
    assert archive._sidecars == {}
    assert rejoin_verdict(archive, Workload(16, ranks_per_node=2)) is not None
    assert set(archive._sidecars) == {"r1"}   # read once the verdict is computed


def test_mttr_of_a_rejoin_says_whose_t_mttr_prices_the_checkpoint_interval(
        stampede: Any, tmp_path: Path) -> None:
    """Young/Daly's failures are priced with one way back's T_MTTR: the rejoin's where it is
    possible. The output names it (it once printed the formula with a bare T_MTTR under
    two of them)."""
    from tests.present.test_golden import unpack

    unpack(tmp_path)
    result = stampede("mttr", str(tmp_path / "rejoin.csv"), "--mtbf-h", "5",
                      "--checkpoint-cost-s", "20")
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "failures = GPUs x 24/MTBF_h x (T_MTTR + tau/2), T_MTTR the rejoin's" in said, said
