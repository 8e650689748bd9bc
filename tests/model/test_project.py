"""`stampede project`: the contention model, its fit on points made from known parameters,
the refusal to extrapolate from two rank counts, and a projection of a real sweep."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stampede.errors import UsageError
from stampede.model.contention import (
    SAVE_METADATA_OPS,
    Params,
    data_time,
    effective_threads,
    lock_count,
    metadata_stall,
    predict,
)
from stampede.model.fit import Known, Point, fit_points
from stampede.model.projection import Scale, bytes_per_rank_at, ops_per_rank_at, project
from stampede.model.series import series_from_rows
from stampede.results.archive import append_rows
from stampede.results.archived import Archive
from tests.helpers.jobs import small_job

TRUE = Params(rtt_s=50e-6, service_s=200e-6, threads=8, agg_bps=20e9, client_bps=2e9,
              bytes_per_rank=1e9)
RANKS = (1, 2, 4, 8, 16, 32, 64, 128)


def points_from(params: Params, layout: str, ranks: tuple[int, ...] = RANKS, k: float = 2.0,
                noise: float = 0.0) -> list[Point]:
    """What the model says a run at each rank count measures (times deterministic noise)."""
    threads = effective_threads(layout, params.threads, params.locks)
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
    assert sharded.limit == "B_agg" and sharded.data_s == pytest.approx(1e9 / (20e9 / 1024))
    assert sharded.total_s == pytest.approx(sharded.meta_s + sharded.data_s)
    assert sharded.saturated and not predict(params, 1, "sharded").saturated


@pytest.mark.parametrize("layout", ["sharded", "shared"])
@pytest.mark.parametrize("noise, tolerance", [(0.0, 1e-4), (0.01, 0.05)])
def test_the_fit_recovers_known_parameters(layout: str, noise: float, tolerance: float) -> None:
    fit = fit_points(points_from(TRUE, layout, noise=noise), layout, lock_count(layout))
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
    projected = project(points_from(TRUE, layout, noise=noise), layout, 16384, per_rank_size=True,
                        locks=lock_count(layout))
    truth = predict(replace(TRUE, ops_per_rank=2), 16384, layout)
    assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=tolerance + noise)
    assert projected.prediction.meta_s == pytest.approx(truth.meta_s, rel=tolerance + 2 * noise)
    low, high = projected.band
    assert low <= projected.prediction.total_s <= high
    assert "leave-one-out" in projected.band_from and "min/max" in projected.band_from


def test_known_service_time_and_threads_are_held_fixed() -> None:
    server = replace(TRUE, rtt_s=30e-6, service_s=1e-3, threads=4, whole_rounds=True)
    points = points_from(server, "sharded", ranks=(1, 2, 3, 4, 5, 6, 7, 8))
    fit = fit_points(points, "sharded", math.inf, Known(service_s=1e-3, threads=4))
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
    fit = fit_points(points_from(quiet, "sharded", ranks=(1, 2, 4, 8)), "sharded", math.inf)
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


def synthetic_archive(path: Path, *args: Any, **options: Any) -> None:
    """synthetic_rows, archived at `path` (for the command line)."""
    append_rows(path, synthetic_rows(*args, **options))


def synthetic_rows(params: Params, ranks: tuple[int, ...],
                   layouts: tuple[str, ...] = ("shared", "sharded"), iterations: int = 3,
                   phase: str = "restore", ops: tuple[str, ...] = ("stat", "open"),
                   fanout: int = 4) -> list[dict[str, object]]:
    """The rows of an archive holding what runs of the model would have measured
    (`phase`'s rows, each op in `ops` half the stall)."""
    rows: list[dict[str, object]] = []
    for nranks in ranks:
        for layout in layouts:
            locks = lock_count(layout, phase, fanout)
            (point,) = points_from(replace(params, locks=locks), layout, ranks=(nranks,))
            common = {"schema": 3, "run_id": f"run-{nranks}", "timestamp": f"2026-01-01T00:{nranks:02d}",
                      "job": "synthetic", "backend": "posix", "layout": layout, "format": "raw",
                      "cache": "cold", "fs_type": "lustre", "nranks": nranks, "iterations": iterations,
                      "bytes_per_rank": int(point.bytes_per_rank), "valid": True, "stat_count": 1,
                      "open_count": 1, "pattern": "stat+open+read+close", "phase": phase,
                      "fanout": fanout, "size_per_rank_requested": int(point.bytes_per_rank)}
            for op in ops:
                rows.append({**common, "op": op, "count": nranks * iterations,
                             "lat_p50_s": point.meta_s / len(ops)})
            rows.append({**common, "op": phase, "count": nranks * iterations,
                         "time_to_last_rank_s": point.last_s, "time_to_last_rank_min_s": point.last_min_s,
                         "time_to_last_rank_max_s": point.last_max_s})
    return rows


def test_projection_from_an_archive(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "sweep.csv"
    rows = synthetic_rows(TRUE, RANKS)
    append_rows(archive, rows)   # for the command line below; the model reads them in memory
    series = {item.layout: item for item in series_from_rows(Archive(rows).rows)}
    assert set(series) == {"shared", "sharded"} and series["sharded"].per_rank_size
    assert [p.nranks for p in series["sharded"].points] == list(RANKS)
    assert series["sharded"].points[3].ops_per_rank == pytest.approx(2.0)
    for layout, item in series.items():
        projected = project(item.points, layout, 16384, per_rank_size=item.per_rank_size,
                            locks=item.locks)
        truth = predict(replace(TRUE, ops_per_rank=2), 16384, layout)
        assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=1e-3)
    result = stampede("project", str(archive), "--target-ranks", "16384")
    assert result.returncode == 0, result.stderr
    assert "layout shared" in result.stdout and "layout sharded" in result.stdout
    assert "at 16384 ranks (128 nodes of 128): time to last rank" in result.stdout
    assert "c 1 (c_eff: one shared inode)" in result.stdout
    assert "ranked at 16384 ranks: sharded" in result.stdout
    assert "MDS drain" not in result.stdout   # no run's sidecar holds an MDS's counts
    only = stampede("project", str(archive), "--target-ranks", "8", "--layout", "sharded",
                    "--service-s", "200e-6", "--threads", "8", "--net-gbps", "1")
    assert only.returncode == 0, only.stderr
    assert "layout shared" not in only.stdout and "given: s, c" in only.stdout
    assert "limited by B_net" in only.stdout and "within the measured range" in only.stdout



def test_project_lists_every_layouts_bytes_from_storage_at_the_target(stampede,
                                                                      tmp_path: Path) -> None:
    archive = tmp_path / "sweep.csv"
    append_rows(archive, synthetic_rows(TRUE, RANKS))   # 1 GB per rank, B_agg 20 GB/s
    result = stampede("project", str(archive), "--target-ranks", "16384",
                      "--target-ranks-per-node", "8", "--node-gbps", "25",
                      env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("every layout at 16384 ranks, 2,048 node(s) of 8: ", 1)[1]
    assert "seconds at sharded's fitted B_agg and B_node" in table
    rows = {words[0]: " ".join(words[1:]) for line in table.split("─")[-1].splitlines()
            if (words := line.split())}
    # every rank reads the whole 16.4 TB: 16,384x, 16,384 x 819 s at B_agg, 8 x 16.4 TB a node
    assert rows["whole-file"] == "238.4 PiB 16,384x 119.2 TiB 14.9 TiB - 155 days 87.4 min"
    assert rows["sharded"] == "14.9 TiB 1.0x 7.451 GiB 953.7 MiB - 13.7 min 320 ms"


def test_two_rank_counts_are_refused(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "two.csv"
    synthetic_archive(archive, TRUE, (2, 4))
    result = stampede("project", str(archive), "--target-ranks", "16384")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "2 distinct rank count(s) (2, 4); projecting needs at least 3" in lines[0]
    assert result.stdout == ""
    with pytest.raises(UsageError, match="at least 3"):
        project(points_from(TRUE, "sharded", ranks=(1, 1, 2)), "sharded", 64, locks=math.inf)
    for args, message in [(("--layout", "striped"), "no valid restore run of it"),
                          (("--op", "read"), "--op 'read': 'read' is not one of the restore's "
                                             "metadata ops"),
                          (("--threads", "0"), "--threads 0.0: must be")]:
        bad = stampede("project", str(archive), "--target-ranks", "64", *args)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


SECONDS = re.compile(r"([-\d.e+]+|nan|inf) (ns|µs|ms|s)\b")


@pytest.mark.mpi
def test_project_a_real_sweep(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"verify": "none"})
    sweep = stampede("sweep", str(job), "--ranks", "1,2,4", "--clean")
    assert sweep.returncode == 0, sweep.stderr
    archive = tmp_path / "results" / "job.csv"
    result = stampede("project", str(archive), "--target-ranks", "64")
    assert result.returncode == 0, result.stderr
    for layout in ("shared", "sharded"):
        block = result.stdout.split(f"layout {layout} ")[1].split("\n\n")[0]
        line = next(text for text in block.splitlines()
                    if "at 64 ranks (16 nodes of 4): time to last rank" in text)
        numbers = [float(value) for value, _ in SECONDS.findall(line)]
        assert len(numbers) == 3 and all(math.isfinite(x) and x > 0 for x in numbers), line
        assert "metadata stall" in block and "fitted: RTT" in block
    assert "nan" not in result.stdout and " inf" not in result.stdout


# --- the save ---------------------------------------------------------------------------------


def test_what_serialises_a_layout_in_each_phase() -> None:
    """The restore: the shared file's inode. The save: the directory its files are created
    and renamed in; fan-out's are spread over `fanout` of them."""
    assert lock_count("shared") == 1 and lock_count("sharded") == math.inf
    assert [lock_count(layout, "save", 8) for layout in ("shared", "sharded", "striped",
                                                         "metadata-first", "fan-out")] == [1, 1, 1, 1, 8]
    assert effective_threads("fan-out", 16, 8) == 8 and effective_threads("fan-out", 4, 8) == 4
    params = replace(TRUE, ops_per_rank=2)
    one_directory = predict(replace(params, locks=1), 1024, "sharded")
    eight = predict(replace(params, locks=8), 1024, "fan-out")
    assert one_directory.meta_s == pytest.approx(50e-6 + 200e-6 * 1024 * 2)
    assert eight.meta_s == pytest.approx(50e-6 + 200e-6 * 1024 * 2 / 8)


@pytest.mark.parametrize("layout", ["sharded", "fan-out"])
def test_a_save_sweep_is_fitted_and_projected_apart_from_the_restore(stampede, tmp_path: Path,
                                                                    layout: str) -> None:
    """A cycle's archive: save and restore rows of the same runs, an op (open) in both.
    Each phase is fitted on its own rows: the save's parameters come back from its own."""
    archive = tmp_path / "cycle.csv"
    restore = replace(TRUE, service_s=50e-6)
    written = [*synthetic_rows(restore, RANKS, (layout,)),
               *synthetic_rows(TRUE, RANKS, (layout,), phase="save", ops=("create", "open"))]
    append_rows(archive, written)   # for the command line below
    rows = Archive(written).rows
    (saved,) = series_from_rows(rows, ops=SAVE_METADATA_OPS, phase="save")
    (restored,) = series_from_rows(rows)
    assert saved.phase == "save" and saved.locks == (4 if layout == "fan-out" else 1)
    assert restored.locks == math.inf
    truth = predict(replace(TRUE, ops_per_rank=2, locks=saved.locks), 16384, layout)
    projected = project(saved.points, layout, 16384, per_rank_size=True, locks=saved.locks)
    assert projected.fit.params.service_s == pytest.approx(TRUE.service_s, rel=1e-3)
    assert projected.prediction.total_s == pytest.approx(truth.total_s, rel=1e-3)
    fitted_restore = project(restored.points, layout, 16384, per_rank_size=True,
                             locks=restored.locks)
    assert fitted_restore.fit.params.service_s == pytest.approx(restore.service_s, rel=1e-3)
    result = stampede("project", str(archive), "--target-ranks", "16384", "--phase", "save")
    assert result.returncode == 0, result.stderr
    assert "the save: time until the last rank's bytes are durable" in result.stdout
    serialised = "c 1 (c_eff: one directory's lock)" if layout == "sharded" else \
        "(c_eff = min(c, 4 directories' locks))"
    assert serialised in result.stdout
    default = stampede("project", str(archive), "--target-ranks", "16384")
    assert default.returncode == 0 and "the restore: time to last rank" in default.stdout


def test_the_save_is_projected_only_when_asked(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "saves.csv"
    synthetic_archive(archive, TRUE, (1, 2, 4), ("sharded",), phase="save", ops=("create",))
    for args, message in [((), "no valid restore run to fit (they hold save runs: --phase save)"),
                          (("--phase", "save", "--op", "stat"), "--op 'stat': 'stat' is not one "
                                                                "of the save's metadata ops (mkdir, "
                                                                "create, open, fsync"),
                          (("--phase", "save", "--op", "+fsinc"), 'did you mean "fsync"?'),
                          (("--phase", "save", "--op", "fsync,+close"), "not both"),
                          (("--phase", "restore", "--op", "create"), "the restore's metadata ops")]:
        refused = stampede("project", str(archive), "--target-ranks", "64", *args)
        assert refused.returncode == 2 and message in refused.stderr, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1 and refused.stdout == ""


def save_sweep(stampede, job: Path, ranks: tuple[int, ...], *options: str) -> Path:
    for nranks in ranks:
        saved = stampede("save", str(job), *options, np=nranks, timeout=180)
        assert saved.returncode == 0, saved.stdout + saved.stderr
    return job.parent / "results" / "job.csv"


def projected_line(stdout: str, layout: str, what: str) -> tuple[list[float], str]:
    """The seconds in the line of `layout`'s block that holds `what`, in seconds."""
    block = stdout.split(f"layout {layout} ")[1].split("\n\n")[0]
    line = next(text for text in block.splitlines() if what in text)
    scale = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
    return [float(value) * scale[unit] for value, unit in SECONDS.findall(line)], block


@pytest.mark.mpi
def test_project_real_saves_to_a_local_directory(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"size": "8MiB", "layout": ["sharded"]},
                    run={"iterations": 2, "warmup": 1, "verify": "none"})
    archive = save_sweep(stampede, job, (1, 2, 4))
    result = stampede("project", str(archive), "--target-ranks", "16384", "--phase", "save")
    assert result.returncode == 0, result.stderr
    numbers, block = projected_line(result.stdout, "sharded",
                                    "at 16384 ranks (4096 nodes of 4): time to last rank")
    assert len(numbers) == 3 and all(math.isfinite(x) and x > 0 for x in numbers), block
    assert "c 1 (c_eff: one directory's lock)" in block and "durability fsync" in block
    assert "nan" not in result.stdout and " inf" not in result.stdout


def _rows(run_id: str, layout: str, nranks: int, last_s: float, meta_s: float,
          issuing: int | None = None, **columns: object) -> list[dict[str, object]]:
    """A restore run's rows (stat, open, restore), as an archive holds them: `issuing`
    ranks (None: all) each stat and open once per iteration, meta_s between them."""
    common: dict[str, object] = {
        "schema": 2, "run_id": run_id, "timestamp": f"2026-01-01T{run_id}", "job": "sweep",
        "backend": "s3", "layout": layout, "format": "raw", "cache": "cold", "fs_type": "s3",
        "nranks": nranks, "iterations": 3, "valid": True, "stat_count": 1, "open_count": 1,
        "pattern": "stat+open+read+close", "nnodes": 1, "ranks_per_node": nranks, **columns}
    rows: list[dict[str, object]] = [{**common, "op": op, "count": (issuing or nranks) * 3,
                                      "lat_p50_s": meta_s / 2} for op in ("stat", "open")]
    rows.append({**common, "op": "restore", "count": nranks * 3, "time_to_last_rank_s": last_s,
                 "time_to_last_rank_min_s": last_s * 0.99, "time_to_last_rank_max_s": last_s * 1.01})
    return rows


def test_runs_are_matched_on_bytes_per_rank_and_the_rows_left_out_are_named(
        stampede, tmp_path: Path) -> None:
    """1, 2 and 4 ranks of one job, each written as checkpoint.size = 2 MiB x N: the model
    needs bytes per rank, which did not change; projected at 2 MiB per rank (a total split
    over 8 ranks would say 1 MiB). Another configuration, an invalid run and a superseded
    one are left out, and the notes say so."""
    archive = tmp_path / "sweep.csv"
    per_rank = 2 * 2**20
    rows = []
    for index, nranks in enumerate((1, 2, 4)):
        rows += _rows(f"0{index}", "sharded", nranks, 0.01 + 0.002 * nranks, 1e-3 * nranks,
                      bytes_per_rank=per_rank, size_total_requested=per_rank * nranks)
    rows += _rows("03", "sharded", 4, 9.0, 1e-3, bytes_per_rank=per_rank, cache="warm")
    rows += _rows("04", "sharded", 2, 0.5, 1e-3, bytes_per_rank=per_rank, valid=False)
    rows += _rows("05", "sharded", 1, 0.012, 1e-3, bytes_per_rank=per_rank,
                  size_total_requested=per_rank)
    rows.sort(key=lambda row: str(row["run_id"]))
    rows = [row for row in rows if row["run_id"] != "03"] + \
        [row for row in rows if row["run_id"] == "03"]
    written = [{**row, "timestamp": f"2026-01-01T00:00:{row['run_id']}"} for row in rows
               if row["run_id"] != "03"]
    written += [{**row, "timestamp": "2025-12-31T00:00:00"} for row in rows
                if row["run_id"] == "03"]
    append_rows(archive, written)   # for the command line below
    (series,) = series_from_rows(Archive(written).rows)
    assert [p.nranks for p in series.points] == [1, 2, 4] and series.per_rank_size
    notes = " | ".join(series.notes)
    assert "fitted: 3 restore run(s) at ranks@nodes 1@1 (05), 2@1 (01), 4@1 (02)" in notes
    assert "1 with cache warm instead of cold" in notes
    assert "1 earlier run(s) at a rank and node count run again later" in notes
    assert "1 invalid restore run(s)" in notes
    assert "every run restored 2 MiB per rank" in notes
    result = stampede("project", str(archive), "--target-ranks", "8")
    assert result.returncode == 0, result.stderr
    assert "data" in result.stdout and "2 MiB per rank read" in result.stdout


def test_runs_on_several_nodes_teach_the_nic_and_say_what_bounds_each_layout(
        stampede, tmp_path: Path) -> None:
    """Broadcast at 1-4 nodes of 2 ranks, one replica per node (so replicas differ between
    the runs, yet they are one configuration): B_node is learned from the exchange, the
    projection keeps one replica per node, and says what bounds it there."""
    from stampede.model.contention import issuers
    from stampede.model.traffic import Geometry, data_seconds, traffic

    agg, node, per_rank = 20e6, 50e6, 4e6
    archive = tmp_path / "nodes.csv"
    rows = []
    for nodes in (1, 2, 3, 4):
        replicas = max(nodes, 2)
        geometry = Geometry(2 * nodes, 2, replicas)
        read, moved, _ = data_seconds(traffic("broadcast", geometry), per_rank, agg, node, 1e12)
        # only the groups' leaders stat and open (their members wait): 2 ms each
        rows += _rows(f"1{nodes}", "broadcast", 2 * nodes, 2e-3 + read + moved, 2e-3,
                      issuing=int(issuers("broadcast", geometry)),
                      bytes_per_rank=int(per_rank), size_per_rank_requested=int(per_rank),
                      nnodes=nodes, ranks_per_node=2, replicas=replicas,
                      broadcast_group="replica")
    append_rows(archive, rows)   # for the command line below
    (series,) = series_from_rows(Archive(rows).rows)
    assert [p.nnodes for p in series.points] == [1, 2, 3, 4]
    assert series.scaling.replicas_per_node and series.scaling.ranks_per_node == 2
    result = stampede("project", str(archive), "--target-ranks", "16")
    assert result.returncode == 0, result.stderr
    assert "B_node 0.05 GB/s" in result.stdout and "B_agg 0.02 GB/s" in result.stdout
    assert "at 16 ranks (8 nodes of 2)" in result.stdout
    assert "then 280 ms exchanging between nodes through" in result.stdout
    assert "bound by the reads, through B_agg" in result.stdout
    assert "one replica per node: projected so" in result.stdout.replace("\n", " ")
    # 8 nodes: MPICH's scatter + allgather, 2 x 7/8 shards through node 0's NIC, 2 groups
    projection = project(series.points, "broadcast", Scale(16, 2, 8), per_rank_size=True,
                         locks=series.locks)
    expected = 2e-3 + 2 * per_rank / agg + 2 * (2 * 7 / 8) * per_rank / node
    assert projection.prediction.total_s == pytest.approx(expected, rel=0.02)
    bad = stampede("project", str(archive), "--target-ranks", "16", "--replicas", "3")
    assert bad.returncode == 2 and "--replicas 3 does not divide --target-ranks 16" in bad.stderr


def test_a_drain_resting_on_one_saturated_run_widens_the_band() -> None:
    """Fitted on 1, 2, 4 ranks of a 2-slot server (only 4 saturates it), the runs cannot
    pin s/c: the band holds the fits they cannot tell apart, and the truth at 16,384."""
    server = Params(rtt_s=0.5e-3, service_s=10e-3, threads=2, agg_bps=1e12, client_bps=1e9,
                    bytes_per_rank=2e6, whole_rounds=True)
    points = points_from(server, "sharded", ranks=(1, 2, 4), noise=0.03)
    projection = project(points, "sharded", 16384, per_rank_size=True, locks=math.inf)
    assert "the metadata fits within the runs' spread" in projection.band_from
    truth = predict(replace(server, ops_per_rank=2), 16384, "sharded")
    low, high = projection.meta_band
    assert low <= truth.meta_s <= high


def test_a_projection_to_several_nodes_from_runs_on_one_says_the_nic_is_missing(
        stampede, tmp_path: Path) -> None:
    archive = tmp_path / "one-node.csv"
    synthetic_archive(archive, TRUE, (1, 2, 4, 8), layouts=("sharded",))
    result = stampede("project", str(archive), "--target-ranks", "64", "--target-ranks-per-node", "8")
    assert result.returncode == 0, result.stderr
    text = result.stdout.replace("\n", " ")
    assert "(8 nodes of 8)" in text and "every run was on one node" in text
    given = stampede("project", str(archive), "--target-ranks", "64", "--target-ranks-per-node", "8",
                     "--node-gbps", "1")
    assert given.returncode == 0 and "B_node 1 GB/s" in given.stdout
    assert "given: B_node" in given.stdout.replace("\n", " ")


def test_op_names_the_ops_instead_of_the_defaults_or_adds_to_them() -> None:
    """`--op +fsync` adds fsync to the save's defaults, as the docs say; `--op fsync` alone
    is fsync instead of them (the docs once said it added: a projection 16x too small)."""
    from stampede.commands.project import chosen_ops

    assert chosen_ops("", "save") == SAVE_METADATA_OPS
    assert chosen_ops("+fsync", "save") == (*SAVE_METADATA_OPS, "fsync")
    assert chosen_ops("+fsync, +rename", "save") == (*SAVE_METADATA_OPS, "fsync")
    assert chosen_ops("create,rename", "save") == ("create", "rename")
    assert chosen_ops("stat", "restore") == ("stat",)



@pytest.mark.parametrize("old, new, value", [
    ("--ranks", "--target-ranks", "64"), ("--ranks-per-node", "--target-ranks-per-node", "8"),
    ("--model", "--target-model", "llama3-8b"), ("--size", "--target-size", "64GiB"),
    ("--bytes-per-rank", "--target-bytes-per-rank", "2GiB")])
def test_the_old_names_of_the_target_still_work_and_warn(stampede, tmp_path: Path, old: str,
                                                          new: str, value: str) -> None:
    archive = tmp_path / "sweep.csv"
    synthetic_archive(archive, TRUE, (1, 2, 4, 8), layouts=("sharded",))
    target = [] if old == "--ranks" else ["--target-ranks", "64"]
    given_new = stampede("project", str(archive), *target, new, value)
    given_old = stampede("project", str(archive), *target, old, value)
    assert given_new.returncode == given_old.returncode == 0, given_old.stderr
    assert given_old.stdout == given_new.stdout and "at 64 ranks" in given_old.stdout
    assert given_new.stderr == ""
    assert given_old.stderr == (f"stampede: {old} is now {new} for project; the old name goes in "
                                "the next release\n")


def blocked_rows(ranks: tuple[int, ...], mode: str, blocked_s: float) -> list[dict[str, object]]:
    """The save's `blocked` pseudo-op of each run of synthetic_rows' save phase."""
    return [{"schema": 3, "run_id": f"run-{nranks}", "timestamp": f"2026-01-01T00:{nranks:02d}",
             "job": "synthetic", "backend": "posix", "layout": "sharded", "cache": "cold",
             "nranks": nranks, "op": "blocked", "phase": "save", "valid": True,
             "save_mode": mode, "durability": "fsync", "elapsed_s": blocked_s,
             "bytes_per_rank": 1 << 20} for nranks in ranks]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_young_daly_takes_the_save_at_the_target(mode: str) -> None:
    """C at the target: a sync save blocks for the save projected there (its time to last
    rank at 16,384 ranks, not the 4-rank run's); an async save for its snapshot, the
    measured one scaled by the bytes per rank (the rank count does not enter it)."""
    from stampede.model.assessment import phase_verdict
    from stampede.model.mttr import checkpoint_cost_at_target, measured_checkpoint_cost
    from stampede.model.workload import Workload

    ranks = (1, 2, 4, 8)
    rows = [*synthetic_rows(TRUE, ranks, layouts=("sharded",), phase="save",
                            ops=("create", "open")), *blocked_rows(ranks, mode, 0.25)]
    archive = Archive(rows)
    workload = Workload(16384, 8, bytes_per_rank=float(4 << 20))
    save = phase_verdict(archive.rows, "save", workload)
    assert save is not None and [item[0].layout for item in save.projections] == ["sharded"]
    projection = save.projections[0][1]
    assert projection.params.bytes_per_rank == 4 << 20
    cost_s, source = checkpoint_cost_at_target(archive, "", save.saves_at_target, workload)
    if mode == "sync":
        assert cost_s == projection.prediction.total_s != 0.25
        assert source.startswith("projected: sharded save (sync: blocks until durable) at 16384")
    else:
        assert cost_s == pytest.approx(0.25 * 4)
        assert source.startswith("scaled: ") and "async snapshot 250 ms x 4 MiB / 1 MiB" in source
    assert measured_checkpoint_cost(archive, "")[0] == 0.25   # without a target: as measured
    # two rank counts do not project: the measured C, and why not at the target
    few = Archive([row for row in rows if row["nranks"] in (1, 2)])
    unprojected = phase_verdict(few.rows, "save", workload)
    assert unprojected is not None
    cost_s, source = checkpoint_cost_at_target(few, "", unprojected.saves_at_target, workload)
    assert cost_s == 0.25
    assert "; as measured, not at 16384 ranks (layout sharded: save runs at 2 distinct" in source
