"""The job commands' own decisions, before any I/O: which rank count `plan` plans for,
and what a job needs installed (the command's error, never the job's validation)."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from stampede.checkpoint.formats import require_packages
from stampede.errors import UsageError
from stampede.spec import build_job

REPO = Path(__file__).resolve().parents[2]


def test_plan_plans_for_the_launchers_rank_count_not_the_batch_scripts(
        stampede, monkeypatch: pytest.MonkeyPatch) -> None:
    job = str(REPO / "jobs" / "quickstart.toml")
    # In an sbatch script, outside any srun step, SLURM_NTASKS is the allocation's: this
    # process is one rank (SLURM_STEP_NUM_TASKS is the step's, set only inside srun).
    for name in [name for name in os.environ if name.startswith(("SLURM_", "PMI_", "OMPI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_NTASKS", "64")
    alone = stampede("plan", job)
    assert alone.returncode == 0, alone.stderr
    assert "1 rank(s)" in alone.stdout and "64 rank(s)" not in alone.stdout
    assert "16 rank(s)" in stampede("plan", job, "--np", "16").stdout


def test_validation_is_the_same_without_h5py(monkeypatch: pytest.MonkeyPatch) -> None:
    document = {"target": {"path": "/tmp/x"}, "checkpoint": {"size": "1MiB", "format": "hdf5"}}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "h5py" else real(name, *args))
    spec = build_job("h5", "h5.toml", document)   # a valid job on every machine
    with pytest.raises(UsageError, match="needs h5py") as caught:
        require_packages(spec)                    # the command's check, before any I/O
    assert caught.value.exit_status == 2


@pytest.mark.mpi
def test_the_prepare_to_paste_repeats_the_set_options_and_the_launcher(
        stampede, tmp_path: Path) -> None:
    from stampede.launcher import find_mpiexec
    from tests.helpers.jobs import small_job

    job = small_job(tmp_path, checkpoint={"layout": "sharded"})
    moved = f"target.path={str(tmp_path / 'elsewhere')!r}"
    result = stampede("run", str(job), "--set", moved, "--set", "run.iterations=1", np=2)
    assert result.returncode == 2
    hint = result.stderr.split("hint: run `", 1)[1].split("`", 1)[0]
    assert hint.startswith(f"{find_mpiexec()} -n 2 ")
    assert hint.endswith(f"prepare {job} --set {shlex.quote(moved)} --set run.iterations=1")
    pasted = subprocess.run(hint, shell=True, capture_output=True, text=True, cwd=tmp_path,
                            timeout=120)
    assert pasted.returncode == 0, pasted.stderr              # it works as printed
    assert (tmp_path / "elsewhere" / "stampede-manifest.json").exists()


def test_plan_checks_everything_before_it_prints_anything(stampede, tmp_path: Path) -> None:
    from tests.helpers.jobs import small_job

    job = small_job(tmp_path, checkpoint={"replicas": 3, "layout": "broadcast"})
    result = stampede("plan", str(job), "--np", "4")   # 3 replicas do not divide 4 ranks
    assert result.returncode == 2 and "does not divide 4 ranks" in result.stderr
    assert result.stdout == ""                           # no "validated" table first


def test_gpu_on_the_host_runs_with_its_default_modes(stampede, tmp_path: Path) -> None:
    result = stampede("gpu", "--device", "host", "--sizes", "1MiB", "--trials", "1",
                      "--archive", str(tmp_path / "gpu.csv"))
    assert result.returncode == 0, result.stderr   # the hint "--device host" works as given
    assert "pinned" not in (tmp_path / "gpu.csv").read_text()


def _served(stdout: str) -> dict[str, str]:
    """plan's table of every layout at the rank count: layout -> its cells, one space apart."""
    table = stdout.split("every layout at ", 1)[1].split("space:", 1)[0].split("─", 1)[-1]
    return {words[0]: " ".join(words[1:]) for line in table.splitlines()
            if (words := line.split())}


