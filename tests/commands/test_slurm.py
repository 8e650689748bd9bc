"""`stampede slurm` and the slurm/ templates, submitted to a real one-node Slurm.

The cluster (munged, slurmctld, slurmd on 127.0.0.1) is started once for the module and
stopped by PID at the end; without Slurm installed the cluster tests skip, unless
STAMPEDE_REQUIRE_SLURM=1 (CI) makes that a failure.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stampede.cli import main
from tests.helpers import requires
from tests.helpers.jobs import read_archive, small_job
from tests.helpers.slurm_cluster import SlurmCluster, SlurmUnavailable, start
from tests.helpers.verdicts import cli

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "slurm").glob("*.sbatch"))
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    base = Path(tempfile.mkdtemp(prefix="stampede-slurm-"))   # not under pytest's private tmp
    try:
        cluster = start(base)
    except SlurmUnavailable as reason:
        shutil.rmtree(base, ignore_errors=True)
        requires.unavailable(f"no Slurm: {reason}", "SLURM")
    try:
        yield cluster
    finally:
        left = cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    assert not left, f"Slurm left job steps running: {left}"


def slurm_command(cluster: SlurmCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`stampede slurm ...` as a user runs it, with the cluster's SLURM_CONF."""
    return subprocess.run([sys.executable, "-m", "stampede", "slurm", *args], capture_output=True,
                          text=True, env=cluster.env, cwd=cwd, timeout=60)


def finished_job(cluster: SlurmCluster, job_id: str, workdir: Path) -> None:
    """Wait for the job to leave the queue; fail with its output unless it completed."""
    cluster.wait_for_job(job_id, JOB_TIMEOUT_S)
    state = cluster.client("scontrol", "show", "job", job_id).stdout
    output = "\n".join(path.read_text() for path in workdir.glob(f"stampede-*-{job_id}.out"))
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, f"{state}\n{output}"


def sidecar_of(archive: Path, run_id: str) -> dict[str, object]:
    document: dict[str, object] = json.loads((archive.parent / "job.runs" / f"{run_id}.json").read_text())
    return document


@pytest.mark.mpi   # srun starts MPI ranks
def test_restore_job_runs_under_sbatch_and_srun(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    rendered = slurm_command(slurm, tmp_path, str(job), "--ranks-per-node", "2",
                             "--time", "00:05:00", "--output", "restore.sbatch")
    assert rendered.returncode == 0 and rendered.stdout == "", rendered.stderr
    # The job file and overrides can also be given to the script itself.
    submitted = slurm.client("sbatch", "--parsable", str(tmp_path / "restore.sbatch"), str(job),
                             "--set", "run.iterations=1")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    finished_job(slurm, job_id, tmp_path)

    archive = tmp_path / "results" / "job.csv"
    rows = read_archive(archive)
    assert {row["layout"] for row in rows} == {"shared", "sharded"}
    assert {row["valid"] for row in rows} == {"true"}
    assert {row["nranks"] for row in rows} == {"2"}
    assert {row["iterations"] for row in rows} == {"1"}
    assert {row["slurm_job_id"] for row in rows} == {job_id}
    assert {row["hosts"] for row in rows} == {slurm.host}
    (run_id,) = {row["run_id"] for row in rows}
    variables = sidecar_of(archive, run_id)["slurm"]
    assert isinstance(variables, dict) and variables["SLURM_JOB_ID"] == job_id


@pytest.mark.mpi   # srun starts MPI ranks
def test_sweep_job_appends_every_rank_count_to_one_archive(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["sharded"]}, run={"iterations": 1, "warmup": 0})
    submitted = slurm_command(slurm, tmp_path, str(job), "--ranks", "1,2", "--time", "00:05:00",
                              "--clean", "--submit")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit(), submitted.stdout
    finished_job(slurm, job_id, tmp_path)

    archive = tmp_path / "results" / "job.csv"
    rows = read_archive(archive)
    assert sorted({row["nranks"] for row in rows}) == ["1", "2"]
    assert len({row["run_id"] for row in rows}) == 2
    assert {row["valid"] for row in rows} == {"true"}
    assert {row["slurm_job_id"] for row in rows} == {job_id}
    assert not (tmp_path / "ckpt" / "stampede-manifest.json").exists()   # --clean ran


