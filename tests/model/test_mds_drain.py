"""The MDS fitted from its own counters (stampede.model.mds_drain), on the counts of real
runs against the tests' single-node Ceph (tests/data/cephfs/mds-requests-quickstart.json,
its provenance inside): requests per rank and per job per op, the drain at 16,384 ranks,
what one restore and one save are in the counts, and the Archive's sidecars picked."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from stampede.model.fit import Point
from stampede.model.mds_drain import (
    Growth,
    MdsCount,
    OpCount,
    counted,
    counts_of,
    fit_growth,
    mds_drain,
    per_pass,
)
from stampede.model.series import Series
from stampede.results.archived import Archive

CAPTURED = Path(__file__).resolve().parents[1] / "data" / "cephfs" / "mds-requests-quickstart.json"
TARGET = 16_384


def captured(group: str, layout: str) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = json.loads(CAPTURED.read_text())[group]
    return [run for run in runs if run["layout"] == layout]


def records(group: str, layout: str) -> list[MdsCount]:
    found = []
    for run in captured(group, layout):
        count = counted(run["mds_requests"], int(run["nranks"]), int(run["nnodes"]),
                        int(run["iterations"]) + int(run["warmup"]), run["run_id"])
        assert count is not None
        found.append(count)
    return found


def test_the_capture_says_where_it_came_from() -> None:
    provenance = json.loads(CAPTURED.read_text())["provenance"]
    assert "Ceph 16.2" in provenance and "commit 2b93804" in provenance


@pytest.mark.parametrize(("layout", "per_rank", "first_ms", "last_ms"), [
    ("shared", 3, 0.109645, 0.305546), ("sharded", 2, 0.116421, 0.374278)])
def test_a_restore_asks_the_mds_a_few_lookups_per_rank_and_they_drain_in_series(
        layout: str, per_rank: int, first_ms: float, last_ms: float) -> None:
    """Each rank its own client (cephfs://): the MDS counted 3 (shared) or 2 (sharded)
    lookups per rank at 1, 2 and 4 ranks, nothing once per job; at 16,384 ranks that is
    per_rank x 16,384 requests, each at the MDS's mean at 1 rank, one after another."""
    drain = mds_drain(records("restore", layout), layout, "restore", TARGET, 4096, True)
    assert drain is not None
    [lookup] = drain.ops
    assert lookup.op == "lookup"
    assert lookup.growth.measured == ((1, per_rank), (2, 2 * per_rank), (4, 4 * per_rank))
    assert lookup.growth.per_rank == pytest.approx(per_rank)
    assert lookup.growth.fixed == pytest.approx(0, abs=1e-9)
    assert drain.requests == pytest.approx(per_rank * TARGET)
    assert (lookup.service_at, lookup.service_s) == (1, pytest.approx(first_ms / 1e3))
    assert drain.drain_s == pytest.approx(per_rank * TARGET * first_ms / 1e3)
    assert drain.band_s == (pytest.approx(per_rank * TARGET * first_ms / 1e3),
                            pytest.approx(per_rank * TARGET * last_ms / 1e3))
    assert drain.rate_per_s == pytest.approx(1e3 / first_ms)
    assert drain.caps_revoked.at(TARGET) == 0


def test_a_restore_counts_once_whatever_its_passes_a_save_per_pass() -> None:
    """The same restore at 2 ranks with 1, 4 and 6 passes: 6 lookups each time (a client
    holding the caps asks once), so the count is one restore's; a save's is divided."""
    counts = records("restore_passes", "shared")
    assert sorted(count.passes for count in counts) == [1, 4, 6]
    assert {per_pass(count, count.ops["lookup"].requests, "restore") for count in counts} == {6}
    assert sorted(per_pass(count, count.ops["lookup"].requests, "save")
                  for count in counts) == [1, 1.5, 6]


def test_a_sharded_save_creates_and_renames_a_file_per_rank_and_its_directories_once() -> None:
    """Per save (3 iterations + 1 warmup: 4 saves): creates and renames 21, 25, 33 at 1, 2,
    4 ranks, i.e. one per rank and 4.25 once per job (rank 0's journal, pointer and lock);
    mkdirs 60 whatever the ranks (the version's directories, made by the root): 15 per save."""
    drain = mds_drain(records("save", "sharded"), "sharded", "save", TARGET, 4096, True)
    assert drain is not None
    ops = {op.op: op for op in drain.ops}
    for name in ("create", "rename"):
        assert ops[name].growth.measured == ((1, 21 / 4), (2, 25 / 4), (4, 33 / 4))
        assert ops[name].growth.per_rank == pytest.approx(1)
        assert ops[name].growth.fixed == pytest.approx(4.25)
        assert ops[name].requests == pytest.approx(TARGET + 4.25)
    assert ops["mkdir"].growth.per_rank == pytest.approx(0, abs=1e-9)
    assert ops["mkdir"].requests == pytest.approx(15)
    assert ops["unlink"].growth.per_rank == pytest.approx(0.5)   # keep = 2: the oldest released
    assert drain.drain_s == pytest.approx(sum(op.requests * op.service_s for op in drain.ops))
    assert [op.requests for op in drain.ops] == sorted((op.requests for op in drain.ops),
                                                       reverse=True)


def test_a_shared_save_opens_the_one_file_once_per_other_writer() -> None:
    """One shared file: created once per save, opened by each other rank (0, 4, 12 opens in
    4 saves at 1, 2, 4 ranks: N - 1 per save), so the fit has a negative part per job."""
    drain = mds_drain(records("save", "shared"), "shared", "save", TARGET, 4096, True)
    assert drain is not None
    ops = {op.op: op for op in drain.ops}
    assert ops["open"].growth.measured == ((1, 0), (2, 1), (4, 3))
    assert (ops["open"].growth.per_rank, ops["open"].growth.fixed) == (pytest.approx(1),
                                                                       pytest.approx(-1))
    assert ops["open"].requests == pytest.approx(TARGET - 1)
    assert ops["open"].service_at == 2   # its least mean (0.17 ms; 0.34 ms at 4 ranks)
    # getattr's mean was 7.0 ms at 2 ranks (waiting on a capability recalled from the other
    # writer), 0.30 ms at 4: the service is the least, the wait is the band's other end
    assert (ops["getattr"].service_s, ops["getattr"].service_at) == (
        pytest.approx(0.299212e-3), 4)
    assert ops["getattr"].service_range_s[1] == pytest.approx(7.015675e-3)
    assert ops["create"].requests == pytest.approx(21 / 4)
    assert drain.caps_revoked.measured == ((1, 41 / 4), (2, 79 / 4), (4, 127 / 4))


def test_ranks_sharing_a_mount_put_what_does_not_grow_on_every_node() -> None:
    """A ceph-fuse mount: the ranks of a node share one client, so the requests that do not
    grow with the ranks are the node's client's, asked once per node at the target."""
    points = [(1, 1, 3.0), (2, 1, 3.0), (4, 1, 3.0)]
    shared = fit_growth(points, client_per_rank=False)
    assert (shared.per_rank, shared.fixed) == (pytest.approx(0, abs=1e-9), pytest.approx(3))
    assert shared.at(TARGET, 2048) == pytest.approx(3 * 2048)
    own = fit_growth(points, client_per_rank=True)
    assert own.at(TARGET, 2048) == pytest.approx(3)


def test_a_fit_that_cannot_tell_per_rank_from_per_job_puts_it_all_per_rank() -> None:
    assert fit_growth([(2, 1, 6.0)], True) == Growth(3.0, 0.0, ((2, 6.0),), per_node=False)
    assert fit_growth([(1, 1, 5.0), (2, 1, 4.0), (4, 1, 3.0)], True).per_rank == 0.0
    assert fit_growth([(1, 1, 5.0), (2, 1, 4.0), (4, 1, 3.0)], True).fixed == pytest.approx(4)


@pytest.mark.parametrize("entry", [None, "not counted: the MDS did not answer (...)",
                                   {"requests": 3}, {"ops": "none"}])
def test_a_layout_the_mds_did_not_count_has_no_record(entry: object) -> None:
    assert counted(entry, 2, 1, 4) is None
    assert mds_drain([], "shared", "restore", TARGET, 1, True) is None


def test_a_count_that_cannot_be_is_refused() -> None:
    with pytest.raises(ValueError, match="-1 requests"):
        OpCount(-1, 0.001)
    with pytest.raises(ValueError, match="0 passes"):
        MdsCount(1, 1, 0, {})
    assert counted({"ops": {"lookup": {"requests": 0, "mean_ms": 0}}}, 1, 1, 1) == \
        MdsCount(1, 1, 1, {})


def archive_of(group: str) -> tuple[Archive, list[Series]]:
    """The captured runs as an in-memory Archive (their completion rows and sidecars) and
    the Series `project` would fit from them."""
    runs = json.loads(CAPTURED.read_text())[group]
    rows = [{key: run[key] for key in ("run_id", "layout", "nranks", "nnodes", "iterations",
                                       "warmup", "target")} | {"op": run["phase"],
                                                               "phase": run["phase"]}
            for run in runs]
    sidecars: dict[str, dict[str, Any]] = {}
    for run in runs:
        part = sidecars.setdefault(run["run_id"], {}).setdefault(
            "layouts" if run["phase"] == "restore" else "saves", {})
        part[run["layout"]] = {"mds_requests": run["mds_requests"]}
    series = [Series(layout, tuple(Point(int(run["nranks"]), 2, 0.0, 1.0, 1.0,
                                         run_id=run["run_id"])
                                   for run in runs if run["layout"] == layout),
                     "", True, (), runs[0]["phase"])
              for layout in ("shared", "sharded")]
    return Archive(rows, sidecars=sidecars), series


def test_project_picks_each_fitted_runs_count_from_its_sidecar() -> None:
    archive, series = archive_of("save")
    counts = counts_of(archive, series[1])
    assert [(count.nranks, count.passes, count.ops["create"].requests) for count in counts] == \
        [(1, 4, 21), (2, 4, 25), (4, 4, 33)]
    # a run without a sidecar, or whose sidecar has no MDS counts: left out, nothing said
    assert counts_of(Archive(archive.rows, sidecars={}), series[1]) == []


def test_the_drain_is_rendered_beside_the_latency_fit_with_the_counts_as_measured() -> None:
    from stampede.model.mds_drain import client_per_rank
    from stampede.present.report import make_console
    from stampede.present.report_mds import render_mds_drains

    archive, series = archive_of("restore")
    assert client_per_rank(archive, series[0])   # cephfs://: each rank its own client
    drains = [(drain, None) for drain in (
        mds_drain(counts_of(archive, item), item.layout, "restore", TARGET, 4096, True)
        for item in series) if drain is not None]
    out = io.StringIO()
    render_mds_drains(drains, make_console(file=out, width=140))
    text = out.getvalue()
    assert "from the MDS's counters" in text and "one at a time" in text
    assert "lookup  3 @1, 6 @2, 12 @4" in text and "lookup  2 @1, 4 @2, 8 @4" in text
    assert f"{3 * TARGET:,}" in text and f"{2 * TARGET:,}" in text
    silent = io.StringIO()
    render_mds_drains([], make_console(file=silent, width=140))
    assert silent.getvalue() == ""
    assert not math.isnan(drains[0][0].drain_s)


def test_counts_of_nothing_say_so_and_drain_nothing() -> None:
    """A ceph-fuse mount that wrote the files holds their caps: its restores at 1, 2 and 4
    ranks asked the MDS nothing (seen on the test cluster), which says nothing of fresh
    clients: said so, no drain of 0 s drawn."""
    from stampede.present.report import make_console
    from stampede.present.report_mds import render_mds_drains

    drain = mds_drain([MdsCount(n, 1, 4, {}) for n in (1, 2, 4)], "shared", "restore", TARGET,
                      2048, False)
    assert drain is not None and drain.ops == () and drain.requests == 0
    out = io.StringIO()
    render_mds_drains([(drain, None)], make_console(file=out, width=200))
    assert "the MDS counted no request at 1, 2, 4 ranks" in out.getvalue()
    assert "drained in" not in out.getvalue()
