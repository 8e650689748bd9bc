"""`stampede assess`: probed, planned to its budget, swept through the real mpiexec and
reported; the report's verdict is what `stampede project` and `stampede mttr` say by hand
on the same archive, the plan is said in it, and bad input is refused before any run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stampede import cli as stampede_cli
from stampede.commands.assess import runnable_counts
from stampede.sbatch import parse_steps
from stampede.spec import load_job
from tests.helpers.jobs import read_archive, small_job
from tests.helpers.verdicts import hand_best, hand_verdict, saved_with, verdict_of

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.mpi
def test_the_assessment_is_what_project_and_mttr_say_by_hand(assessed: Path) -> None:
    archive = assessed.with_suffix(".csv")
    page = assessed.read_text()
    layout, mttr_s = verdict_of(page)
    hand_layout, hand_mttr_s = hand_verdict(archive)
    assert layout == hand_layout
    assert mttr_s == pytest.approx(hand_mttr_s, rel=1e-3)
    assert "probe at 1 rank(s)" in page and "plan: " in page and "budget 60s" in page
    assert "save of 1 iteration" in page and "layouts shared, sharded" in page
    rows = read_archive(archive)
    for op in ("restore", "save"):   # each count restored, then saved
        completions = [row for row in rows if row["op"] == op]
        assert sorted({int(row["nranks"]) for row in completions}) == [1, 2, 3]
        assert {row["layout"] for row in completions} == {"shared", "sharded"}
        assert all(row["valid"] == "true" for row in completions)
    assert saved_with(page) == hand_best(archive, phase="save")
    ckpt = archive.parent / "ckpt"   # small_job's target.path: the checkpoint was removed
    assert not (ckpt / "stampede-manifest.json").exists()
    saves = archive.parent / "ckpt-saves"   # the saves' own target: cleaned too
    assert not (saves / "stampede-saves.json").exists()
    assert not [path for path in saves.rglob("*") if path.is_file()]
    assert not [path for path in ckpt.rglob("*") if path.is_file()]


def test_counts_the_job_cannot_run_are_scaled_by_its_replicas() -> None:
    spec = load_job(str(JOBS / "strategies.toml"), [])
    counts, note = runnable_counts(spec, parse_steps("1,2,4"))
    assert counts == (2, 4, 8) and "planned as 2,4,8" in note
    assert runnable_counts(spec, parse_steps("2,4"))[1] == ""


def test_bad_input_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    job = small_job(tmp_path)
    base = ["assess", str(job), "--ranks", "1,2,3"]
    assert stampede_cli.main([*base, "--budget", "soon"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert stampede_cli.main([*base[:3], "8:2,16:4"]) == 2
    assert "--sbatch" in capsys.readouterr().err
    (tmp_path / "taken.csv").write_text("")
    assert stampede_cli.main([*base, "-o", str(tmp_path / "taken.html")]) == 2
    assert "exists already" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "results").exists()


def test_sbatch_renders_the_sweep_without_running_it(tmp_path: Path) -> None:
    script = tmp_path / "assess.sbatch"
    assert stampede_cli.main(["assess", str(JOBS / "strategies.toml"), "--ranks", "1,2,4",
                              "--budget", "10min", "--sbatch", str(script)]) == 0
    text = script.read_text()
    assert "--time=00:10:00" in text and "2:1 4:1 8:1" in text
    # each count saves what save writes of strategies' layouts, after its run
    assert ("""SAVE=(--set 'checkpoint.layout=["shared", "replicated", "striped", """
            """"metadata-first"]' --set 'target.path="stampede-ckpt-saves"')""") in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert stampede_cli.main(["assess", str(JOBS / "strategies.toml"), "--ranks", "1,2,4",
                              "--no-save", "--sbatch", str(script)]) == 0
    assert "SAVE=()" in script.read_text()
