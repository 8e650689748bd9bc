"""MLPerf Storage's checkpointing through `stampede cycle` under a real mpiexec: the
workload's files per rank, byte for byte; MLPerf's metrics in a summary JSON with DLIO's
field names; the rules checked, and a broken one (one host: the rank shift cannot move
the reads to another host) marking the run not comparable, as scaling does."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from stampede.checkpoint.mlperf import MODELS, rank_files
from tests.helpers.jobs import read_archive, write_job


@pytest.mark.mpi
def test_cycle_writes_the_layout_and_the_summary(stampede, tmp_path: Path) -> None:
    job = write_job(tmp_path, target={"path": str(tmp_path / "ckpt")},
                    checkpoint={"layout": ["mlperf"], "workload": "llama3-405b",
                                "subset": True, "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 0, "verify": "xxh3"},
                    save={"validate": "xxh3", "keep": 2},
                    archive={"path": str(tmp_path / "results" / "job.csv")})
    done = stampede("cycle", str(job), "--scale", "1/8192", np=4)
    assert done.returncode == 0, done.stdout + done.stderr
    # every rank's files, at the sizes the rules give them (scaled), in each version
    model, scale = MODELS["llama3-405b"], Fraction(1, 8192)
    expected = {name: nbytes for rank in range(4)
                for name, nbytes in rank_files(model, rank, 4, True, scale)}
    assert len(expected) == 4 * 6     # layers 0-4 of stage 0 and the optimizer, per rank
    for version in ("v000001", "v000002"):
        found = {path.name: path.stat().st_size
                 for path in (tmp_path / "ckpt" / "saves" / "mlperf" / version).iterdir()}
        assert found == expected
    # the restores read (and verified) the shifted ranks' files
    rows = read_archive(tmp_path / "results" / "job.csv")
    restore = {row["op"]: row for row in rows if row["phase"] == "restore"}
    assert restore["restore"]["valid"] == "true" and restore["verify"]["errors"] == "0"
    assert int(restore["read"]["op_bytes"]) == 2 * sum(expected.values())
    assert all("not comparable with submissions" in row["warnings"] for row in rows)
    summaries = list((tmp_path / "results" / "job.runs").glob("*-summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    metric = summary["metric"]
    for prefix in ("save", "load"):
        for field in ("io_mean_GB_per_second", "io_stdev_GB_per_second",
                      "duration_mean_seconds", "duration_stdev_seconds",
                      "throughput_GB_per_second", "slowest_rank_GB_per_second"):
            assert metric[f"{prefix}_checkpoint_{field}"] > 0, (prefix, field)
        # DLIO's mean of rates is at or above the throughput over the mean duration
        assert metric[f"{prefix}_checkpoint_io_mean_GB_per_second"] >= \
            metric[f"{prefix}_checkpoint_throughput_GB_per_second"] * (1 - 1e-9)
    assert metric["checkpoint_size_GB"] == pytest.approx(sum(expected.values()) / 2**30)
    assert summary["num_accelerators"] == 4 and summary["num_checkpoints_read"] == 2
    rules = {rule["rule"]: rule for rule in summary["rules"]}
    assert rules["cache"]["ok"] and rules["gap"]["ok"]
    assert not rules["rank_shift"]["ok"] and "one host" in rules["rank_shift"]["detail"]
    assert not summary["comparable"]
    reasons = " | ".join(summary["not_comparable"])
    assert "sizes scaled by 1/8192" in reasons and "subset: 4 of 512 ranks" in reasons
    assert "rule rank_shift" in reasons
    assert "mlperf rule rank_shift: BROKEN" in done.stderr
