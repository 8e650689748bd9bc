"""Helpers shared by the bench/ scripts: one version of each, no measurement logic here.

The scripts are run as `.venv/bin/python bench/NAME.py`; Python then puts bench/ first on
sys.path, which is how `from common import ...` finds this file.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from stampede.results.cells import Row
from stampede.sysinfo import mount_of

VENV_BIN = Path(sys.executable).parent   # the venv's python, mpiexec and stampede
NOISY_SPREAD = 0.25   # (max - min) / median above this: the machine was busy
FAILED_OUTPUT_TAIL_CHARS = 3000   # of a failed command's stdout, and of its stderr, shown
MedianMinMax = tuple[float, float, float]
TomlValue = str | Path | int | float | bool | list[str]
T = TypeVar("T")


# --- command line -------------------------------------------------------------------------

def docstring_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose --help prints the script's module docstring as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def add_scratch_parent_option(parser: argparse.ArgumentParser) -> None:
    """--dir: the parent of the fresh scratch directory (see scratch_directory)."""
    parser.add_argument("--dir", default=None,
                        help="parent of the scratch directory (default: the system temp dir); "
                             "the scratch directory is created fresh and removed at the end")


def comma_separated(text: str, convert: Callable[[str], T]) -> list[T]:
    """`convert` applied to each comma-separated item; its ValueError passes through."""
    return [convert(item) for item in text.split(",")]


# --- running commands ---------------------------------------------------------------------

def run_checked(command: list[str], env: Mapping[str, str] | None = None) -> str:
    """Run a command; return its stdout, or exit with its status and output if it fails."""
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        sys.stderr.write(f"FAILED ({result.returncode}): {' '.join(command)}\n"
                         f"{result.stdout[-FAILED_OUTPUT_TAIL_CHARS:]}"
                         f"{result.stderr[-FAILED_OUTPUT_TAIL_CHARS:]}")
        raise SystemExit(result.returncode)
    return result.stdout


def mpiexec_command(nranks: int, *program: str) -> list[str]:
    """`mpiexec -n N PROGRAM...` with the venv's own mpiexec."""
    return [str(VENV_BIN / "mpiexec"), "-n", str(nranks), *program]


def mpi_launcher_of(binary: str) -> str:
    """The launcher of the MPI library `binary` is linked with (a peer's IOR or mdtest):
    `bin/mpiexec.mpich` (a libmpich) or `bin/mpiexec` under the library's prefix, as ldd
    resolves it; the venv's mpiexec where ldd names no MPI library. A launcher of another
    MPI hangs or starts N one-rank jobs (a link named mpiexec.mpich to the venv's hydra
    hung), so the name is never guessed."""
    linked = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    found = re.search(r"(libmpi\w*)\.so[.\d]* => (\S+)", linked)
    if found is None:
        return str(VENV_BIN / "mpiexec")
    names = ("mpiexec.mpich", "mpiexec") if "mpich" in found.group(1) else ("mpiexec",)
    for prefix in Path(found.group(2)).resolve().parents:
        for name in names:
            if (prefix / "bin" / name).is_file():
                return str(prefix / "bin" / name)
    raise SystemExit(f"{binary}: linked with {found.group(2)}, but no {' or '.join(names)} "
                     "under its prefix: give the launcher of that MPI (--mpiexec)")


def run_stampede(step: str, job: Path, nranks: int, *overrides: str) -> None:
    """`mpiexec -n N stampede STEP JOB --set ...` with the venv's own tools."""
    command = mpiexec_command(nranks, str(VENV_BIN / "stampede"), step, str(job))
    for override in overrides:
        command += ["--set", override]
    run_checked(command)


# --- peers' results ----------------------------------------------------------------------

def ior_read_gbps(summary: Path, who: str) -> float:
    """IOR's read GB/s from its JSON summary file: the median over its repetitions' own
    results, as `stampede import` reads them. A file without them would give IOR's mean
    instead (its summary of all tests): refused, as is one with no read or several."""
    from stampede.results.importers import IOR_MEANS, ior_rows

    rows = [row for row in ior_rows(json.loads(summary.read_text()), who, "warm", str(summary))
            if row["op"] == "read"]
    if len(rows) != 1:
        raise SystemExit(f"{who}: {summary}: {len(rows)} read results, not one")
    (read,) = rows
    if IOR_MEANS in str(read["warnings"]):
        raise SystemExit(f"{who}: {summary}: no per-repetition results, only IOR's means")
    gbps = read["agg_gbps"]
    assert isinstance(gbps, float)
    return gbps


# --- machine facts (each script composes its own line from these) -------------------------

