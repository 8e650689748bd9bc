"""What every timed phase begins with (stampede.run.layout.timed_phase, a restore's and a
save's alike): Python's garbage collector held off inside it, since a collection is a
pause of the rank's own, not the storage's (counted under a real mpiexec by a gc callback
in each rank, tests/helpers/gc_watch.py, that looks at the stack: a restore and a save of
thousands of small ops allocate enough for many collections, and every one runs between
the phases); and an object store's client as a restarted job's, its adaptive retries'
rate limiter off whatever an earlier phase's 503s did to it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.backends import open_backend
from stampede.mpi import SingleRank
from stampede.run.layout import Phases, timed_phase
from stampede.spec import build_job
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


def test_each_phase_begins_with_a_new_processs_object_store_client(tmp_path: Path) -> None:
    # no request is made: a client's retry state only (nothing listens on port 9)
    target = "s3://bucket/ck"
    backend = open_backend(target, {"endpoint_url": "http://127.0.0.1:9",
                                    "retry_mode": "adaptive", "anon": True})
    limiter = backend.retry.limiter   # type: ignore[attr-defined]
    limiter.sent(0.0)
    limiter.sent(0.5)
    backend.retry.after_failure(1, True, 1.0, lambda: 0.0)   # type: ignore[attr-defined]
    assert limiter.enabled and limiter.wait_s(1.0) > 0       # the warm-up's 503 engaged it
    spec = build_job("phase", str(tmp_path / "phase.toml"), {
        "target": {"path": target, "storage_options": {"endpoint_url": "http://127.0.0.1:9"}},
        "checkpoint": {"size": "1MiB", "layout": ["sharded"]},
        "archive": {"path": str(tmp_path / "phase.csv")}})
    phases = Phases()
    with timed_phase(SingleRank(), spec, backend, "sharded", 0, phases) as origin:
        fresh = backend.retry.limiter   # type: ignore[attr-defined]
        assert not fresh.enabled and fresh.wait_s(1.0) == 0.0
        assert not gc.isenabled()
    assert phases.origins == {0: origin}
    assert gc.isenabled()
