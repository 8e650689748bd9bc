"""F, the last rank's time outside its timed ops (stampede.model.contention): measured from
a run's sidecar timeline, taken off each run before the data fit, carried to the target from
the run nearest it, and printed among the projection's terms. Synthetic points (virtual
numbers, no timing), then a real sweep."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from stampede.model.contention import Params, predict
from stampede.model.fit import Point, fit_points
from stampede.model.projection import nearest_run, project
from stampede.model.series import outside_s, series_from_rows
from stampede.results.archived import Archive
from stampede.results.model import TIMELINE_COLUMNS
from tests.helpers.jobs import small_job
from tests.model.test_project import points_from

# a local disk's millisecond restore: one client's 1 GB/s, a fast server that no run saturates
FAST = Params(rtt_s=2e-6, service_s=3e-6, threads=1000, agg_bps=1e15, client_bps=1e9,
              bytes_per_rank=1 << 20)
F_S = 1e-3      # what each run spends outside its ops: the barrier's exit, Python between ops


def with_outside(points: list[Point], outside: float | list[float]) -> list[Point]:
    """The points of runs that also spent `outside` seconds outside their ops (per point)."""
    each = outside if isinstance(outside, list) else [outside] * len(points)
    return [replace(p, last_s=p.last_s + f, last_min_s=p.last_min_s + f,
                    last_max_s=p.last_max_s + f, outside_s=f) for p, f in zip(points, each)]


def test_total_is_f_plus_the_stall_plus_the_data() -> None:
    params = replace(FAST, ops_per_rank=2, fixed_s=F_S)
    prediction = predict(params, 4, "sharded")
    without = predict(replace(params, fixed_s=0.0), 4, "sharded")
    assert prediction.fixed_s == F_S
    assert prediction.total_s == pytest.approx(without.total_s + F_S)
    assert prediction.total_s == pytest.approx(prediction.fixed_s + prediction.meta_s
                                               + prediction.data_s)
    # 1 ms outside the ops against a 1 MiB read at 1 GB/s (1.05 ms): the reads still bound it
    assert prediction.bound_by == "the reads, through B_client"
    assert replace(prediction, fixed_s=5e-3).bound_by == "the time outside the timed ops (F)"


def test_a_constant_millisecond_outside_the_ops_is_projected_with_it() -> None:
    points = with_outside(points_from(FAST, "sharded", ranks=(1, 2, 3)), F_S)
    fit = fit_points(points, "sharded", math.inf)
    # F is taken off before the data fit: B_client is the reads' own, not diluted by F
    assert fit.params.client_bps == pytest.approx(FAST.client_bps, rel=1e-3)
    assert fit.params.fixed_s == F_S
    assert max(abs(r) for r in fit.residuals) < 1e-3
    # 16 MiB per rank at 2 ranks: F stays 1 ms, only the reads grow (folded into the data
    # term, it would have grown 16 times with them)
    size = 16 << 20
    projected = project(points, "sharded", 2, locks=math.inf, per_rank_size=True,
                        bytes_per_rank=size)
    truth = predict(replace(FAST, ops_per_rank=2, fixed_s=F_S, bytes_per_rank=size), 2,
                    "sharded")
    assert projected.prediction.fixed_s == F_S
    assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=1e-3)
    # beyond the runs B_agg is put at the largest run (pessimistic): the truth inside the band
    beyond = project(points, "sharded", 4, locks=math.inf, per_rank_size=True)
    truth = predict(replace(FAST, ops_per_rank=2, fixed_s=F_S), 4, "sharded")
    assert beyond.prediction.total_s >= truth.total_s
    low, high = beyond.band
    assert low == pytest.approx(truth.total_s, rel=1e-3) and high >= truth.total_s
    assert "largest F" not in beyond.band_from      # every run's F alike: no band from it


def test_an_f_that_grows_with_the_ranks_is_carried_from_the_nearest_run() -> None:
    # more ranks than cores: the last rank leaves the barrier late (0.02 ms, then 0.3 ms)
    outside = [20e-6, 30e-6, 300e-6, 450e-6]
    points = with_outside(points_from(FAST, "sharded", ranks=(1, 2, 3, 4)), outside)
    assert nearest_run(points, 64).nranks == 4 and nearest_run(points, 3).nranks == 3
    assert nearest_run(points, 0).nranks == 1
    beyond = project(points, "sharded", 64, locks=math.inf, per_rank_size=True)
    assert beyond.prediction.fixed_s == 450e-6
    inside = project(points[:2] + points[3:], "sharded", 3, locks=math.inf, per_rank_size=True)
    assert inside.prediction.fixed_s == 450e-6      # a tie between 2 and 4: the larger run
    # the band spans the runs' smallest and largest F
    low, high = beyond.band
    assert "the runs' smallest and largest F" in beyond.band_from
    assert high - low >= (450e-6 - 20e-6) * 0.999


def timeline_row(rank: int, iteration: int, done_s: float, in_ops_s: float) -> list[float]:
    """A timeline row of TIMELINE_COLUMNS: `in_ops_s` spent in ops, split over two phases."""
    row = [float(rank), float(iteration), 0.0, 0.0, 0.0, done_s]
    phases = len(TIMELINE_COLUMNS) - len(row)
    return row + [in_ops_s / 2, in_ops_s / 2] + [0.0] * (phases - 2)


def test_f_is_each_iterations_last_rank_outside_its_ops_the_median_over_iterations() -> None:
    timeline = [timeline_row(0, 0, 1.0e-3, 0.9e-3), timeline_row(1, 0, 2.0e-3, 1.5e-3),  # 0.5
                timeline_row(0, 1, 3.0e-3, 2.8e-3), timeline_row(1, 1, 1.0e-3, 0.1e-3),  # 0.2
                timeline_row(0, 2, 1.1e-3, 1.0e-3), timeline_row(1, 2, 1.2e-3, 0.3e-3)]  # 0.9
    sidecar = {"layouts": {"sharded": {"stats": {"timeline": timeline}}}}
    assert outside_s(sidecar, "sharded") == pytest.approx(0.5e-3)
    # no sidecar, another layout, or a timeline from before the phase columns: not measured
    assert outside_s(None, "sharded") == 0.0
    assert outside_s(sidecar, "shared") == 0.0
    old = {"layouts": {"sharded": {"stats": {"timeline": [row[:6] for row in timeline]}}}}
    assert outside_s(old, "sharded") == 0.0


def test_a_real_sweep_measures_f_and_project_prints_it(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"verify": "none"})
    sweep = stampede("sweep", str(job), "--ranks", "1,2,3", "--clean")
    assert sweep.returncode == 0, sweep.stderr
    path = tmp_path / "results" / "job.csv"
    archive = Archive.open(path)
    measured = series_from_rows(archive.rows, sidecars=lambda run: archive.sidecar(run).value)
    assert measured and all(0 < p.outside_s < p.last_s for s in measured for p in s.points)
    assert all(p.outside_s == 0 for s in series_from_rows(archive.rows) for p in s.points)
    result = stampede("project", str(path), "--target-ranks", "64")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("outside the timed ops (F) ") == len(measured)
    assert "as measured at 3 ranks" in result.stdout and "F meas" in result.stdout
