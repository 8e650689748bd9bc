"""The rejoin-or-restart model (stampede.model.rejoin) on numbers: the rates read from a
rejoin run's rows, the load terms at the target, the spare pool, a fall-back said."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from stampede.model.rejoin import (
    Rates,
    rejoin_load_s,
    rejoin_run,
    rejoin_verdict,
    restart_load_s,
    spare_pool,
)
from stampede.model.workload import Workload
from stampede.results.archived import Archive
from stampede.results.cells import Row, typed

MIB = 2**20


def rows(run_id: str = "r1", storage: int = 0, lost: int = 1) -> list[Row]:
    """A rejoin run as archived and read back (typed): 4 ranks restored (2 per node), 8 MiB
    each, 2 iterations; the spares received 2 x 8 MiB per iteration from peers in 0.1 s."""
    common = {"run_id": run_id, "valid": "true", "bytes_per_rank": str(8 * MIB), "nranks": "4",
              "ranks_per_node": "2", "lost_nodes": str(lost), "iterations": "2"}
    fell = "rank 5: position 3's replica missing on its peer on rank 1: read from storage" \
        if storage else ""
    return [typed(row) for row in (
        {**common, "op": "peer", "layout": "rejoin", "op_bytes": str(2 * 2 * 8 * MIB),
         "elapsed_s": "0.1"},
        {**common, "op": "restore", "layout": "rejoin", "time_to_last_rank_s": "0.2",
         "first_done_s": "0.008", "tier_local_bytes": str(2 * 8 * MIB),
         "tier_peer_bytes": str(2 * 8 * MIB - storage), "tier_storage_bytes": str(storage),
         "notes": " | ".join(filter(None, ["tier by rank: 0@a local", fell]))},
        {**common, "op": "restore", "layout": "restart", "time_to_last_rank_s": "0.5",
         "first_done_s": "0.4", "tier_storage_bytes": str(4 * 8 * MIB)},
    )]


def test_the_rates_come_from_the_peer_transfer_the_restart_and_the_first_survivor() -> None:
    run = rejoin_run(Archive(rows()))
    assert run is not None and run.run_id == "r1"
    assert run.rates.node_bps == pytest.approx(2 * 8 * MIB / 0.1)      # one spare node
    assert run.rates.storage_bps == pytest.approx(4 * 8 * MIB / 0.5)
    assert run.rates.local_bps == pytest.approx(8 * MIB / 0.008)
    assert run.tier_bytes["rejoin"] == {"local": 16 * MIB, "peer": 16 * MIB, "storage": 0}
    assert run.fallback == ()
    two_lost = rejoin_run(Archive(rows(lost=2)))   # two spare nodes share the bytes received
    assert two_lost is not None and two_lost.rates.node_bps == pytest.approx(8 * MIB / 0.1)


def test_a_fall_back_to_storage_is_said_and_the_latest_valid_run_is_taken() -> None:
    read = rows("r1") + rows("r2", storage=8 * MIB)
    run = rejoin_run(Archive(read))
    assert run is not None and run.run_id == "r2"
    assert run.fallback == ("rank 5: position 3's replica missing on its peer on rank 1: "
                            "read from storage",)
    read[-1]["valid"] = False          # r2's restart failed: r1 is the latest whole run
    latest = rejoin_run(Archive(read))
    assert latest is not None and latest.run_id == "r1"
    assert rejoin_run(Archive([row for row in rows() if row["layout"] != "restart"])) is None


def test_the_load_terms_at_the_target() -> None:
    rates = Rates(node_bps=1e9, storage_bps=100e9, local_bps=10e9)
    size = 1e9
    # restart: 16,384 x 1 GB through 100 GB/s = 163.84 s (a node's 8 GB through its NIC: 8 s)
    assert restart_load_s(16384, 8, size, rates) == pytest.approx(163.84)
    # ... unless the NIC is slower than the storage's share: 8 GB at 0.01 GB/s
    assert restart_load_s(8, 8, size, Rates(1e7, 100e9, 10e9)) == pytest.approx(800)
    # rejoin: a spare node's 8 shards through its NIC (8 s), the survivors' 0.1 s beside it
    assert rejoin_load_s(8, size, rates) == pytest.approx(8)
    assert rejoin_load_s(1, size, Rates(1e12, 1e9, 1e9)) == pytest.approx(1)   # local-bound
    assert math.isnan(rejoin_load_s(8, size, Rates(math.nan, 1e9, 1e9)))
    assert restart_load_s(4, 2, size, Rates(math.nan, 1e9, 1e9)) == pytest.approx(4)


def test_the_spare_pool_is_a_share_of_the_nodes_and_never_empty() -> None:
    assert spare_pool(2048) == 41              # 2% of 2,048 nodes
    assert spare_pool(2048, 0.05) == 102
    assert spare_pool(10) == 1


def archived(*runs: list[dict[str, str]], startup_s: float | None = None) -> Archive:
    """The runs' rows as an archive in memory, with a `stampede startup` run after them
    when given."""
    written = [{**row, "schema": "5", "phase": "restore", "tool": "stampede", "job": "tiers",
                "cache": "cold"} for run in runs for row in run]
    if startup_s is not None:
        written.append({"schema": "5", "run_id": "s1", "phase": "startup", "tool": "stampede",
                        "job": "startup", "layout": "-", "op": "startup", "valid": "true",
                        "nranks": "4", "time_to_last_rank_s": str(startup_s)})
    return Archive(written)


@pytest.mark.parametrize("startup_s", [None, 2.5])
def test_t_mttr_both_ways_at_the_target_with_the_spares_start_up_measured_or_assumed(
        startup_s: float | None) -> None:
    archive = archived(rows(), startup_s=startup_s)
    workload = Workload(16384, ranks_per_node=8, bytes_per_rank=1e9)
    verdict = rejoin_verdict(archive, workload)
    assert verdict is not None and verdict.spares == 41 and verdict.lost_nodes == 1
    rejoin, restart = verdict.at_target
    assert rejoin.model is not None and restart.model is not None
    node_bps, storage_bps = 2 * 8 * MIB / 0.1, 4 * 8 * MIB / 0.5
    terms = {term.name: term for term in rejoin.model.terms}
    assert terms["peer transfer k S / B_node"].seconds == pytest.approx(8 * 1e9 / node_bps)
    load = {term.name: term for term in restart.model.terms}["S_weights / BW_rank_io"]
    assert load.seconds == pytest.approx(16384 * 1e9 / storage_bps)
    assert terms["T_pod_init"].seconds == (startup_s if startup_s is not None else 5.0)
    assert terms["T_pod_init"].measured == (startup_s is not None)
    assert restart.dominant == "S_weights / BW_rank_io"   # 16 TB through 0.5 GB/s
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


def test_lost_nodes_above_the_target_are_refused_before_a_sidecar_is_read(tmp_path: Path
                                                                            ) -> None:
    """Bad input before any I/O: the refusal comes before the runs behind the terms are
    chosen (choosing reads the chosen restore's sidecar)."""
    from stampede.errors import UsageError

    measured = [{**row, "slowest_rank_gbps": "1.0", "phase": "restore"} for row in rows()]
    archive = Archive(measured, (tmp_path / "rejoin.csv",))   # its sidecars would be on disk
    with pytest.raises(UsageError, match="--lost-nodes 9: more than the target's 8 node"):
        rejoin_verdict(archive, Workload(16, ranks_per_node=2), lost_nodes=9)
    assert archive._sidecars == {}
    assert rejoin_verdict(archive, Workload(16, ranks_per_node=2)) is not None
    assert set(archive._sidecars) == {"r1"}   # read once the verdict is computed
