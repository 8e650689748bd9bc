"""I, the ranks that issue a layout's metadata ops (stampede.model.contention.issuers): every
rank, except where only a group's readers touch storage, whose members wait for them. The
archive's k and stall are averages over all ranks; the model takes them per reader.
Synthetic points (virtual numbers, no timing)."""

from __future__ import annotations

import math

import pytest

from stampede.model.contention import Params, issuers, predict
from stampede.model.fit import Point, fit_points
from stampede.model.projection import Scale, project
from stampede.model.traffic import Geometry

# the emulator at S = 20 ms behind a 2 ms round trip, one client's 10 MB/s
SERVER = Params(rtt_s=2e-3, service_s=20e-3, threads=2, agg_bps=1e12, client_bps=10e6,
                bytes_per_rank=256 << 10)


def node_once_point(nranks: int) -> Point:
    """A run of node-once on one node: its one reader stats and opens the file (each op
    RTT + s, the server idle), then reads every rank's shard; the others wait for it."""
    alone = SERVER.rtt_s + SERVER.service_s
    last = 2 * alone + nranks * SERVER.bytes_per_rank / SERVER.client_bps
    return Point(nranks=nranks, ops_per_rank=2 / nranks, meta_s=2 * alone / nranks,
                 last_s=last, bytes_per_rank=SERVER.bytes_per_rank, last_min_s=last * 0.99,
                 last_max_s=last * 1.01, op_counts=(("stat", 1.0), ("open", 1.0)))


def test_the_issuing_ranks_of_each_layout() -> None:
    assert issuers("sharded", Geometry(8, 4, 2)) == 8
    assert issuers("shared", Geometry(4)) == 4
    assert issuers("whole-file", Geometry(4)) == 4
    assert issuers("node-once", Geometry(4)) == 1              # one reader per node
    assert issuers("node-once", Geometry(8, 4, 2)) == 2
    assert issuers("broadcast", Geometry(8, 4, 2)) == 4        # a leader per group of 2
    assert issuers("broadcast", Geometry(4)) == 4              # one replica: all lead
    assert issuers("an-assign-policy", Geometry(4)) == 4       # no layout: every rank


def test_a_readers_stall_is_its_own_ops_in_series() -> None:
    """Node-once at 64 ranks on one node: the reader's stat and open, not 2/64 of them."""
    params = Params(**{**SERVER.__dict__, "ops_per_rank": 2 / 64})
    alone = SERVER.rtt_s + SERVER.service_s
    assert predict(params, 64, "node-once").meta_s == pytest.approx(2 * alone)
    assert not predict(params, 64, "node-once").saturated
    # every rank's own: the burst of 64 x 2 drains through the server's 2 threads
    sharded = predict(Params(**{**SERVER.__dict__, "ops_per_rank": 2}), 64, "sharded")
    assert sharded.meta_s == pytest.approx(SERVER.rtt_s + SERVER.service_s * 64 * 2 / 2)


def test_node_once_is_fitted_per_reader_and_projected() -> None:
    points = [node_once_point(n) for n in (1, 2, 3)]
    fit = fit_points(points, "node-once", math.inf)
    assert fit.meta_measured_s == pytest.approx([2 * (SERVER.rtt_s + SERVER.service_s)] * 3)
    assert max(abs(r) for r in fit.residuals) < 1e-3
    projected = project(points, "node-once", Scale(4, 4), locks=math.inf, per_rank_size=True)
    truth = node_once_point(4).last_s
    assert projected.prediction.total_s == pytest.approx(truth, rel=0.01)
    low, high = projected.band
    assert low <= truth * 1.0001 and high >= truth * 0.9999