def test_plan_shows_every_layouts_bytes_from_storage_before_it_runs(stampede, tmp_path: Path,
                                                                    ) -> None:
    job = str(REPO / "jobs" / "quickstart.toml")
    common = ("--set", f"target.path={tmp_path / 'ckpt'}", "--set", "checkpoint.size=1GiB",
              "--set", "checkpoint.layout=whole-file")
    planned = stampede("plan", job, "--np", "16384", "--ranks-per-node", "8", *common,
                       env={"COLUMNS": "200"})
    assert planned.returncode == 0, planned.stderr
    assert "at 16384 rank(s), 2,048 node(s) of 8" in planned.stdout
    served = _served(planned.stdout)
    # (from storage, amplification, busiest node, one reader, exchange): whole-file's
    # 16,384 ranks each read the whole 1 GiB; the others each byte once
    assert served["whole-file"] == "16 TiB 16,384x 8 GiB 1 GiB -"
    assert served["sharded"] == "1 GiB 1.0x 512 KiB 64 KiB -"
    assert "broadcast" not in served   # one replica: no layout that needs two
    # a whole-file rank's reads folded: its first slice, how many more, its last
    assert "16,382 more slices" in planned.stdout
    assert len(planned.stdout.splitlines()) < 200
    replicated = _served(stampede("plan", job, "--np", "8", "--ranks-per-node", "4", *common,
                                  "--set", "checkpoint.replicas=4", env={"COLUMNS": "200"}
                                  ).stdout)
    # 2 shards x 4 replicas of 512 MiB: the replicas read each shard 4 times, broadcast once
    assert replicated["replicated"].startswith("4 GiB 4.0x ")
    assert replicated["broadcast"].startswith("1 GiB 1.0x ")
    assert replicated["whole-file"].startswith("8 GiB 8.0x ")


def test_plan_on_an_object_store_says_the_busiest_prefixs_requests(stampede) -> None:
    job = str(REPO / "jobs" / "quickstart.toml")
    common = ("--set", "target.path=s3://bucket/ck", "--set", "checkpoint.size=16GiB",
              "--set", "checkpoint.block_size=16MiB", "--set",
              'checkpoint.layout=["sharded", "list-first", "list-bcast"]')
    rows = {}
    for copies in (1, 4):
        planned = stampede("plan", job, "--np", "4096", "--restore-time", "10s", *common,
                           "--set", f"checkpoint.copies={copies}", env={"COLUMNS": "200"})
        assert planned.returncode == 0, planned.stderr
        assert "object store requests per prefix at 4,096 rank(s)" in planned.stdout
        for line in planned.stdout.splitlines():
            cells = line.split()
            if cells and cells[0] in ("sharded", "list-first", "list-bcast") and \
                    cells[2] in ("sharded/", "copy-0/"):
                rows[cells[0], copies] = cells[1:]
    # 4 MiB a rank, 16 MiB blocks: a GET and two HEADs a rank, at one prefix or a copy's
    assert rows["sharded", 1][:5] == ["1", "sharded/", "4,096", "8,192", "0"]
    assert rows["sharded", 1][5:8] == ["1.23k", "22.3%", "1"]   # 12,288 in 10 s of 5,500/s
    assert rows["sharded", 4][:5] == ["4", "copy-0/", "1,024", "2,048", "0"]
    # every rank lists 4,096 names (5 pages), or rank 0 alone
    assert rows["list-first", 1][4] == "20,480" and rows["list-bcast", 1][4] == "5"
    assert rows["list-first", 4][4] == "5,120"
    posix = stampede("plan", job, "--np", "4", "--set", "checkpoint.size=1MiB")
    assert posix.returncode == 0 and "per prefix" not in posix.stdout
    bad = stampede("plan", job, "--np", "4", *common, "--restore-time", "soon")
    assert bad.returncode == 2 and "--restore-time" in bad.stderr


def test_copies_on_a_posix_target_are_refused_before_any_io(stampede, tmp_path: Path) -> None:
    job = str(REPO / "jobs" / "quickstart.toml")
    target = tmp_path / "ckpt"
    for setting in ("checkpoint.copies=2", "checkpoint.key_prefix=hash"):
        refused = stampede("prepare", job, "--set", f"target.path={target}", "--set", setting)
        said = " ".join(refused.stderr.split())
        assert refused.returncode == 2, refused.stdout + refused.stderr
        key, value = setting.split("=")
        assert f"{key} = " in said and value in said and str(target) in said, said
        assert "this target is not one" in said
        assert not target.exists()   # nothing made
