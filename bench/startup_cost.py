"""Start-up cost per rank (T_pod_init): `stampede startup` versus the bare minimum.

For each rank count (default 2 and 4) the same venv mpiexec launches, --rounds times,
each of these sides; every rank stamps time.time_ns() and subtracts the launch stamp,
taken right before mpiexec starts and passed in STAMPEDE_LAUNCH_NS (as stampede does):

  stampede      `stampede startup --np N --repeat 1 --archive A`: per rank interpreter
                (launch -> stampede's first line), import (stampede's run modules, numpy
                among them), mpi_init (`from mpi4py import MPI`, i.e. MPI_Init) and
                startup (launch -> MPI ready); p50 and max over ranks from the archive.
  mpi4py        `mpiexec -n N python -c CODE`, CODE = stamp, `from mpi4py import MPI`,
                stamp; the gaps gathered to rank 0: the least any MPI Python rank pays.
  numpy+mpi4py  the same with `import numpy` first (stampede's one required import).

Each side gets one untimed launch first; every round launches each side (in each bytecode
mode) once, in an order that rotates from round to round, so that load which comes and
goes falls on all alike. Shown: per side the median over rounds of each launch's p50 over
ranks (and of its max over ranks); paired, i.e. the median over rounds of the same round's
figures: the ratio stampede / mpi4py and the extra ms per rank that stampede adds over
each reference (over numpy+mpi4py: its own modules and its own work before MPI_Init).
Every command runs in the scratch directory: `stampede startup` starts its ranks with
`python -m stampede`, which puts the working directory first on sys.path, so a checkout's
stampede/ there would be imported instead of the installed one.

Files: once per bytecode mode, one launch of each side at 2 ranks with rank 1 (a worker:
it prints nothing) under `strace -f`, counting the file-name calls of its whole life
(for a worker, its start-up): files opened (open/openat that succeeded) and path lookups
(every open, stat, access and readlink call, failed ones included: the metadata load a
shared file system takes, per rank). Without strace (or ptrace) the counts are skipped.

Bytecode is part of start-up: with PYTHONDONTWRITEBYTECODE set and no __pycache__ next to
the sources, every rank compiles stampede's modules from source at every launch.
--bytecode as-is keeps the environment; cached gives every side a fresh
PYTHONPYCACHEPREFIX in the scratch directory (filled by the untimed launch); both (the
default) measures each, interleaved. The verdicts (one says whether stampede's own share
meets issue 24's goal, at most 50 ms per rank over numpy+mpi4py) are printed, never turned
into an exit status: the script exits non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import chdir
from pathlib import Path

from common import (
    VENV_BIN,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    mpi_library_text,
    mpiexec_command,
    run_checked,
    scratch_directory,
)

import stampede

LAUNCH_VARIABLE = "STAMPEDE_LAUNCH_NS"
OPS = ("interpreter", "import", "mpi_init", "startup")
SIDES = ("stampede", "mpi4py", "numpy+mpi4py")
# Issue 24's goal: what stampede's own modules and work add to a rank over numpy+mpi4py
OWN_SHARE_GOAL_MS = 50
REFERENCE_CODE = """import os, time
first = time.time_ns()
{imports}imported = time.time_ns()
from mpi4py import MPI
ready = time.time_ns()
launch = int(os.environ["STAMPEDE_LAUNCH_NS"])
gaps = MPI.COMM_WORLD.gather((first - launch, imported - first, ready - imported, ready - launch))
if MPI.COMM_WORLD.Get_rank() == 0:
    print(gaps)
