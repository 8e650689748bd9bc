"""`stampede assess`: probed, planned to its budget, swept through the real mpiexec and
reported; the report's verdict is what `stampede project` and `stampede mttr` say by hand
on the same archive, the plan is said in it, and bad input is refused before any run."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
from pathlib import Path

import pytest

from stampede import cli as stampede_cli
from stampede.commands.assess import plan_saves, runnable_counts, saves_target
from stampede.sbatch import parse_steps
from stampede.spec import load_job
from tests.helpers.jobs import read_archive, small_job
from tests.helpers.processes import descendants
from tests.helpers.s3server import S3Server
from tests.helpers.verdicts import (
    DURATION,
    cli,
    hand_best,
    hand_verdict,
    mttr_total,
    saved_with,
    verdict_of,
)

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.mpi
def test_the_assessment_is_what_project_and_mttr_say_by_hand(assessed: Path) -> None:
    archive = assessed.with_suffix(".csv")
    page = assessed.read_text()
    layout, mttr_s = verdict_of(page)
    hand_layout, hand_mttr_s = hand_verdict(archive)
    assert layout == hand_layout
    assert mttr_s == hand_mttr_s                # the same float, printed the same way
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


def at_target_rows(page: str) -> dict[str, list[str]]:
    """The verdict's "Restore at the target" table: layout -> its cells."""
    section = page[page.index("Restore at the target"):page.index("What the storage must")]
    rows = re.findall(r"<tr>(.*?)</tr>", section)
    cells = [[html.unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", row)] for row in rows]
    return {row[0]: row[1:] for row in cells if row}


@pytest.mark.mpi
def test_a_named_workload_is_what_project_and_mttr_say_by_hand(assessed: Path,
                                                               tmp_path: Path) -> None:
    """Llama 3 70B at 16,384 ranks, 8 per node: the verdict's first line names it, and
    every layout's time to last rank at the target, and T_MTTR there, are `stampede
    project` and `stampede mttr` given the same workload by hand."""
    archive = assessed.with_suffix(".csv")
    report = tmp_path / "llama.html"
    workload = ["--target-model", "llama3-70b", "--target-ranks-per-node", "8"]
    printed = cli("report", str(archive), "--html", str(report), *workload, cwd=tmp_path).stdout
    page = report.read_text()
    line = ("Llama 3 70B (TP 8 x PP 1 x DP 2048, ZeRO 3), 918.7 GiB, 16384 ranks on 2048 node(s) "
            "of 8, 57.42 MiB per rank, 2 file(s) per rank")
    assert f"<b>Workload at the target:</b> {line}" in page
    assert f"workload: {line}" in printed
    projected = cli("project", str(archive), "--target-ranks", "16384", *workload,
                    cwd=tmp_path).stdout
    assert f"workload: {line}" in projected
    by_hand = dict(re.findall(rf"layout ([\w-]+) .*?at 16384 ranks \(2048 nodes of 8\): time to "
                              rf"last rank ({DURATION})", projected, re.S))
    rows = at_target_rows(page)
    assert set(rows) == set(by_hand) == {"shared", "sharded"}
    for layout, cells in rows.items():
        assert cells[0] == by_hand[layout], (layout, cells, projected)
        hand_mttr = mttr_total(str(archive), "--target-ranks", "16384", "--layout", layout,
                               *workload, cwd=tmp_path)
        assert cells[-1] == hand_mttr               # T_MTTR at the workload
    layout, _ = verdict_of(page)
    at_target = re.search(rf"T_MTTR at 16384 ranks \(load term projected[^)]*\): ({DURATION})",
                          page)
    assert at_target and at_target.group(1) == rows[layout][-1]
    assert "What the storage must deliver for T_MTTR ≤ 60 s" in page
    assert "e+" not in re.sub(r"<[^>]+>", "", page[page.index('id="verdict"'):
                                                   page.index("</section>")])


@pytest.mark.mpi
def test_without_a_named_workload_the_target_restores_the_jobs_checkpoint(assessed: Path) -> None:
    """No workload named: the projections and T_MTTR at the target both take the job's
    checkpoint as archived (T_MTTR once loaded the worked example's 30 GB per rank through
    a projection of the job's few KiB: a day and a half beside a sub-second restore)."""
    archive = assessed.with_suffix(".csv")
    page = assessed.read_text()
    assert "<b>Workload at the target:</b> the job&#x27;s checkpoint as archived" in page
    layout, _ = verdict_of(page)
    at_target = re.search(rf"T_MTTR at 16384 ranks \(load term projected[^)]*\): ({DURATION})",
                          page)
    assert at_target, page[:3000]
    assert at_target.group(1) == mttr_total(str(archive), "--target-ranks", "16384",
                                            cwd=archive.parent)
    assert at_target.group(1) == at_target_rows(page)[layout][-1]


def test_counts_the_job_cannot_run_are_scaled_by_its_replicas() -> None:
    spec = load_job(str(JOBS / "strategies.toml"), [])
    counts, note = runnable_counts(spec, parse_steps("1,2,4"))
    assert counts == (2, 4, 8) and "planned as 2,4,8" in note
    assert runnable_counts(spec, parse_steps("2,4"))[1] == ""


@pytest.mark.parametrize(("sections", "no_save", "layouts", "left_out"), [
    ({}, False, ("shared", "sharded"), ""),
    ({}, True, (), "--no-save"),
    ({"checkpoint": {"layout": ["list-first", "list-bcast"], "replicas": 2}}, False, (),
     "the job has no layout that save writes"),
    ({"checkpoint": {"format": "hdf5"}}, False, (), "shared: save refuses it ("),
    ({"target": {"path": "s3://stampede-test"}}, False, (), "is a bucket's root"),
])
def test_the_counts_save_what_save_writes_unless_it_refuses(
        tmp_path: Path, sections: dict[str, dict[str, object]], no_save: bool,
        layouts: tuple[str, ...], left_out: str) -> None:
    job = small_job(tmp_path, **sections)
    saving = plan_saves(argparse.Namespace(no_save=no_save), load_job(str(job), []), (1, 2, 3))
    assert saving.layouts == layouts and left_out in saving.left_out and bool(left_out) == bool(
        saving.left_out)
    assert saving.target == (f"{tmp_path / 'ckpt'}-saves" if layouts else "")
    assert ("save" in saving.steps) == bool(layouts)


def test_on_s3_a_layout_save_would_refuse_at_some_count_is_left_out(
        tmp_path: Path, s3_env: S3Server) -> None:
    """shared on S3 without save.part_size: one writer at 1 rank, several at 2 (a multipart
    upload): left out, said; sharded saved, into PREFIX-saves."""
    job = small_job(tmp_path, target={"path": f"s3://{s3_env.bucket}/assess",
                                      "storage_options": {"endpoint_url": s3_env.endpoint_url}})
    saving = plan_saves(argparse.Namespace(no_save=False), load_job(str(job), []), (1, 2, 3))
    assert saving.layouts == ("sharded",) and saving.object_store
    assert saving.target == f"s3://{s3_env.bucket}/assess-saves"
    assert saving.left_out.startswith("shared: save refuses it (") and \
        "takes a multipart upload (save.part_size)" in saving.left_out


@pytest.mark.parametrize(("target", "saves"), [
    ("ckpt", "ckpt-saves"), ("ckpt/", "ckpt-saves"), ("ckpt/.", "ckpt-saves"),
    ("/scratch/me/ckpt", "/scratch/me/ckpt-saves"), ("s3://bucket/a/b/", "s3://bucket/a/b-saves"),
    ("s3://bucket", ""), ("s3://bucket/", ""),
])
def test_the_saves_go_beside_the_target_never_into_another_bucket(target: str, saves: str) -> None:
    assert saves_target(target) == saves


def test_bad_input_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                             ) -> None:
    job = small_job(tmp_path)
    base = ["assess", str(job), "--ranks", "1,2,3"]
    assert stampede_cli.main([*base, "--budget", "soon"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert stampede_cli.main([*base[:3], "8:2,16:4"]) == 2
    assert "--sbatch" in capsys.readouterr().err
    assert stampede_cli.main([*base[:3], "1,2"]) == 2   # no projection from 2 counts
    assert capsys.readouterr().err.splitlines()[0] == (
        "stampede assess: error: --ranks 1,2: 2 rank count(s); the projection to "
        "--target-ranks 16384 needs at least 3")
    (tmp_path / "taken.csv").write_text("")
    assert stampede_cli.main([*base, "-o", str(tmp_path / "taken.html")]) == 2
    assert "exists already" in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize("where", ["ckpt", "ckpt-saves"])
def test_a_target_that_holds_another_jobs_saves_is_refused_and_left_as_it_was(
        stampede, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """assess cleans its targets when it ends: it starts on empty ones only (another job's
    saves on the job's target once went with the probe's clean-up)."""
    job = small_job(tmp_path)
    (tmp_path / "other").mkdir()
    other = small_job(tmp_path / "other", target={"path": str(tmp_path / where)},
                      checkpoint={"layout": ["sharded"]}, run={"iterations": 1, "warmup": 0})
    assert stampede("save", str(other)).returncode == 0
    saved = sorted(path for path in (tmp_path / where).rglob("*") if path.is_file())
    assert saved
    report = tmp_path / "report.html"
    assert stampede_cli.main(["assess", str(job), "--ranks", "1,2,3", "-o", str(report)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    versions = [path for path in saved if path.name != "stampede-lock"]   # not the save's lock
    assert f"target.path = '{tmp_path / where}' holds {len(versions)} file(s)" in said
    assert f"stampede clean {job} --set target.path={tmp_path / where}" in said
    assert sorted(path for path in (tmp_path / where).rglob("*") if path.is_file()) == saved
    assert not report.exists() and not report.with_suffix(".csv").exists()


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


@pytest.mark.mpi
def test_sigterm_stops_the_running_step_and_cleans_up_as_ctrl_c_does(tmp_path: Path) -> None:
    """`timeout`, `kill` and batch systems send SIGTERM: assess passes it to the step it
    waits for (whose ranks stop at their iteration's end), waits for it, removes what it
    wrote, and exits 143. It once exited at once, its mpiexec writing on as an orphan and
    the checkpoint and saves left behind."""
    import os
    import signal
    import sys
    import time

    job = small_job(tmp_path, checkpoint={"size": "8MiB", "layout": ["sharded"]},
                    run={"iterations": 200, "warmup": 0, "verify": "none"})
    assess = subprocess.Popen([sys.executable, "-m", "stampede", "assess", str(job), "--ranks",
                               "1,2,3", "--budget", "10min", "-o", str(tmp_path / "r.html")],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120    # a step of its own is running: its child
        while not descendants(assess.pid):
            assert assess.poll() is None and time.monotonic() < deadline, assess.communicate()
            time.sleep(0.05)
        stepping = descendants(assess.pid)
        os.kill(assess.pid, signal.SIGTERM)   # to assess alone, not its process group
        _, err = assess.communicate(timeout=180)
    finally:
        if assess.poll() is None:
            os.killpg(assess.pid, signal.SIGKILL)
            assess.communicate()
    assert assess.returncode == 128 + signal.SIGTERM, err
    assert not [pid for pid in stepping if os.path.exists(f"/proc/{pid}")], "a step outlived it"
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
    assert not (tmp_path / "ckpt-saves").exists()
    assert "Traceback" not in err

