"""Python's garbage collector never runs inside a timed phase (stampede.run.layout's
timed_phase): a collection is a pause of the rank's own, not the storage's. Counted under
a real mpiexec by a gc callback in each rank (tests/helpers/gc_watch.py) that looks at the
stack: a restore and a save of thousands of small ops allocate enough for many
collections, and every one of them runs between the phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import find_mpiexec
from tests.helpers.jobs import RUN_TIMEOUT_S, small_job

pytestmark = pytest.mark.mpi

RANKS = 2
REPO = Path(__file__).resolve().parents[2]


def _watched(tmp_path: Path, *args: str) -> list[dict[str, int]]:
    """stampede ARGS under mpiexec, each rank's collections counted (inside, outside)."""
    watch = tmp_path / f"gc-{args[0]}"
    watch.mkdir()
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    env = {**os.environ, "GC_WATCH_DIR": str(watch),
           "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([mpiexec, "-n", str(RANKS), sys.executable, "-m",
                           "tests.helpers.gc_watch", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads((watch / f"rank-{rank}.json").read_text()) for rank in range(RANKS)]


@pytest.mark.parametrize("command", ["run", "save"])
def test_no_collection_runs_inside_a_timed_phase(tmp_path: Path, command: str) -> None:
    # 4 MiB a rank in 1 KiB blocks: 4,096 reads or writes a rank and iteration, each a
    # sample kept, far past the collector's first threshold (700 allocations)
    job = small_job(tmp_path, checkpoint={"size": "8MiB", "layout": ["sharded"],
                                          "block_size": "1KiB"},
                    run={"iterations": 2, "warmup": 1, "verify": "none"})
    if command == "run":
        _watched(tmp_path, "prepare", str(job))
    counts = _watched(tmp_path, command, str(job))
    assert [rank["inside"] for rank in counts] == [0] * RANKS
    # the watch saw collections: three iterations' collections at least, before each
    assert all(rank["outside"] >= 3 for rank in counts)
