"""The save stampede, end to end through the CLI under a real mpiexec: every layout saves
versions that `run` then restores and verifies; retention, async, buffered saves and
`cycle`; what the archive and the report say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.jobs import read_archive, small_job


def save_job(tmp_path: Path, **overrides: dict[str, object]) -> Path:
    sections: dict[str, dict[str, object]] = {
        "checkpoint": {"size": "8MiB", "layout": ["sharded"], "block_size": "1MiB"},
        "run": {"iterations": 3, "warmup": 1, "verify": "none"},
    }
    for section, table in overrides.items():
        sections.setdefault(section, {}).update(table)
    return small_job(tmp_path, **sections)


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())


def by_op(rows: list[dict[str, str]], layout: str, phase: str) -> dict[str, dict[str, str]]:
    return {row["op"]: row for row in rows if row["layout"] == layout and row["phase"] == phase}


@pytest.mark.mpi
@pytest.mark.parametrize(("layout", "np", "replicas", "validate"), [
    ("sharded", 1, 1, "xxh3"), ("shared", 2, 1, "sha256"), ("replicated", 4, 2, "xxh3"),
    ("striped", 4, 2, "xxh3"), ("fan-out", 3, 1, "finite"), ("metadata-first", 2, 1, "xxh3")])
def test_every_layout_saves_versions_run_restores_and_verifies(stampede, tmp_path: Path,
                                                               layout: str, np: int,
                                                               replicas: int,
                                                               validate: str) -> None:
    job = save_job(tmp_path, checkpoint={"layout": [layout], "replicas": replicas,
                                         "fanout": 2}, save={"validate": validate})
    saved = stampede("save", str(job), np=np)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    ops = by_op(rows, layout, "save")
    assert {"create", "write", "fsync", "close", "rename", "fsync_dir", "validate", "publish",
            "unlink", "rmdir", "blocked", "save", "published"} <= set(ops), sorted(ops)
    assert all(row["valid"] == "true" and row["errors"] == "0" for row in ops.values())
    assert float(ops["save"]["unprotected_s"]) == 0.0
    writers = np if layout == "striped" else np // replicas
    assert int(ops["save"]["count"]) == 3 * writers and int(ops["published"]["count"]) == 3
    shard_bytes = 8 * 2**20 // (np // replicas) // 4096 * 4096
    assert int(ops["write"]["op_bytes"]) >= 3 * shard_bytes * (np // replicas)
    # 4 saves (1 warmup), keep 2: the first two released, one unlink per file of each
    files_per_version = 1 if layout == "shared" else np // replicas
    files_per_version += layout == "metadata-first"
    assert int(ops["unlink"]["count"]) == 2 * files_per_version
    series = tmp_path / "ckpt" / "saves" / layout
    assert sorted(path.name for path in series.iterdir()) == ["latest", "v000003", "v000004"]
    assert (series / "latest").read_text() == "v000004\n"
    assert not [name for name in files_under(tmp_path / "ckpt") if name.endswith(".partial")]

    verify = "sha256" if validate == "sha256" else "xxh3"   # what the save recorded
    restored = stampede("run", str(job), "--set", f"run.verify={verify}", "--set",
                        "run.rank_shift=1", np=np)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    restore = by_op(read_archive(tmp_path / "results" / "job.csv"), layout, "restore")["restore"]
    assert restore["valid"] == "true" and restore["restored_from"] == f"saves/{layout}/v000004"

    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.mpi
def test_async_blocks_only_for_the_snapshot(stampede, tmp_path: Path) -> None:
    job = save_job(tmp_path, checkpoint={"size": "64MiB"}, save={"mode": "async"})
    saved = stampede("save", str(job), np=2)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    ops = by_op(read_archive(tmp_path / "results" / "job.csv"), "sharded", "save")
    assert int(ops["snapshot"]["op_bytes"]) == 3 * 64 * 2**20   # each rank's 32 MiB, 3 saves
    # each rank's save is durable after its snapshot let training go on: every rank's
    # blocked time is within its save, so each order statistic of the blocked times is at
    # most the same one of the save's (causality, not the clock)
    blocked, save = ops["blocked"], ops["save"]
    assert int(blocked["count"]) == int(save["count"]) == 2 * 3
    assert float(blocked["elapsed_s"]) <= float(save["time_to_last_rank_s"])
    for column in ("lat_min_s", "lat_p50_s", "lat_max_s"):
        assert float(blocked[column]) <= float(save[column]), column


@pytest.mark.mpi
def test_a_buffered_save_is_never_called_durable(stampede, tmp_path: Path) -> None:
    job = save_job(tmp_path, save={"durability": "none", "mkdir": "every"})
    saved = stampede("save", str(job), np=2)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    ops = by_op(read_archive(tmp_path / "results" / "job.csv"), "sharded", "save")
    assert "fsync" not in ops
    assert "save.durability = none: no fsync" in ops["save"]["warnings"]
    assert " buf " in saved.stdout and "not durable; never storage GB/s" in saved.stdout
    # every rank makes the version's directories: 2 ranks x (v, v/sharded) x 3 measured saves
    assert int(ops["mkdir"]["count"]) == 12


@pytest.mark.mpi
def test_cycle_restores_what_other_ranks_wrote_in_one_run(stampede, tmp_path: Path) -> None:
    job = save_job(tmp_path, checkpoint={"layout": ["shared", "sharded"]})
    cycled = stampede("cycle", str(job), np=2)
    assert cycled.returncode == 0, cycled.stdout + cycled.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert len({row["run_id"] for row in rows}) == 1
    for layout in ("shared", "sharded"):
        saved, restored = by_op(rows, layout, "save"), by_op(rows, layout, "restore")
        assert saved["save"]["valid"] == restored["restore"]["valid"] == "true"
        assert restored["restore"]["rank_shift"] == "1" and restored["restore"]["cache"] == "cold"
        assert restored["restore"]["restored_from"] == f"saves/{layout}/v000004"
    assert "Save and restore, side by side" in cycled.stdout
    sidecar = json.loads(next((tmp_path / "results" / "job.runs").glob("*.json")).read_text())
    assert set(sidecar["saves"]) == set(sidecar["layouts"]) == {"shared", "sharded"}


@pytest.mark.mpi
def test_save_refuses_before_any_io(stampede, tmp_path: Path) -> None:
    cases = [({"checkpoint": {"layout": ["list-first"]}}, "a way to read, not to write"),
             ({"checkpoint": {"format": "hdf5"}}, "h5py writes through its own calls"),
             ({"save": {"part_size": "1MiB"}}, "parts of at least 5 MiB"),
             ({"checkpoint": {"size": "100000TiB"}}, "it does not fit")]
    for overrides, says in cases:
        job = save_job(tmp_path, **overrides)
        refused = stampede("save", str(job), np=2)
        assert refused.returncode == 2, (overrides, refused.stderr)
        assert says in refused.stderr and "Traceback" not in refused.stderr
        assert not (tmp_path / "ckpt").exists()
    foreign = tmp_path / "ckpt"
    foreign.mkdir()
    (foreign / "theirs").write_text("not stampede's")
    refused = stampede("save", str(save_job(tmp_path)), np=2)
    assert refused.returncode == 2 and "holds nothing stampede wrote" in refused.stderr
    assert files_under(foreign) == ["theirs"]
    # --scale '' once meant full size without a word; report --last 0 once meant 1
    scaled = stampede("cycle", str(save_job(tmp_path)), "--scale", "")
    assert scaled.returncode == 2 and "checkpoint.scale" in scaled.stderr, scaled.stderr
    last = stampede("report", str(tmp_path / "results" / "job.csv"), "--last", "0")
    assert last.returncode == 2 and "--last 0: must be at least 1" in last.stderr


@pytest.mark.parametrize("layout", ["shared", "striped"])
def test_plan_says_who_writes_what_without_touching_storage(stampede, tmp_path: Path,
                                                            layout: str) -> None:
    job = save_job(tmp_path, checkpoint={"layout": [layout], "replicas": 2})
    planned = stampede("plan", str(job), "--save", "--np", "4")
    assert planned.returncode == 0, planned.stderr
    text = " ".join(planned.stdout.split())
    writes = 4 if layout == "shared" else 2   # 1 MiB blocks of a 4 MiB shard, of a half
    assert f"create, {writes} write, fsync, close, rename" in text and "publishes" in text
    assert f"open, {writes} write, fsync, close" in text   # the shared file's other writer
    if layout == "shared":   # replica 1 of each shard holds its shard and writes nothing
        assert "holds its shard; writes nothing" in text
    assert "save adds, at the most," in text and "it fits" in text
    assert not (tmp_path / "ckpt").exists()
    refused = stampede("plan", str(save_job(tmp_path, checkpoint={"layout": ["list-first"]})),
                       "--save")
    assert refused.returncode == 2 and "a way to read, not to write" in refused.stderr


@pytest.mark.mpi
def test_prepare_on_a_target_of_saves_says_so_and_leaves_them(stampede, tmp_path: Path) -> None:
    job = save_job(tmp_path, run={"iterations": 1, "warmup": 0})
    assert stampede("save", str(job), np=2).returncode == 0
    saved = files_under(tmp_path / "ckpt")
    refused = stampede("prepare", str(job), np=2)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert "holds saved versions (stampede-saves.json) and no prepared checkpoint" in said
    assert "`stampede clean` the job that saved them" in said
    assert files_under(tmp_path / "ckpt") == saved



@pytest.mark.mpi
def test_run_on_a_target_of_some_layouts_saves_says_what_to_save_or_restore(
        stampede, tmp_path: Path) -> None:
    """It once suggested a prepare, which then refused the target (it holds saves)."""
    job = save_job(tmp_path, checkpoint={"layout": ["shared", "sharded"]},
                   run={"iterations": 1, "warmup": 0})
    assert stampede("save", str(job), "--set", "checkpoint.layout=sharded", np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 2, result.stdout + result.stderr
    said = " ".join(result.stderr.split())
    assert "layout 'shared' has no published save here, and this target holds saves (of " \
           "sharded), not a prepared checkpoint" in said
    assert "--set checkpoint.layout=shared` first" in said
    assert "(--set checkpoint.layout=sharded)" in said
    restored = stampede("run", str(job), "--set", "checkpoint.layout=sharded", np=2)
    assert restored.returncode == 0, restored.stdout + restored.stderr