def memory_gib() -> float:
    """Physical memory in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def machine_text(*, with_ram: bool) -> str:
    """`machine: N CPUs[, M GiB RAM], kernel K`."""
    ram = f", {memory_gib():.0f} GiB RAM" if with_ram else ""
    return f"machine: {os.cpu_count()} CPUs{ram}, kernel {os.uname().release}"


def load_average_text() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def scratch_text(scratch: Path, *, with_device: bool = True) -> str:
    """`scratch DIR on FS_TYPE[ (DEVICE at MOUNTPOINT)]`: the file system measured on."""
    mount = mount_of(scratch)
    where = f" ({mount.device} at {mount.mountpoint})" if with_device else ""
    return f"scratch {scratch} on {mount.fs_type}{where}"


def mpi_library_text() -> str:
    """The first line of the MPI library's version, as mpi4py in the venv reports it."""
    library = run_checked([str(VENV_BIN / "python"), "-c", "from mpi4py import MPI; "
                           "print(MPI.Get_library_version().splitlines()[0])"])
    return " ".join(library.split())


# --- archive and summaries ----------------------------------------------------------------

def archive_rows(archive: Path) -> list[dict[str, str]]:
    """Every row of a stampede CSV archive, as column -> text."""
    with archive.open() as file:
        return list(csv.DictReader(file))


def read_archive(archive: Path) -> list[Row]:
    """Every row of a stampede CSV archive as stampede's model and reports read it (typed
    by the column registry: stampede.results.archived)."""
    from stampede.results.archived import Archive

    return Archive.open(archive).rows


def median_min_max(values: Iterable[float]) -> MedianMinMax:
    """(median, min, max) of the values."""
    numbers = list(values)
    return statistics.median(numbers), min(numbers), max(numbers)


def relative_spread(summary: MedianMinMax) -> float:
    """(max - min) / median of a (median, min, max) triple."""
    return (summary[2] - summary[1]) / summary[0]


def ratio_verdict(ratio: float, target_ratio: float, summaries: Iterable[MedianMinMax]) -> str:
    """PASS at or above the target; below it, flagged noisy when a summary's relative
    spread exceeds NOISY_SPREAD."""
    if ratio >= target_ratio:
        return "PASS"
    verdict = f"below target ({target_ratio:.2f})"
    if max(relative_spread(summary) for summary in summaries) > NOISY_SPREAD:
        verdict += ", noisy: rerun on a quiet machine"
    return verdict


# --- scratch directory and job file -------------------------------------------------------

@contextmanager
def scratch_directory(prefix: str, parent: str | None) -> Iterator[Path]:
    """A fresh directory PREFIXxxxx under `parent` (None: the system temp dir), removed
    with everything in it when the block ends, however it ends: SIGTERM and SIGHUP (a
    `timeout`, a closed terminal) end the bench through SystemExit inside the block, so
    that the removal runs (their default action would skip it)."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    previous = {number: signal.signal(number, _exit_on_signal)
                for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield scratch
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        shutil.rmtree(scratch, ignore_errors=True)


def _exit_on_signal(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def toml_value(value: TomlValue) -> str:
    """One TOML value: strings and paths quoted, lists of strings inline, numbers bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{item}"' for item in value) + "]"
    if isinstance(value, str | Path):
        return f'"{value}"'
    return str(value)


def write_job_toml(path: Path, sections: Mapping[str, Mapping[str, TomlValue]]) -> Path:
    """Write a job file, one [section] per key of `sections` in order; return its path."""
    lines = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def compile_c(source_text: str, scratch: Path, name: str, what: str) -> Path | None:
    """`source_text` compiled with gcc -O2 into scratch/name; None, said aloud (naming
    `what` is skipped), where there is no gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        print(f"gcc not found: {what} is skipped (apt-get install gcc to get it)")
        return None
    source, binary = scratch / f"{name}.c", scratch / name
    source.write_text(source_text)
    run_checked([gcc, "-O2", "-o", str(binary), str(source)])
    return binary


DD_SECONDS = re.compile(r"copied, ([0-9.e+-]+) s")   # dd's summary line, LC_ALL=C


def run_dd_together(commands: list[list[str]], size_bytes: int) -> float:
    """Start every dd at once; aggregate GB/s = total bytes / the slowest dd's elapsed."""
    env = dict(os.environ, LC_ALL="C")
    procs = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=env) for command in commands]
    seconds = []
    for command, proc in zip(commands, procs):
        _, err = proc.communicate()
        match = DD_SECONDS.search(err)
        if proc.returncode or not match:
            sys.stderr.write(f"FAILED ({proc.returncode}): {' '.join(command)}\n{err}")
            raise SystemExit(proc.returncode or 1)
        seconds.append(float(match.group(1)))
    return size_bytes / max(seconds) / 1e9