"""
Launch = dict[str, tuple[float, float]]   # op -> (p50 over ranks, max over ranks), seconds
FILE_CALLS = "open,openat,stat,lstat,newfstatat,statx,access,faccessat,readlink"
# one strace line: "PID name(" or "PID <... name resumed>", the result after " = "
STRACE_CALL = re.compile(r"^\d+\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()")


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (default 2,4)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="launches of each side per rank count and bytecode mode, in "
                             "rotating order (default 10)")
    parser.add_argument("--bytecode", choices=("as-is", "cached", "both"), default="both",
                        help="as-is: the environment's bytecode handling; cached: a fresh "
                             "PYTHONPYCACHEPREFIX in the scratch dir; both (default)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.rank_counts = comma_separated(args.ranks, int)
    except ValueError as error:
        parser.error(str(error))
    if args.rounds < 1 or min(args.rank_counts) < 1:
        parser.error("--rounds and every rank count must be at least 1")
    args.modes = ("as-is", "cached") if args.bytecode == "both" else (args.bytecode,)
    return args


def machine_facts() -> str:
    """One line: CPUs, kernel, Python, MPI library, load, and whether stampede's modules
    have cached bytecode next to their sources."""
    cli_source = str(Path(stampede.__file__).parent / "cli.py")
    cached = Path(importlib.util.cache_from_source(cli_source)).exists()
    return (f"{machine_text(with_ram=False)}, Python {sys.version.split()[0]}, "
            f"{mpi_library_text()}; load average {load_average_text()};\n"
            f"stampede at {Path(cli_source).parent}: bytecode next to the sources "
            f"{'present' if cached else 'ABSENT'}, PYTHONDONTWRITEBYTECODE="
            f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}")


def environment(scratch: Path, mode: str, nranks: int) -> dict[str, str]:
    """The launch environment of one bytecode mode (cached: a fresh pycache prefix)."""
    if mode == "as-is":
        return dict(os.environ)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch / f"pycache-np{nranks}")
    return env


def launch_reference(side: str, nranks: int, env: dict[str, str]) -> Launch:
    """One launch of a bare reference; op -> (p50, max) over ranks in seconds."""
    code = REFERENCE_CODE.format(imports="import numpy\n" if side == "numpy+mpi4py" else "")
    command = mpiexec_command(nranks, str(VENV_BIN / "python"), "-c", code)
    env = {**env, LAUNCH_VARIABLE: str(time.time_ns())}   # right before mpiexec, as stampede
    gaps = ast.literal_eval(run_checked(command, env))
    return {op: (statistics.median(rank[i] for rank in gaps) / 1e9,
                 max(rank[i] for rank in gaps) / 1e9) for i, op in enumerate(OPS)}


def launch_stampede(nranks: int, env: dict[str, str], archive: Path) -> Launch:
    """One `stampede startup --np N --repeat 1` (it stamps the launch itself); its
    archived run: op -> (lat_p50_s, lat_max_s)."""
    run_checked([str(VENV_BIN / "stampede"), "startup", "--np", str(nranks), "--repeat", "1",
                 "--archive", str(archive)], env)
    rows = archive_rows(archive)
    return {row["op"]: (float(row["lat_p50_s"]), float(row["lat_max_s"]))
            for row in rows if row["run_id"] == rows[-1]["run_id"]}


def launch(side: str, nranks: int, env: dict[str, str], archive: Path) -> Launch:
    """One launch of one side."""
    if side == "stampede":
        return launch_stampede(nranks, env, archive)
    return launch_reference(side, nranks, env)


def rank_program(side: str, archive: Path) -> list[str]:
    """What one rank of a side runs (stampede: what `stampede startup --np` starts)."""
    if side == "stampede":
        return [str(VENV_BIN / "python"), "-P", "-m", "stampede", "startup", "--archive",
                str(archive)]
    imports = "import numpy\n" if side == "numpy+mpi4py" else ""
    return [str(VENV_BIN / "python"), "-c", REFERENCE_CODE.format(imports=imports)]


def files_of_a_worker(side: str, env: dict[str, str], scratch: Path) -> tuple[int, int] | None:
    """(files opened, path lookups) of rank 1 of a 2-rank launch, under strace; None when
    strace cannot trace here."""
    trace = scratch / f"strace-{side}.txt"
    program = rank_program(side, scratch / "strace-startup.csv")
    command = [*mpiexec_command(1, *program), ":", "-n", "1", "strace", "-f", "-qq", "-o",
               str(trace), "-e", f"trace={FILE_CALLS}", *program]
    env = {**env, LAUNCH_VARIABLE: str(time.time_ns())}
    if subprocess.run(command, capture_output=True, env=env).returncode or not trace.exists():
        return None
    opened = lookups = 0
    for line in trace.read_text().splitlines():
        call = STRACE_CALL.match(line)
        if call is None or line.endswith("<unfinished ...>"):
            continue   # counted where it resumes
        lookups += 1
        result = line.rpartition(" = ")[2].split(" ")[0]
        opened += (call[1] or call[2]) in ("open", "openat") and result.isdigit()
    return opened, lookups


def count_files(scratch: Path, modes: tuple[str, ...]) -> dict[str, dict[str, tuple[int, int]]]:
    """Mode -> side -> (files opened, path lookups) of one worker rank; {} without strace."""
    if shutil.which("strace") is None:
        print("strace not found: the files a rank opens are not counted", flush=True)
        return {}
    counts: dict[str, dict[str, tuple[int, int]]] = {}
    for mode in modes:
        for side in SIDES:
            counted = files_of_a_worker(side, environment(scratch, mode, 2), scratch)
            if counted is None:
                print("strace could not trace a rank (ptrace refused?): files not counted",
                      flush=True)
                return {}
            counts.setdefault(mode, {})[side] = counted
    return counts


def print_files(counts: dict[str, dict[str, tuple[int, int]]]) -> None:
    """Per mode: the files one worker rank opens and its path lookups, per side."""
    for mode, by_side in counts.items():
        bare = by_side["mpi4py"]
        print(f"\nfiles, bytecode {mode}: one worker rank (rank 1 of 2) under strace, its whole "
              "life\n" + f"{'side':<13} {'opened':>7} {'lookups':>8} {'+opened vs mpi4py':>18} "
              f"{'+lookups':>9}")
        for side, (opened, lookups) in by_side.items():
            print(f"{side:<13} {opened:>7} {lookups:>8} {opened - bare[0]:>18} "
                  f"{lookups - bare[1]:>9}")


def measure(scratch: Path, nranks: int, modes: tuple[str, ...],
            rounds: int) -> dict[str, dict[str, list[Launch]]]:
    """Mode -> side -> one Launch per round, after one untimed launch of each. Every round
    launches every (mode, side) once, in an order that rotates from round to round."""
    envs = {mode: environment(scratch, mode, nranks) for mode in modes}
    archive = scratch / f"startup-np{nranks}.csv"
    turns = [(mode, side) for mode in modes for side in SIDES]
    for mode, side in turns:
        launch(side, nranks, envs[mode], archive)
    measured: dict[str, dict[str, list[Launch]]] = {
        mode: {side: [] for side in SIDES} for mode in modes}
    for number in range(rounds):
        shift = number % len(turns)
        for mode, side in turns[shift:] + turns[:shift]:
            measured[mode][side].append(launch(side, nranks, envs[mode], archive))
    return measured


def ms(launches: list[Launch], op: str, which: int = 0) -> list[float]:
    """Per launch, one op's p50 (which=0) or max (which=1) over ranks, in ms."""
    return [one[op][which] * 1e3 for one in launches]


