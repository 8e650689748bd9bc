"""The start-up stampede (T_pod_init) and stampede's own import cost on worker ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from stampede.run.startup import HEAVY_MODULES, RUN_MODULES, process_start_ns
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, small_job

pytestmark = pytest.mark.mpi

# What a worker rank of run never imports: rank 0's archive, report and facts (the file
# system, the NFS counters), what only some jobs need (--from, an existing checkpoint,
# mlperf's workloads, --trace, histogram mode, prepare), the statistics' records and the
# manifest (rank 0 checks it), and the stdlib modules only they pull in; shutil, which
# argparse's formatter imports unless given a width (stampede.cli gives it one). (numpy
# imports textwrap: not listed.)
NOT_ON_THE_WORKER_PATH = (
    "stampede.results.rows", "stampede.results.archive", "stampede.present.report",
    "stampede.results.trace", "stampede.results.histogram", "stampede.existing.relayout",
    "stampede.existing.scan", "stampede.checkpoint.mlperf", "stampede.checkpoint.prepare",
    "stampede.sysinfo", "stampede.results.summaries", "stampede.checkpoint.manifest", "rich",
    "csv", "uuid", "statistics", "difflib", "traceback", "shutil", "socket")


def test_startup_phases_per_rank_archived(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "startup.csv"
    result = stampede("startup", "--np", "2", "--repeat", "2", "--archive", str(archive),
                      "--import", "json")
    assert result.returncode == 0, result.stderr
    assert "Start-up (T_pod_init): last rank ready after" in result.stdout
    rows = read_archive(archive)
    assert len({row["run_id"] for row in rows}) == 2
    by_op = {row["op"]: row for row in rows if row["run_id"] == rows[0]["run_id"]}
    assert set(by_op) == {"interpreter", "import", "mpi_init", "startup", "barrier", "allreduce"}
    assert all(row["count"] == "2" and row["nranks"] == "2" for op, row in by_op.items()
               if op not in ("barrier", "allreduce"))
    # T_barrier_sync: COLLECTIVE_REPEATS timed collectives on every rank
    assert by_op["barrier"]["count"] == by_op["allreduce"]["count"] == str(2 * 10)
    assert 0 < float(by_op["barrier"]["lat_p50_s"]) < 1
    startup = by_op["startup"]
    # every phase lies inside the whole: launch -> MPI ready
    assert float(startup["time_to_last_rank_s"]) >= max(
        float(by_op[op]["lat_max_s"]) for op in ("interpreter", "import", "mpi_init"))
    assert float(startup["first_done_s"]) > 0
    assert "/proc/self/stat" not in startup["warnings"]  # --np sets STAMPEDE_LAUNCH_NS
    sidecar = json.loads((tmp_path / "startup.runs" / f"{rows[0]['run_id']}.json").read_text())
    assert sidecar["imports"] == ["json"]
    # stampede's own imports stay lazy on every rank that does not print the report
    assert [record["heavy_modules"] for record in sidecar["ranks"][1:]] == [[]]


def test_startup_under_a_plain_launcher_falls_back_to_the_process_start(stampede,
                                                                        tmp_path: Path) -> None:
    archive = tmp_path / "startup.csv"
    result = stampede("startup", "--archive", str(archive), np=2)
    assert result.returncode == 0, result.stderr
    rows = read_archive(archive)
    assert "launch time from /proc/self/stat" in rows[0]["warnings"]
    assert 0 < float(next(r for r in rows if r["op"] == "startup")["lat_max_s"]) < 60


def test_a_missing_import_is_a_usage_error(stampede, tmp_path: Path) -> None:
    result = stampede("startup", "--import", "no_such_module_here", "--archive",
                      str(tmp_path / "s.csv"), np=2)
    assert result.returncode == 2
    assert "--import no_such_module_here: cannot import it" in result.stderr
    assert result.stderr.count("error:") == 1


def test_run_modules_import_nothing_heavy() -> None:
    code = (f"import sys; import {', '.join(RUN_MODULES)}; "
            f"print([m for m in {HEAVY_MODULES + NOT_ON_THE_WORKER_PATH!r} if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_process_start_is_in_the_recent_past() -> None:
    import time
    started = process_start_ns()
    assert 0 < time.time_ns() - started < 3600 * 10**9


def test_a_run_imports_no_other_command_module() -> None:
    code = ("import sys; from stampede.cli import build_parser; "
            "from stampede.commands import COMMANDS; "
            "build_parser(['run', 'job.toml']); "
            "print([m for m in COMMANDS.values() if m in sys.modules "
            "and m != COMMANDS['run']]); "
            "build_parser(['--help']); "
            "print(all(m in sys.modules for m in COMMANDS.values()))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True"]



def test_a_worker_rank_of_run_imports_only_its_path(tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["sharded"]},
                    run={"iterations": 1, "warmup": 0})
    # every rank writes the modules it loaded, at its exit, to modules.<rank>
    code = ("import atexit, runpy, sys\n"
            "def written():\n"
            "    from stampede.launcher import launcher_rank\n"
            "    with open(f'modules.{launcher_rank()}', 'w') as out:\n"
            "        out.write('\\n'.join(sys.modules))\n"
            "atexit.register(written)\n"
            "runpy.run_module('stampede', run_name='__main__', alter_sys=True)\n")
    for command in ("prepare", "run"):
        ran = subprocess.run([find_mpiexec() or "mpiexec", "-n", "2", sys.executable, "-c", code,
                              command, str(job)], capture_output=True, text=True,
                             timeout=RUN_TIMEOUT_S, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
    root, worker = ((tmp_path / f"modules.{rank}").read_text().split() for rank in (0, 1))
    assert "stampede.run.layout" in worker and "stampede.results.rows" in root
    assert [name for name in NOT_ON_THE_WORKER_PATH if name in worker] == []
    # the modules `stampede startup` times are those a worker of run loads
    assert {name for name in worker if name.startswith("stampede")} == loaded_by(RUN_MODULES)


def loaded_by(modules: tuple[str, ...]) -> set[str]:
    """stampede's modules a fresh interpreter holds after importing `modules`."""
    code = (f"import sys; import {', '.join(modules)}; "
            "print(' '.join(name for name in sys.modules if name.startswith('stampede')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    return set(result.stdout.split())
