"""The recovery-time model: the worked example exactly, and terms taken from real runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.model.mttr import breakdown, checkpointing, gpu_hours_lost, no_spare_probability
from stampede.units import format_duration
from tests.helpers import requires
from tests.helpers.jobs import read_archive, small_job


def test_the_worked_example_is_55_seconds() -> None:
    model = breakdown(detect_s=15, swap_s=10, init_s=5, weights_gb=30, bw_rank_gbps=2, sync_s=10)
    assert [term.seconds for term in model.terms] == [15, 10, 5, 15, 10]
    assert model.total_s == 55
    assert [term.name for term in model.dominant] == ["T_detect", "S_weights / BW_rank_io"]
    assert not any(term.measured for term in model.terms)
    with pytest.raises(UsageError):
        breakdown(detect_s=1, swap_s=1, init_s=1, weights_gb=1, bw_rank_gbps=0, sync_s=1)


def test_gpu_hours_and_spares() -> None:
    assert gpu_hours_lost(55, 16384) == pytest.approx(55 * 16384 / 3600)
    assert gpu_hours_lost(55, 3600, checkpoint_interval_s=100) == pytest.approx(105)
    # nodes in repair ~ Poisson(N r R): here mean 2 -> P(>= 1) = 1 - e^-2, P(>= 3) by hand
    assert no_spare_probability(48, 1.0, 1, 1.0) == pytest.approx(1 - math.exp(-2))
    assert no_spare_probability(48, 1.0, 3, 1.0) == pytest.approx(1 - 5 * math.exp(-2))
    assert 0 < no_spare_probability(2048, 0.001, 41, 24) < 1e-30   # far tail, not rounded to 0
    assert no_spare_probability(100, 0.0, 1, 24) == 0.0


def test_young_daly_and_the_gpu_hours_of_checkpointing() -> None:
    model = breakdown(detect_s=15, swap_s=10, init_s=5, weights_gb=30, bw_rank_gbps=2, sync_s=10)
    saving = checkpointing(model, gpus=3600, cost_s=2.0, source="assumed", mtbf_h=1.0,
                           interval_s=600)
    assert saving is not None and saving.young_daly_s == pytest.approx(120.0)  # sqrt(2*2*3600)
    optimal, given = saving.intervals
    # 720 saves a day of 2 s on 3,600 GPUs: 1440 GPU-hours; 24 failures of 55 s + 60 s redone
    assert optimal.saving_h_per_day == pytest.approx(720 * 2)
    assert optimal.failures_h_per_day == pytest.approx(24 * (55 + 60))
    assert given.saving_h_per_day == pytest.approx(144 * 2)
    assert given.failures_h_per_day == pytest.approx(24 * (55 + 300))
    assert optimal.total_h_per_day < given.total_h_per_day   # tau is the optimum's interval
    assert checkpointing(model, 3600, 0.0, "", 1.0, 600) is None


@pytest.mark.mpi
def test_mttr_takes_the_checkpoint_cost_from_a_save_run(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["sharded"], "size": "8MiB"},
                    run={"verify": "none"}, save={"mode": "async"})
    assert stampede("save", str(job), np=2).returncode == 0
    archive = tmp_path / "results" / "job.csv"
    result = stampede("mttr", str(archive), "--mtbf-h", "2")
    assert result.returncode == 0, result.stderr
    blocked = next(row for row in read_archive(archive) if row["op"] == "blocked")
    cost_s = float(blocked["elapsed_s"])
    text = " ".join(result.stdout.split())
    assert "sharded, last of 2 ranks blocked, save async" in text
    assert f"Young/Daly {format_duration(math.sqrt(2 * cost_s * 7200))}" in text


@pytest.mark.mpi
def test_mttr_takes_measured_terms_from_real_runs(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["shared", "sharded"]})
    assert stampede("prepare", str(job), np=2).returncode == 0
    assert stampede("run", str(job), np=2).returncode == 0
    startup = tmp_path / "startup.csv"
    assert stampede("startup", "--np", "2", "--repeat", "1", "--archive", str(startup)).returncode == 0
    restore_archive = tmp_path / "results" / "job.csv"
    result = stampede("mttr", str(restore_archive), str(startup), "--layout", "sharded")
    assert result.returncode == 0, result.stderr
    restore = next(row for row in read_archive(restore_archive)
                   if row["op"] == "restore" and row["layout"] == "sharded")
    slowest_gbps = float(restore["slowest_rank_gbps"])
    load_s = float(restore["bytes_per_rank"]) / 1e9 / slowest_gbps
    text = " ".join(result.stdout.split())                       # table cells wrap
    assert f" {format_duration(load_s)} " in text                # its own bytes / its GB/s
    assert "S_weights the run's own 8 MiB per rank at 2 ranks" in text   # never 30 GB
    assert "sharded, slowest of 2 ranks, cache warm" in text
    assert "last rank up" in text and "MPI barrier p50 over 2 ranks" in text
    assert "sharded straggler wait +" in text                   # T_barrier_sync's two parts
    assert "(WARM: page cache, not storage)" in text             # a warm restore is flagged
    assert "waited" in text and "for its first byte" in text
    assert "assumed" in text                                     # T_detect, T_cordon_swap


@pytest.mark.mpi
def test_mttr_adds_the_measured_process_group_init_to_the_sync(stampede, tmp_path: Path) -> None:
    requires.module("torch", "TORCH")
    job = small_job(tmp_path, checkpoint={"layout": ["broadcast"], "replicas": 2},
                    run={"exchange": "torch", "verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    assert stampede("run", str(job), np=2).returncode == 0
    archive = tmp_path / "results" / "job.csv"
    result = stampede("mttr", str(archive), "--layout", "broadcast")
    assert result.returncode == 0, result.stderr
    rows = {row["op"]: row for row in read_archive(archive)}
    sync_s = float(rows["restore"]["time_to_last_rank_s"]) - float(rows["restore"]["first_done_s"]) \
        + float(rows["pg_init"]["elapsed_s"])
    text = " ".join(result.stdout.split())
    assert "broadcast straggler wait +" in text
    assert "broadcast pg_init (torch.distributed process group, 2 ranks)" in text
    assert f" {format_duration(sync_s)} " in text


def test_mttr_inputs_from_a_job_section_and_bad_input(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    job.write_text(job.read_text() + "[mttr]\ndetect_s = 30\nweights_gb = 60\nbw_rank_gbps = 4\n")
    assert stampede("plan", str(job)).returncode == 0           # run and plan ignore [mttr]
    result = stampede("mttr", "--job", str(job))
    assert result.returncode == 0, result.stderr
    assert "T_MTTR" in result.stdout and " 70 s " in result.stdout  # 30 + 10 + 5 + 15 + 10
    job.write_text(job.read_text() + "detect_sec = 1\n")
    bad = stampede("mttr", "--job", str(job))
    assert bad.returncode == 2 and "unknown key 'mttr.detect_sec'" in bad.stderr
    empty = tmp_path / "empty.csv"
    empty.write_text("run_id,op\n")
    assert stampede("mttr", str(empty)).returncode == 2


def test_the_spares_a_job_gives_are_a_pool_of_their_own(stampede, tmp_path: Path) -> None:
    job = tmp_path / "pool.toml"
    job.write_text("[mttr]\nnodes = 48\nnode_failures_per_day = 24\nreplenish_h = 1\nspares = 3\n")
    result = stampede("mttr", "--job", str(job))
    assert result.returncode == 0, result.stderr
    given = next(line for line in result.stdout.splitlines() if line.strip().startswith("given"))
    assert given.split()[1] == "3"
    assert f"{no_spare_probability(48, 24, 3, 1):.3g}" in given   # 1 - 5 e^-2: 0.323
    job.write_text("[mttr]\nspares = 2.5\n")
    assert stampede("mttr", "--job", str(job)).returncode == 2


@pytest.mark.parametrize("flag", ["--gpus", "--mtbf-h", "--nodes", "--bw-rank-gbps",
                                  "--replenish-h"])
def test_negative_flags_are_refused(stampede, flag: str) -> None:
    result = stampede("mttr", flag, "-5")
    assert result.returncode == 2 and f"{flag} -5: must be a finite number" in result.stderr


def test_a_layout_the_archives_do_not_hold_is_refused(stampede, tmp_path: Path) -> None:
    """It once printed the worked example, every term "assumed", exit 0 (--layout), or
    dropped the checkpoint's cost without a word (--save-layout)."""
    from stampede.results.archive import append_rows

    archive = tmp_path / "a.csv"
    common = {"job": "j", "valid": "true", "nranks": 2, "bytes_per_rank": 1, "block_bytes": 1}
    append_rows(archive, [{**common, "run_id": "r1", "layout": "sharded", "op": "restore",
                           "time_to_last_rank_s": 0.5},
                          {**common, "run_id": "r2", "layout": "fan-out", "op": "blocked",
                           "phase": "save", "elapsed_s": 0.1}])
    for args, message in [(["--layout", "shard"], "--layout shard: no valid restore run of it in "
                           f'{archive} (they hold: sharded) (did you mean "sharded"?)'),
                          (["--save-layout", "sharded"], "--save-layout sharded: no valid save "
                           f"run of it in {archive} (they hold: fan-out)")]:
        refused = stampede("mttr", str(archive), *args)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert refused.stdout == ""
    alone = stampede("mttr", "--layout", "sharded")
    assert alone.returncode == 2 and "no ARCHIVE is given" in alone.stderr
    assert stampede("mttr", str(archive), "--layout", "sharded").returncode == 0


