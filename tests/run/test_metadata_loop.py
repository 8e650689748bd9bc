"""The compiled metadata loop (stampede/oploop.c through stampede.run.metadata_loop): a
rank's pass of stat, open and close ops run in one C call must leave what the pattern's
Python loops leave, sample for sample: the same ops on the same files in the same order,
the same failures with the same messages, the same handles left open for the untimed
closes, the same end at the deadline. Each case runs both ways on real files (the Python
loops: the same setup without its program), in process; then under a real mpiexec, with
the sidecar saying which loop ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stampede import oploop
from stampede.backends import open_backend
from stampede.backends.posix import PosixBackend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import Extent, RankPlan
from stampede.mpi import SingleRank
from stampede.ops import OP_CODE
from stampede.run import metadata_loop
from stampede.run.outcome import PhaseOutcome
from stampede.run.pattern import run_pattern
from stampede.run.setup import RankSetup
from stampede.run.where import Where
from tests.helpers import requires
from tests.helpers.jobs import read_archive, sidecars, small_job

NAMES = {code: name for name, code in OP_CODE.items()}
NO_DEADLINE = 2**62


@pytest.fixture(autouse=True)
def built() -> None:
    if oploop.run_steps is None:
        requires.unavailable("the compiled metadata loop was not built (pip install -e . "
                             "with a C compiler builds stampede/_oploop*.so)", "OPLOOP")


def _setup(tmp_path: Path, ops: tuple[str, ...], order: str, names: list[str],
           compiled: bool, follow_links: bool = True, count: int = 2) -> RankSetup:
    backend = PosixBackend(str(tmp_path))
    extents = tuple(Extent(name, 0, 1) for name in names)
    plan = RankPlan(rank=3, nranks=4, layout="sharded", ops=ops, extents=extents,
                    block_bytes=4096, stat_count=count, open_count=count, hold=extents[0],
                    order=order)
    paths = {name: backend.path(name) for name in names}
    program = metadata_loop.build(plan, paths, backend, False, follow_links)
    assert program is not None
    return RankSetup(plan=plan, backend=backend, paths=paths, buffer=AlignedBuffer(4096),
                     direct=False, world=SingleRank(), where=Where(),
                     follow_links=follow_links, program=program if compiled else None)


def _run(setup: RankSetup, deadline_ns: int = NO_DEADLINE
         ) -> tuple[list[tuple[str, str, int]], PhaseOutcome, list[int]]:
    """(op, file, ok) of each sample but the restore row, the outcome, and the fds open in
    this process after the pattern (its untimed closes must leave none)."""
    log: list[tuple[int, int, int, int, int, int]] = []
    before = set(os.listdir("/proc/self/fd"))
    assert setup.where is not None
    outcome = run_pattern(setup, 0, 0, deadline_ns, 0.0, log)
    left = sorted(set(os.listdir("/proc/self/fd")) - before)
    files = {file_id: relpath for relpath, file_id in setup.where.ids.items()}
    samples = [(NAMES[code], files[setup.where.rows[index][1]], ok)
               for index, (_, code, start, stop, _, ok) in enumerate(log[:-1])]
    stamps = [(start, stop) for _, _, start, stop, _, _ in log[:-1]]
    assert all(start <= stop for start, stop in stamps)                  # each op stamped
    assert all(a[1] <= b[0] for a, b in zip(stamps, stamps[1:]))         # one after another
    restore_stop = log[-1][3]   # the rank's restore ends at its pass's last op, not after
    assert restore_stop == stamps[-1][1] if setup.program is not None else \
        restore_stop >= stamps[-1][1]
    return samples, outcome, [int(fd) for fd in left]


@pytest.mark.parametrize("order", ["op", "file"])
@pytest.mark.parametrize("ops", [("stat", "open", "close"), ("open", "close"), ("stat",),
                                 ("close", "open", "stat", "close")])
def test_the_compiled_pass_leaves_what_the_python_loops_leave(tmp_path: Path, order: str,
                                                               ops: tuple[str, ...]) -> None:
    names = ["a.bin", "missing.bin", "b.bin"]   # the second fails: no stat, no open, no close
    (tmp_path / "a.bin").write_bytes(b"a")
    (tmp_path / "b.bin").write_bytes(b"b")
    python = _run(_setup(tmp_path, ops, order, names, compiled=False))
    compiled = _run(_setup(tmp_path, ops, order, names, compiled=True))
    assert compiled[0] == python[0]
    assert compiled[1].errors == python[1].errors > 0
    assert compiled[1].messages == python[1].messages
    first = next(op for op in ops if op != "close")   # a close of a failed open is no op
    assert f"rank 3: {first} missing.bin: No such file or directory" in compiled[1].messages
    assert compiled[1].ops == python[1].ops
    assert compiled[2] == python[2] == []    # every handle closed, timed or not
    stats, opens, closes = (sum(1 for op, _, _ in compiled[0] if op == name)
                            for name in ("stat", "open", "close"))
    assert stats == 3 * 2 * ops.count("stat")
    assert opens == 3 * 2 * ops.count("open")
    assert closes == (2 * 2 if "open" in ops else 0)   # the two files' opens that succeeded


def test_a_refused_link_and_the_deadline_end_alike(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(b"r")
    (tmp_path / "link.bin").symlink_to(tmp_path / "real.bin")
    names = ["real.bin", "link.bin", "real.bin2"]
    (tmp_path / "real.bin2").write_bytes(b"s")
    ops = ("open", "close")
    python = _run(_setup(tmp_path, ops, "file", names, False, follow_links=False))
    compiled = _run(_setup(tmp_path, ops, "file", names, True, follow_links=False))
    assert compiled[0] == python[0]
    assert compiled[1].messages == python[1].messages == [
        "rank 3: open link.bin: a symbolic link, not the file prepare wrote (refused, as a "
        "missing file is)"] * 2
    # a deadline already past: the first open that succeeds ends the pass, its handle then
    # closed untimed
    python = _run(_setup(tmp_path, ops, "op", names, False), deadline_ns=0)
    compiled = _run(_setup(tmp_path, ops, "op", names, True), deadline_ns=0)
    assert compiled[0] == python[0] == [("open", "real.bin", 1)]
    assert compiled[1].timed_out and python[1].timed_out
    assert compiled[1].messages == python[1].messages
    assert compiled[2] == python[2] == []
    # the pass's last op late: still timed out, as the loops raise after any late op
    last = ["real.bin"]
    python = _run(_setup(tmp_path, ("stat",), "op", last, False, count=1), deadline_ns=0)
    compiled = _run(_setup(tmp_path, ("stat",), "op", last, True, count=1), deadline_ns=0)
    assert compiled[0] == python[0] == [("stat", "real.bin", 1)]
    assert compiled[1].timed_out and python[1].timed_out


def test_no_program_where_a_pass_reads_or_the_backend_has_no_compiled_calls(tmp_path: Path) -> None:
    backend = PosixBackend(str(tmp_path))
    extent = Extent("a.bin", 0, 1)
    plan = RankPlan(rank=0, nranks=1, layout="sharded", ops=("open", "read", "close"),
                    extents=(extent,), block_bytes=4096, stat_count=1, open_count=1, hold=extent)
    paths = {"a.bin": backend.path("a.bin")}
    assert metadata_loop.build(plan, paths, backend, False, True) is None
    metadata = plan._replace(ops=("open", "close"))
    assert metadata_loop.build(metadata, paths, backend, False, True) is not None
    in_memory = open_backend("memory://metadata-loop")   # a HEAD is Python's: no calls
    assert metadata_loop.build(metadata, {"a.bin": in_memory.path("a.bin")}, in_memory,
                               False, True) is None


@pytest.mark.mpi
def test_a_run_under_mpiexec_says_which_loop_ran(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"size": "1MiB", "layout": ["sharded"]},
                    pattern={"ops": ["stat", "open", "close"], "stat_count": 3},
                    run={"iterations": 2, "warmup": 1, "verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    archive = tmp_path / "results" / "job.csv"
    for env in ({}, {oploop.PYTHON_LOOPS: "1"}):
        ran = stampede("run", str(job), np=2, env=env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
    compiled, python = sidecars(archive)
    assert compiled["node"]["metadata_loop"] == "compiled"
    assert python["node"]["metadata_loop"] == f"python ({oploop.PYTHON_LOOPS}=1)"
    counts = [{row["op"]: (row["count"], row["errors"]) for row in read_archive(archive)
               if row["run_id"] == run["run_id"]} for run in (compiled, python)]
    assert counts[0] == counts[1]
    assert counts[0]["stat"] == ("12", "0")   # 2 ranks x 1 file x 3 stats x 2 iterations