@pytest.mark.mpi   # srun starts MPI ranks
def test_an_assess_sweep_restores_and_saves_under_sbatch(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`stampede assess --sbatch`'s script (2 counts: the node has 2 CPUs): each count
    prepares, runs and saves (into TARGET-saves), the exit trap cleans both targets, and
    the archive's report names a save layout as well as a restore one."""
    job = small_job(tmp_path, run={"iterations": 1, "warmup": 0})
    cli("assess", str(job), "--ranks", "1,2", "--budget", "5min", "--sbatch", "assess.sbatch",
        cwd=tmp_path)
    submitted = slurm.client("sbatch", "--parsable", str(tmp_path / "assess.sbatch"))
    assert submitted.returncode == 0, submitted.stderr
    finished_job(slurm, submitted.stdout.strip().split(";")[0], tmp_path)

    archive = tmp_path / "results" / "job.csv"
    rows = read_archive(archive)
    for op in ("restore", "save"):
        completions = [row for row in rows if row["op"] == op]
        assert sorted(int(row["nranks"]) for row in completions) == [1, 1, 2, 2]
        assert {row["valid"] for row in completions} == {"true"}
    for target in ("ckpt", "ckpt-saves"):   # the exit trap cleaned both
        assert not [path for path in (tmp_path / target).rglob("*") if path.is_file()], target
    cli("html", str(archive), "-o", "report.html", cwd=tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<b>restore: use " in page and "<b>save: use " in page


@pytest.mark.mpi   # srun starts MPI ranks
def test_failing_step_ends_the_job_with_one_message(slurm: SlurmCluster, tmp_path: Path) -> None:
    # prepare fails on rank 0 only (its target cannot be created): the step must abort
    # and the job fail promptly, with stampede's message in its output, not hang.
    (tmp_path / "a-file").write_text("")
    job = small_job(tmp_path, target={"path": str(tmp_path / "a-file" / "ckpt")})
    submitted = slurm_command(slurm, tmp_path, str(job), "--ranks-per-node", "2", "--submit")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    slurm.wait_for_job(job_id, JOB_TIMEOUT_S)
    assert "JobState=FAILED" in slurm.client("scontrol", "show", "job", job_id).stdout
    output = (tmp_path / f"stampede-job-{job_id}.out").read_text()
    assert "stampede prepare: error: " in output and "cannot create it" in output
    assert not (tmp_path / "results").exists()


@pytest.mark.mpi   # srun starts MPI ranks
def test_render_prints_the_script_and_submits_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    known = slurm.job_ids()
    rendered = slurm_command(slurm, tmp_path, str(job), "--nodes", "1", "--ranks-per-node", "2",
                             "--set", "run.iterations=3", "--partition", "debug")
    assert rendered.returncode == 0, rendered.stderr
    script = rendered.stdout
    assert script.startswith("#!/bin/bash\n")
    for directive in ("--nodes=1", "--ntasks-per-node=2", "--partition=debug", f"--chdir={tmp_path}"):
        assert f"#SBATCH {directive}\n" in script
    assert f"PYTHON={shlex.quote(sys.executable)}\n" in script
    assert 'srun --mpi=pmi2 --kill-on-bad-exit=1 "$PYTHON" -m mpi4py -m stampede' in script
    assert "--set run.iterations=3" in script
    assert slurm.queue() == ""
    assert slurm.job_ids() == known


def test_slurm_module_imports_only_the_stdlib() -> None:
    # stampede.commands.slurm is imported on every CLI start, on every rank.
    loaded = subprocess.run([sys.executable, "-c", "import sys, stampede.commands.slurm; print(' '.join("
                             "name for name in sys.modules if name.split('.')[0] in "
                             "('numpy', 'rich', 'mpi4py', 'fsspec', 'torch')))"],
                            capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "", loaded.stdout + loaded.stderr


def test_python_m_mpi4py_runs_stampede() -> None:
    # The templates launch every step this way; it must reach stampede's own parser.
    shown = subprocess.run([sys.executable, "-m", "mpi4py", "-m", "stampede", "run", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "usage: stampede run" in shown.stdout


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda path: path.name)
def test_every_sbatch_line_is_documented(template: Path) -> None:
    lines = template.read_text().splitlines()
    directives = [number for number, line in enumerate(lines)
                  if line.startswith("#SBATCH") or line == "${partition_directive}"]
    assert directives
    for number in directives:
        above = lines[number - 1]
        assert above.startswith("# ") and not above.startswith("#SBATCH"), lines[number]
    assert "--mpi=pmix" not in template.read_text()


@pytest.mark.parametrize("extra", [[], ["--ranks", "1,2,4:2", "--nodes", "2", "--clean"]],
                         ids=["restore", "sweep"])
def test_rendered_script_is_valid_bash(tmp_path: Path, extra: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    job = small_job(tmp_path)
    assert main(["slurm", str(job), "--set", "target.path=/a dir/with 'quotes'", *extra]) == 0
    script = capsys.readouterr().out
    assert not re.search(r"\$\{[a-z]", script), "a placeholder was left unfilled"
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    if extra:
        assert 'STEPS="1:1 2:1 4:2"' in script and "#SBATCH --ntasks-per-node=2\n" in script


@pytest.mark.parametrize("args, message", [
    (["--nodes", "0"], "--nodes '0': must be a whole number >= 1"),
    (["--ranks-per-node", "two"], "--ranks-per-node 'two': must be a whole number >= 1"),
    (["--ranks", "1,0"], "'0' is not a rank count >= 1"),
    (["--ranks", "1,1"], "a step is repeated"),
    (["--ranks", "8:3", "--nodes", "2"], "needs 3 nodes"),
    (["--ranks", "8", "--ranks-per-node", "2"], "needs 4 nodes"),
    (["--time", "soon"], "--time 'soon': not a Slurm time limit"),
    (["--partition", "a b"], "not a partition name"),
    (["--set", "run.cache=lukewarm"], "run.cache"),
])
def test_bad_input_is_one_message_and_exit_2(tmp_path: Path, args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    job = small_job(tmp_path)
    assert main(["slurm", str(job), *args, "--submit"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("stampede slurm: error: ") and message in captured.err
    assert captured.err.count("error:") == 1


def test_submit_without_sbatch_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))   # no sbatch on it
    assert main(["slurm", str(small_job(tmp_path)), "--submit"]) == 2
    assert "--submit needs sbatch" in capsys.readouterr().err


def test_the_old_ntasks_per_node_still_works_and_warns(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    job = small_job(tmp_path)
    assert main(["slurm", str(job), "--ntasks-per-node", "2", "--nodes", "2"]) == 0
    captured = capsys.readouterr()
    assert "#SBATCH --ntasks-per-node=2\n" in captured.out and "#SBATCH --nodes=2\n" in captured.out
    assert "slurm JOB --nodes 2 --ranks-per-node 2 " in re.sub(r"slurm \S+", "slurm JOB",
                                                               captured.out)   # as recorded
    assert captured.err == ("stampede: --ntasks-per-node is now --ranks-per-node for slurm; the "
                            "old name goes in the next release\n")