def barrier_rows(counts: tuple[int, ...], base_s: float, per_level_s: float) -> list[dict[str, object]]:
    """`stampede startup`'s barrier rows: p50 = base + per_level x log2 N, two runs each
    (the second a little slower, so each count's median lies between them)."""
    return [{"schema": 3, "run_id": f"startup-{count}-{repeat}", "job": "startup",
             "op": "barrier", "phase": "", "valid": True, "nranks": count,
             "lat_p50_s": base_s + per_level_s * math.log2(count) + repeat * 1e-6}
            for count in counts for repeat in (0, 2)]


def test_barrier_sync_at_the_target_is_projected_or_assumed() -> None:
    """T_barrier_sync at 16,384 ranks: from startup barriers at 3+ rank counts, a + b log2 N
    (b = 2 ms a tree level here: 1 ms + 14 x 2 ms); from fewer, the worked example's 10 s,
    assumed and saying why; never the few ranks' own barrier."""
    from stampede.model.mttr import sync_at_target
    from stampede.results.archived import Archive

    runs = Archive(barrier_rows((1, 2, 4, 8), 1e-3, 2e-3)).term_runs("")
    seconds, source = sync_at_target(runs, 16384)
    assert seconds == pytest.approx(1e-3 + 1e-6 + 14 * 2e-3)
    assert source.startswith("projected: MPI barrier p50 1 ms + 2 ms x log2 N from stampede "
                             "startup at 1, 2, 4, 8 ranks")
    few = Archive(barrier_rows((2, 4), 1e-3, 2e-3)).term_runs("")
    seconds, source = sync_at_target(few, 16384)
    assert seconds == 10.0
    assert source.startswith("assumed (worked example): no barrier measured at 3+ rank counts")
    assert "(startup barriers at 2, 4 ranks)" in source
    assert sync_at_target(None, 16384)[0] == 10.0
    # a barrier faster on more ranks is noise: a flat line at their mean, never negative
    falling = Archive(barrier_rows((1, 2, 4), 5e-3, -1e-3)).term_runs("")
    assert sync_at_target(falling, 16384)[0] == pytest.approx(4e-3 + 1e-6)