def paired(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """Median over rounds of the same round's ratio and difference (ours vs theirs)."""
    return (statistics.median(a / b for a, b in zip(ours, theirs)),
            statistics.median(a - b for a, b in zip(ours, theirs)))


def print_table(nranks: int, mode: str, measured: dict[str, list[Launch]]) -> None:
    """One block per rank count and bytecode mode: the sides, ratio and extra ms."""
    bare, with_numpy = (ms(measured[side], "startup") for side in SIDES[1:])
    print(f"\n{nranks} ranks, bytecode {mode}: ms per rank, median over "
          f"{len(bare)} launches of each launch's p50 over ranks")
    header = (f"{'side':<13} {'startup p50':>11} {'(min-max)':>15} {'startup max':>11} "
              f"{'interpreter':>11} {'import':>7} {'mpi_init':>8} {'x mpi4py':>8} "
              f"{'+ms vs mpi4py':>13} {'+ms vs numpy':>12}")
    print(header)
    print("-" * len(header))
    for side in SIDES:
        launches = measured[side]
        startup = ms(launches, "startup")
        startup_median, startup_min, startup_max = median_min_max(startup)
        ratio, extra = paired(startup, bare)
        print(f"{side:<13} {startup_median:>11.1f} ({startup_min:6.1f}-{startup_max:6.1f}) "
              + " ".join(f"{statistics.median(ms(launches, op, which)):>{width}.1f}" for op, which,
                         width in (("startup", 1, 11), ("interpreter", 0, 11), ("import", 0, 7),
                                   ("mpi_init", 0, 8)))
              + f" {ratio:>8.2f} {extra:>13.1f} {paired(startup, with_numpy)[1]:>12.1f}")


def print_verdicts(results: dict[int, dict[str, dict[str, list[Launch]]]],
                   files: dict[str, dict[str, tuple[int, int]]]) -> None:
    """Per rank count and mode: where a stampede rank's start-up goes, in ms per rank (and
    the files a worker rank opens beyond numpy+mpi4py's, where counted)."""
    for nranks, by_mode in results.items():
        for mode, measured in by_mode.items():
            ours, bare, with_numpy = (ms(measured[side], "startup") for side in SIDES)
            ratio, extra = paired(ours, bare)
            own_files = ""
            if mode in files:
                (opened, lookups), (numpy_opened, numpy_lookups) = (
                    files[mode][side] for side in ("stampede", "numpy+mpi4py"))
                own_files = (f"; it opens {opened} files ({opened - numpy_opened} more than "
                             f"numpy+mpi4py), {lookups} path lookups ({lookups - numpy_lookups} "
                             "more)")
            own = paired(ours, with_numpy)[1]
            print(f"verdict, {nranks} ranks, bytecode {mode}: a stampede rank is MPI-ready after "
                  f"{statistics.median(ours):.0f} ms, {ratio:.2f}x a bare mpi4py rank: numpy adds "
                  f"{paired(with_numpy, bare)[1]:.0f} ms, stampede's own modules and work "
                  f"{own:.0f} ms (of {extra:.0f} ms extra){own_files}")
            print(f"verdict, {nranks} ranks, bytecode {mode}: stampede's own share, {own:.0f} ms "
                  f"per rank, {'meets' if own <= OWN_SHARE_GOAL_MS else 'MISSES'} the goal of "
                  f"at most {OWN_SHARE_GOAL_MS} ms over numpy+mpi4py")
        if len(by_mode) == 2:
            change = paired(ms(by_mode["cached"]["stampede"], "import"),
                            ms(by_mode["as-is"]["stampede"], "import"))[1]
            print(f"verdict, {nranks} ranks: cached bytecode changes stampede's import by "
                  f"{change:+.1f} ms per rank")


def main() -> int:
    """Measure every rank count, both bytecode modes interleaved, in a fresh scratch dir."""
    args = parse_args()
    with scratch_directory("stampede-startup-", args.dir) as made:
        scratch = made.resolve()
        with chdir(scratch):   # no stampede/ in the working directory: see the module docstring
            print(machine_facts())
            print(f"startup_cost: ranks {args.ranks}, bytecode {', '.join(args.modes)}; "
                  f"{args.rounds} rounds of {', '.join(SIDES)} (+1 untimed launch each)", flush=True)
            results = {nranks: measure(scratch, nranks, args.modes, args.rounds)
                       for nranks in args.rank_counts}
            files = count_files(scratch, args.modes)   # after measure: bytecode cached
            for nranks, by_mode in results.items():
                for mode, measured in by_mode.items():
                    print_table(nranks, mode, measured)
            print_files(files)
            print("\nstartup = launch -> MPI ready; interpreter = launch -> first line (stampede: its "
                  "package's first line); import = stampede's run\nmodules (references: numpy or "
                  "nothing); mpi_init = `from mpi4py import MPI`. x mpi4py and +ms are paired: the "
                  "median over\nrounds of the same round's startup p50 ratio / difference (stampede "
                  "- reference); +ms vs numpy is what stampede's own\nmodules and work cost each rank")
            print_verdicts(results, files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
