"""`stampede startup`: the start-up stampede, T_pod_init of the recovery model, per rank.

Every rank stamps four moments on the wall clock (`time.time_ns()`, the one clock that
processes share; across nodes it is as good as their clock synchronisation):
  launch       STAMPEDE_LAUNCH_NS from the environment (`stampede startup --np N` sets it
               right before it starts mpiexec; by hand: STAMPEDE_LAUNCH_NS=$(date +%s%N)
               srun ...), else the process's start time from /proc/self/stat (10 ms steps)
  first line   stampede's own first line of code (stampede/__init__.py)
  imports      stampede's run modules and the --import list imported
  mpi ready    MPI initialised (mpi4py's import runs MPI_Init)
and the ops are the gaps: interpreter (launch -> first line: spawn, interpreter, site),
import, mpi_init, and startup (launch -> mpi ready), reported like any op: percentiles
over ranks, time to last rank ready, first ready, straggler ratio. Once every rank is up,
COLLECTIVE_REPEATS barriers and 8-byte allreduces are timed too (ops barrier, allreduce):
the T_barrier_sync that `stampede mttr` takes from the archive.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from typing import TYPE_CHECKING, TypedDict

import stampede
from stampede.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from stampede.mpi import Comm

LAUNCH_VARIABLE = "STAMPEDE_LAUNCH_NS"
# What a worker rank must never import for stampede's own sake (they are slow to import,
# and at scale every import is a metadata storm on the shared file system).
HEAVY_MODULES = ("rich", "fsspec", "botocore", "h5py", "torch")
# What a worker rank of `stampede run` imports (the CLI, what cmd_run, load_job and measure
# import, a POSIX target's backend): the start-up cost of stampede itself. Rank 0 alone
# imports the archive's and the report's modules (tests/run/test_startup.py checks both).
# The records these modules define are NamedTuples unless they need a dataclass (replace,
# asdict, __post_init__, mutability): a frozen dataclass compiles six methods at import.
RUN_MODULES = ("stampede.cli", "stampede.commands.job", "stampede.mpi",
               "stampede.checkpoint.formats", "stampede.run.job", "stampede.spec",
               "stampede.spec_rules", "stampede.run.interrupt", "stampede.present.progress",
               "stampede.backends.posix", "stampede.checkpoint.lock")
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
COLLECTIVE_REPEATS = 10


def process_start_ns() -> int:
    """This process's start on the wall clock, from /proc (resolution: one clock tick)."""
    with open("/proc/self/stat") as stream:
        fields = stream.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    # The start is in ticks since boot; CLOCK_BOOTTIME counts from the same boot, so the
    # wall time of the start is now - (time since boot - start). (btime, the boot's wall
    # time in /proc/stat, has whole seconds only: up to a second wrong.)
    since_boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return time.time_ns() - (since_boot_ns - start_ticks * 10**9 // CLOCK_TICKS_PER_S)


def launch_ns() -> tuple[int, str]:
    value = os.environ.get(LAUNCH_VARIABLE, "")
    if value.isdigit():
        return int(value), LAUNCH_VARIABLE
    return process_start_ns(), "/proc/self/stat"


class StartupRecord(TypedDict):
    """One rank's start-up as measure() stamps it (gathered to rank 0, kept in the sidecar)."""

    host: str
    launch_source: str
    stamps_ns: tuple[int, int, int, int]   # launched, stampede's first line, imported, MPI ready
    heavy_modules: list[str]
    bytecode_cached: bool
    collectives_ns: list[tuple[str, int, int]]   # (op, start, stop)


def measure(comm_factory: Callable[[], Comm], imports: tuple[str, ...]) -> tuple[Comm, StartupRecord]:
    """Stamp this rank's start-up; returns (the communicator, this rank's record)."""
    launched, source = launch_ns()
    heavy_before_imports = [name for name in HEAVY_MODULES if name in sys.modules]
    for module in RUN_MODULES:
        importlib.import_module(module)
    heavy_own = [name for name in HEAVY_MODULES if name in sys.modules]
    # Without cached bytecode every rank compiles stampede again (40-85 ms per rank here).
    cli_source = sys.modules["stampede.cli"].__file__ or ""
    compiled = bool(cli_source) and os.path.exists(importlib.util.cache_from_source(cli_source))
    for module in imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UsageError(f"--import {module}: cannot import it ({error})") from None
    imported = time.time_ns()
    comm = comm_factory()
    ready = time.time_ns()
    # after the stamps: a worker of run never imports it
    import socket

    return comm, {
        "host": socket.gethostname(), "launch_source": source,
        "stamps_ns": (launched, stampede.FIRST_LINE_NS, imported, ready),
        "heavy_modules": sorted(set(heavy_before_imports) | set(heavy_own)),
        "bytecode_cached": compiled,
        "collectives_ns": time_collectives(comm),
    }


def time_collectives(comm: Comm) -> list[tuple[str, int, int]]:
    """(op, start, stop) of barriers and small allreduces, each after a polite barrier."""
    import numpy as np

    from stampede import mpi
    stamps = []
    value, result = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    for _ in range(COLLECTIVE_REPEATS):
        for op in ("barrier", "allreduce"):
            mpi.barrier(comm)
            start = time.time_ns()
            if comm.Get_size() > 1 and op == "barrier":
                comm.Barrier()
            elif comm.Get_size() > 1:
                comm.Allreduce(value, result)
            stamps.append((op, start, time.time_ns()))
    return stamps


def samples(records: list[StartupRecord]) -> np.ndarray:
    """Sample rows (iteration 0) from every rank's stamps, relative to the earliest launch."""
    import numpy as np

    from stampede.ops import OP_CODE

    origin = min(record["stamps_ns"][0] for record in records)
    rows = []
    for rank, record in enumerate(records):
        launched, first, imported, ready = (stamp - origin for stamp in record["stamps_ns"])
        for op, start, stop in (("interpreter", launched, first), ("import", first, imported),
                                ("mpi_init", imported, ready), ("startup", launched, ready)):
            rows.append((0, OP_CODE[op], start, max(stop, start), 0, 1, rank))
        for op, start, stop in record.get("collectives_ns", ()):
            rows.append((0, OP_CODE[op], start - origin, stop - origin, 0, 1, rank))
    return np.array(rows, dtype=np.int64)


def startup_warnings(records: list[StartupRecord]) -> list[str]:
    """What makes these start-up numbers less than they seem (archived with them)."""
    hosts = [record["host"] for record in records]
    sources = sorted({record["launch_source"] for record in records})
    heavy_workers = sorted({name for record in records[1:] for name in record["heavy_modules"]})
    warnings = []
    if sources != [LAUNCH_VARIABLE]:
        warnings.append(f"launch time from /proc/self/stat on some ranks (one clock tick, "
                        f"{1000 // CLOCK_TICKS_PER_S} ms): set {LAUNCH_VARIABLE}=$(date +%s%N) "
                        "before the launcher")
    if not all(record.get("bytecode_cached", True) for record in records):
        warnings.append("stampede's bytecode is not cached (PYTHONDONTWRITEBYTECODE, or a "
                        "read-only install): every rank compiles it; run `python -m compileall` "
                        "on the install")
    if heavy_workers:
        warnings.append(f"worker ranks imported {', '.join(heavy_workers)} for stampede's own sake")
    if len(records) > (os.cpu_count() or 1) and len(set(hosts)) == 1:
        warnings.append(f"{len(records)} ranks on {os.cpu_count()} CPUs: oversubscribed")
    return warnings
