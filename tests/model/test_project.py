"""`stampede project`: the contention model, its fit on points made from known parameters,
the refusal to extrapolate from two rank counts, and a projection of a real sweep."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.model.contention import Params, data_time, effective_threads, metadata_stall, predict
from stampede.model.fit import Known, Point, bytes_per_rank_at, fit_points, ops_per_rank_at, project
from stampede.model.series import series_from_rows
from stampede.results.archive import append_rows, read_rows
from tests.helpers.jobs import small_job

TRUE = Params(rtt_s=50e-6, service_s=200e-6, threads=8, agg_bps=20e9, client_bps=2e9,
              bytes_per_rank=1e9)
RANKS = (1, 2, 4, 8, 16, 32, 64, 128)


def points_from(params: Params, layout: str, ranks: tuple[int, ...] = RANKS, k: float = 2.0,
                noise: float = 0.0) -> list[Point]:
    """What the model says a run at each rank count measures (times deterministic noise)."""
    threads = effective_threads(layout, params.threads)
    points = []
    for index, nranks in enumerate(ranks):
        stall = metadata_stall(nranks, k, params.rtt_s, params.service_s, threads,
                               params.whole_rounds)
        last = stall + data_time(nranks, params.bytes_per_rank, params.agg_bps, params.client_bps)
        wobble = 1 + noise * math.sin(7 * index + 1)
        points.append(Point(nranks=nranks, ops_per_rank=k, meta_s=stall * wobble,
                            last_s=last * wobble, bytes_per_rank=params.bytes_per_rank,
                            last_min_s=last * wobble * 0.97, last_max_s=last * wobble * 1.03,
                            op_counts=(("stat", nranks * k / 2), ("open", nranks * k / 2))))
    return points


def test_the_model_terms() -> None:
    # alone: k (RTT + s); a burst past capacity drains: RTT + s N k / c
    assert metadata_stall(1, 2, 50e-6, 200e-6, 8) == pytest.approx(2 * 250e-6)
    assert metadata_stall(64, 2, 50e-6, 200e-6, 8) == pytest.approx(50e-6 + 200e-6 * 64 * 2 / 8)
    assert metadata_stall(5, 2, 0.0, 1e-3, 4) == pytest.approx(2.5e-3)
    assert metadata_stall(5, 2, 0.0, 1e-3, 4, whole_rounds=True) == pytest.approx(3e-3)
    assert metadata_stall(64, 0, 50e-6, 200e-6, 8) == 0.0
    # data: the slowest of B_agg / N, B_client, B_net
    assert data_time(4, 1e9, 20e9, 2e9) == pytest.approx(0.5)            # B_client
    assert data_time(40, 1e9, 20e9, 2e9) == pytest.approx(2.0)           # B_agg / N
    assert data_time(4, 1e9, 20e9, 2e9, net_bps=1e9) == pytest.approx(1.0)
    # the shared layout's ops wait on one inode: c_eff = 1
    params = replace(TRUE, ops_per_rank=2, bytes_per_rank=1e9)
    sharded, shared = predict(params, 1024, "sharded"), predict(params, 1024, "shared")
    assert sharded.meta_s == pytest.approx(50e-6 + 200e-6 * 1024 * 2 / 8)
    assert shared.meta_s == pytest.approx(50e-6 + 200e-6 * 1024 * 2)
    assert sharded.limit == "B_agg / N" and sharded.data_s == pytest.approx(1e9 / (20e9 / 1024))
    assert sharded.total_s == pytest.approx(sharded.meta_s + sharded.data_s)
    assert sharded.saturated and not predict(params, 1, "sharded").saturated


@pytest.mark.parametrize("layout", ["sharded", "shared"])
@pytest.mark.parametrize("noise, tolerance", [(0.0, 1e-4), (0.01, 0.05)])
def test_the_fit_recovers_known_parameters(layout: str, noise: float, tolerance: float) -> None:
    fit = fit_points(points_from(TRUE, layout, noise=noise), layout)
    got = fit.params
    # RTT is the small intercept of the saturated line: the least determined of them
    assert got.rtt_s == pytest.approx(TRUE.rtt_s, rel=3 * tolerance if not noise else 0.1)
    assert got.service_s == pytest.approx(TRUE.service_s, rel=tolerance)
    assert got.agg_bps == pytest.approx(TRUE.agg_bps, rel=tolerance)
    assert got.client_bps == pytest.approx(TRUE.client_bps, rel=tolerance)
    if layout == "shared":
        assert got.threads == 1.0   # not fitted: one inode serialises
    else:
        assert got.threads == pytest.approx(TRUE.threads, rel=tolerance)
        assert fit.saturated == (16, 32, 64, 128)        # k (RTT + s) < RTT + s N k / c from 16
    assert fit.agg_limited == (16, 32, 64, 128)          # 2 GB/s x N > 20 GB/s from 16
    assert max(abs(r) for r in fit.residuals) <= 3 * noise + 1e-6
    assert not fit.stall_bound and not fit.agg_bound
    projected = project(points_from(TRUE, layout, noise=noise), layout, 16384, per_rank_size=True)
    truth = predict(replace(TRUE, ops_per_rank=2), 16384, layout)
    assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=tolerance + noise)
    assert projected.prediction.meta_s == pytest.approx(truth.meta_s, rel=tolerance + 2 * noise)
    low, high = projected.band
    assert low <= projected.prediction.total_s <= high
    assert "leave-one-out" in projected.band_from and "min/max" in projected.band_from


def test_known_service_time_and_threads_are_held_fixed() -> None:
    server = replace(TRUE, rtt_s=30e-6, service_s=1e-3, threads=4, whole_rounds=True)
    points = points_from(server, "sharded", ranks=(1, 2, 3, 4, 5, 6, 7, 8))
    fit = fit_points(points, "sharded", Known(service_s=1e-3, threads=4))
    assert (fit.params.service_s, fit.params.threads) == (1e-3, 4)
    assert fit.params.whole_rounds
    assert fit.params.rtt_s == pytest.approx(30e-6, rel=1e-6)
    for point, stall in zip(points, fit.meta_model_s):     # whole rounds of s: exact
        assert stall == pytest.approx(point.meta_s, rel=1e-9)
    # predict() alone, with nothing fitted: the emulator's validation path
    params = replace(server, ops_per_rank=2)
    assert predict(params, 5, "sharded").meta_s == pytest.approx(30e-6 + 3 * 1e-3)


def test_unreached_limits_are_pessimistic_bounds() -> None:
    # a fast server and slow clients: no run saturates metadata or reaches B_agg
    quiet = Params(rtt_s=10e-6, service_s=40e-6, threads=1000, agg_bps=1e15, client_bps=1e9,
                   bytes_per_rank=1e8)
    fit = fit_points(points_from(quiet, "sharded", ranks=(1, 2, 4, 8)), "sharded")
    assert fit.stall_bound and fit.agg_bound and not fit.saturated
    assert fit.params.agg_bps == pytest.approx(8 * 1e9, rel=1e-6)   # the largest run at the limit
    assert fit.params.rtt_s == 0.0                                   # all latency is server time
    assert fit.params.service_s / fit.params.threads >= 50e-6 / 8 * 0.95
    assert max(abs(r) for r in fit.residuals) < 1e-6


def test_ops_and_bytes_at_the_projected_rank_count() -> None:
    # list-bcast: rank 0 lists once per job, every rank stats and opens its shard
    points = [Point(nranks=n, ops_per_rank=2 + 1 / n, meta_s=1e-3, last_s=1.0, bytes_per_rank=1e9 / n,
                    op_counts=(("list", 1.0), ("stat", float(n)), ("open", float(n))))
              for n in (1, 2, 4)]
    assert ops_per_rank_at(points, 1000) == pytest.approx(2 + 1 / 1000)
    assert bytes_per_rank_at(points, 1000, per_rank_size=False) == pytest.approx(1e9 / 1000)
    assert bytes_per_rank_at(points, 1000, per_rank_size=True) == pytest.approx(1e9 / 4)


def synthetic_archive(path: Path, params: Params, ranks: tuple[int, ...],
                      layouts: tuple[str, ...] = ("shared", "sharded"), iterations: int = 3) -> None:
    """An archive holding what runs of the model would have measured."""
    rows: list[dict[str, object]] = []
    for nranks in ranks:
        for layout in layouts:
            (point,) = points_from(params, layout, ranks=(nranks,))
            common = {"schema": 1, "run_id": f"run-{nranks}", "timestamp": f"2026-01-01T00:{nranks:02d}",
                      "job": "synthetic", "backend": "posix", "layout": layout, "format": "raw",
                      "cache": "cold", "fs_type": "lustre", "nranks": nranks, "iterations": iterations,
                      "bytes_per_rank": int(point.bytes_per_rank), "valid": True, "stat_count": 1,
                      "open_count": 1, "pattern": "stat+open+read+close",
                      "size_per_rank_requested": int(point.bytes_per_rank)}
            for op in ("stat", "open"):
                rows.append({**common, "op": op, "count": nranks * iterations,
                             "lat_p50_s": point.meta_s / 2})
            rows.append({**common, "op": "restore", "count": nranks * iterations,
                         "time_to_last_rank_s": point.last_s, "time_to_last_rank_min_s": point.last_min_s,
                         "time_to_last_rank_max_s": point.last_max_s})
    append_rows(path, rows)


def test_projection_from_an_archive(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "sweep.csv"
    synthetic_archive(archive, TRUE, RANKS)
    series = {item.layout: item for item in series_from_rows(read_rows(archive))}
    assert set(series) == {"shared", "sharded"} and series["sharded"].per_rank_size
    assert [p.nranks for p in series["sharded"].points] == list(RANKS)
    assert series["sharded"].points[3].ops_per_rank == pytest.approx(2.0)
    for layout, item in series.items():
        projected = project(item.points, layout, 16384, per_rank_size=item.per_rank_size)
        truth = predict(replace(TRUE, ops_per_rank=2), 16384, layout)
        assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=1e-3)
    result = stampede("project", str(archive), "--ranks", "16384")
    assert result.returncode == 0, result.stderr
    assert "layout shared" in result.stdout and "layout sharded" in result.stdout
    assert "at 16384 ranks: time to last rank" in result.stdout
    assert "c 1 (c_eff: one shared inode)" in result.stdout
    assert "ranked at 16384 ranks: sharded" in result.stdout
    only = stampede("project", str(archive), "--ranks", "8", "--layout", "sharded",
                    "--service-s", "200e-6", "--threads", "8", "--net-gbps", "1")
    assert only.returncode == 0, only.stderr
    assert "layout shared" not in only.stdout and "given: s, c" in only.stdout
    assert "limited by B_net" in only.stdout and "within the measured range" in only.stdout


def test_two_rank_counts_are_refused(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "two.csv"
    synthetic_archive(archive, TRUE, (2, 4))
    result = stampede("project", str(archive), "--ranks", "16384")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "2 distinct rank count(s) (2, 4); projecting needs at least 3" in lines[0]
    assert result.stdout == ""
    with pytest.raises(UsageError, match="at least 3"):
        project(points_from(TRUE, "sharded", ranks=(1, 1, 2)), "sharded", 64)
    for args, message in [(("--layout", "striped"), "no valid restore run of it"),
                          (("--op", "read"), "--op 'read': choose from"),
                          (("--threads", "0"), "--threads 0.0: must be")]:
        bad = stampede("project", str(archive), "--ranks", "64", *args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


SECONDS = re.compile(r"([-\d.e+]+|nan|inf) (ns|µs|ms|s)\b")


@pytest.mark.mpi
def test_project_a_real_sweep(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"verify": "none"})
    sweep = stampede("sweep", str(job), "--ranks", "1,2,4", "--clean")
    assert sweep.returncode == 0, sweep.stderr
    archive = tmp_path / "results" / "job.csv"
    result = stampede("project", str(archive), "--ranks", "64")
    assert result.returncode == 0, result.stderr
    for layout in ("shared", "sharded"):
        block = result.stdout.split(f"layout {layout} ")[1].split("\n\n")[0]
        line = next(text for text in block.splitlines() if "at 64 ranks: time to last rank" in text)
        numbers = [float(value) for value, _ in SECONDS.findall(line)]
        assert len(numbers) == 3 and all(math.isfinite(x) and x > 0 for x in numbers), line
        assert "metadata stall" in block and "fitted: RTT" in block
    assert "nan" not in result.stdout and " inf" not in result.stdout
