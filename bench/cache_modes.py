"""Read bandwidth under run.cache = warm, cold and direct: stampede versus dd (and fio),
on the same files, in one run.

For each rank count (default 1 and 2) the script prepares one sharded checkpoint with
stampede (--size in all, one file per rank, 4 MiB blocks) and measures, on the SAME
files, each cache mode. Before each stampede run and before each reference read, the
script puts the files in the mode's state (untimed):

  warm       every file read once with dd
  cold       each file's pages evicted: posix_fadvise(POSIX_FADV_DONTNEED), as stampede does
  cold+drop  sync; echo 3 > /proc/sys/vm/drop_caches; then as cold (root only, else skipped)
  direct     as cold (O_DIRECT bypasses the page cache; evicting keeps the state the same)

  stampede  `mpiexec -n N stampede run` with run.cache = warm / cold / cold (plus
            run.drop_caches = true) / direct, warmup 1 and --iterations measured
            iterations, once per round; stampede itself evicts (cold) before every
            iteration. From the CSV archive: the `read` row's agg_gbps (per run the median
            over iterations of total bytes / (last read stop - first read start over all
            ranks)), the `restore` row's time_to_last_rank_s, and cache_resident_pct: the
            share of the bytes to read that were in the page cache when the phase started,
            measured by stampede with mincore(2) after its eviction (cold runs only; it
            does not ask in warm and direct runs, shown as -). Shown: the median of
            the rounds' medians, with (min of their minima - max of their maxima).
  dd        one `dd if=SHARD bs=4M of=/dev/null` per rank (direct: iflag=direct), all
            started together; GB/s = total bytes / the slowest dd's own elapsed time (dd's
            report, which like stampede's excludes process start); --repeats per round,
            median over all rounds. Its residency is measured the same way (mincore over
            the shard files) right before each repeat: `res%` of the reference side.
  fio       only if `fio` is on PATH (else skipped, said once): one fio job per shard file
            in one fio process, ioengine=psync, rw=read, bs=4M, invalidate=0 (fio's default
            invalidate=1 drops the cache itself and would make a warm run cold), mem=mmap
            (page-aligned buffers like stampede's: fio's default malloc buffers are not,
            and read warm pages about 2x slower), fadvise_hint=0 (no readahead hint: dd
            and stampede give none), direct=1 for direct; GB/s = total bytes / the slowest
            job's runtime (fio reports whole milliseconds); --repeats per round, after dd.

The --rounds alternate (references first, then stampede first, ...) so that load from
other work on the machine falls on both sides alike. GB = 1e9 bytes. read/dd = median
stampede read GB/s / median dd GB/s. Nothing is judged pass or fail: the table shows how
far each mode moves stampede and the reference alike, and res% shows that cold was cold
(about 0%) and, on the reference side, that warm was warm (about 100%). The script exits
non-zero only if a command failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from common import (
    NOISY_SPREAD,
    MedianMinMax,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    relative_spread,
    run_checked,
    run_dd_together,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)
from read_vs_dd import dd_commands, warm_up

from stampede.backends.posix import PosixBackend
from stampede.checkpoint.plan import shard_path
from stampede.run.residency import resident_bytes
from stampede.sysinfo import mount_of
from stampede.units import parse_size

BLOCK_BYTES = 4 * 1024 * 1024
LAYOUT = "sharded"
MODES = ("warm", "cold", "cold+drop", "direct")
STAMPEDE_SETTINGS = {   # mode -> the --set overrides of its stampede run
    "warm": ("run.cache=warm",),
    "cold": ("run.cache=cold",),
    "cold+drop": ("run.cache=cold", "run.drop_caches=true"),
    "direct": ("run.cache=direct",),
}
FULL = {"size": "1GiB", "rounds": 3, "iterations": 3, "repeats": 3}
QUICK = {"size": "256MiB", "rounds": 2, "iterations": 2, "repeats": 2}   # about 30 s
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
WARM_RESIDENT_MIN = 95   # % of the bytes in the page cache below which warm is not warm
COLD_RESIDENT_MAX = 5    # % above which cold is not cold
COLD_LIKE_WARM = 0.5   # cold GB/s at or above this share of warm: not the disk's speed
VIRTUAL_DISK = re.compile(r"^/dev/x?vd[a-z]")   # virtio and Xen block devices
Gbps = MedianMinMax   # (median, min, max) in GB/s


@dataclass(frozen=True)
class ModeResult:
    """One row of the table: a cache mode at a rank count, every side measured."""

    nranks: int
    mode: str
    read_gbps: Gbps                  # stampede `read` op agg GB/s
    last_rank_s: float               # stampede `restore` time to last rank (median of runs)
    resident_pct: MedianMinMax       # stampede cache_resident_pct over runs
    dd_gbps: Gbps
    reference_resident_pct: MedianMinMax   # mincore before each dd / fio repeat
    fio_gbps: Gbps | None            # None: fio not installed


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--quick", action="store_true",
                        help=f"about 30 s: --size {QUICK['size']}, --rounds {QUICK['rounds']}, "
                             f"--iterations {QUICK['iterations']}, --repeats {QUICK['repeats']} "
                             "unless given")
    parser.add_argument("--size", help=f"checkpoint size in all, per rank count (default {FULL['size']})")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (default 1,2)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="cache modes, comma-separated (default all; cold+drop only as root)")
    add_scratch_parent_option(parser)
    parser.add_argument("--rounds", type=int, help=f"alternating rounds (default {FULL['rounds']})")
    parser.add_argument("--iterations", type=int,
                        help=f"stampede measured iterations per run (default {FULL['iterations']})")
    parser.add_argument("--repeats", type=int,
                        help=f"dd (and fio) repeats per mode per round (default {FULL['repeats']})")
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.size_bytes = parse_size(args.size)
        args.rank_counts = comma_separated(args.ranks, int)
    except ValueError as error:
        parser.error(str(error))
    args.mode_list = [mode for mode in args.modes.split(",") if mode]
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot be measured; drop cold+drop from the default modes unless root."""
    unknown = sorted(set(args.mode_list) - set(MODES))
    if unknown or not args.mode_list:
        parser.error(f"--modes {args.modes}: each must be one of {', '.join(MODES)}")
    if args.rounds < 1 or args.iterations < 1 or args.repeats < 1:
        parser.error("--rounds, --iterations and --repeats must be >= 1")
    for nranks in args.rank_counts:
        if nranks < 1 or args.size_bytes % (nranks * BLOCK_BYTES):
            parser.error(f"--size {args.size} must split into {nranks} rank(s) x whole 4 MiB blocks")
    args.skipped = ""
    if "cold+drop" in args.mode_list and not can_drop_caches():
        if args.modes != ",".join(MODES):
            parser.error(f"--modes cold+drop needs {DROP_CACHES} writable (root)")
        args.mode_list.remove("cold+drop")
        args.skipped = f"cold+drop skipped: {DROP_CACHES} is not writable here (needs root)"


def can_drop_caches() -> bool:
    """Root, and the kernel's drop_caches file writable here (not in every container)."""
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def machine_facts(scratch: Path, fio: str | None) -> str:
    """One line: CPUs, memory, kernel, the scratch file system, dd and fio, load."""
    dd_version = subprocess.run(["dd", "--version"], capture_output=True, text=True).stdout
    fio_text = run_checked([fio, "--version"]).strip() if fio else "fio not installed"
    return (f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; "
            f"{dd_version.splitlines()[0] if dd_version else 'dd ?'}; {fio_text}; "
            f"load average {load_average_text()} (other work on the machine widens the spread)")


def write_job(scratch: Path, nranks: int, size_bytes: int) -> Path:
    """A job file for one rank count: its own target directory; each mode's run sets the
    cache mode and its own archive with --set."""
    return write_job_toml(scratch / f"cache_np{nranks}.toml", {
        "target": {"path": scratch / f"ckpt_np{nranks}"},
        "checkpoint": {"size": size_bytes, "layout": LAYOUT, "block_size": "4MiB"},
        "pattern": {"ops": ["open", "read", "close"]},
        "run": {"cache": "warm", "warmup": 1},
        "archive": {"path": scratch / f"archive_np{nranks}.csv"},
    })


def archive_for(scratch: Path, nranks: int, mode: str) -> Path:
    """One archive per (rank count, mode): its rows are that mode's runs and no other's."""
    return scratch / f"archive_np{nranks}_{mode.replace('+', '_')}.csv"


# --- cache state (untimed) ----------------------------------------------------------------

def drop_page_cache() -> None:
    """Write back, then drop the whole page cache (root): stampede's run.drop_caches."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def set_cache_state(mode: str, root: Path, files: list[Path]) -> float:
    """Untimed: put the files in the mode's state; return the % of their bytes that
    mincore then finds in the page cache."""
    if mode == "warm":
        warm_up(root)
    else:
        if mode == "cold+drop":
            drop_page_cache()
        for path in files:
            PosixBackend.evict(path, 0, 0)   # the very call stampede's cold mode makes
    resident = asked = 0
    for path in files:
        in_cache, wanted = resident_bytes(str(path), 0, 0)
        resident, asked = resident + in_cache, asked + wanted
    return 100 * resident / asked


# --- the reference tools ------------------------------------------------------------------

def run_dd(mode: str, root: Path, nranks: int, size_bytes: int) -> float:
    """One dd per rank, all at once (iflag=direct for direct); aggregate GB/s."""
    commands = dd_commands(root, LAYOUT, nranks, size_bytes)
    if mode == "direct":
        commands = [command + ["iflag=direct"] for command in commands]
    return run_dd_together(commands, size_bytes)


def run_fio(fio: str, mode: str, files: list[Path]) -> float:
    """One fio job per file in one fio process; total bytes / the slowest job's runtime."""
    command = [fio, "--output-format=json", "--ioengine=psync", "--rw=read", "--bs=4M",
               f"--direct={int(mode == 'direct')}", "--invalidate=0", "--mem=mmap",
               "--fadvise_hint=0"]
    for rank, path in enumerate(files):
        command += [f"--name=rank{rank}", f"--filename={path}"]
    output = run_checked(command)
    jobs = json.loads(output[output.index("{"):])["jobs"]   # fio may print notes first
    total_bytes = sum(int(job["read"]["io_bytes"]) for job in jobs)
    slowest_s = max(float(job["read"]["runtime"]) for job in jobs) / 1e3
    if total_bytes != sum(path.stat().st_size for path in files) or slowest_s <= 0:
        sys.stderr.write(f"fio read {total_bytes} bytes in {slowest_s} s: {' '.join(command)}\n")
        raise SystemExit(1)
    return total_bytes / slowest_s / 1e9


# --- one rank count -----------------------------------------------------------------------

@dataclass
class ReferenceSamples:
    """What the reference tools measured in one mode, over every round and repeat."""

    dd_gbps: list[float]
    fio_gbps: list[float]
    resident_pct: list[float]


def reference_round(mode: str, root: Path, files: list[Path], args: argparse.Namespace,
                    samples: ReferenceSamples, fio: str | None) -> None:
    """--repeats of dd (then fio), the mode's cache state set before each read."""
    for _ in range(args.repeats):
        samples.resident_pct.append(set_cache_state(mode, root, files))
        samples.dd_gbps.append(run_dd(mode, root, len(files), args.size_bytes))
        if fio:
            samples.resident_pct.append(set_cache_state(mode, root, files))
            samples.fio_gbps.append(run_fio(fio, mode, files))


def stampede_round(mode: str, job: Path, root: Path, files: list[Path], archive: Path,
                   args: argparse.Namespace) -> None:
    """One stampede run in the mode, its cache state set first (stampede's own cold
    eviction then repeats before every iteration)."""
    set_cache_state(mode, root, files)
    run_stampede("run", job, len(files), *STAMPEDE_SETTINGS[mode],
                 f"run.iterations={args.iterations}", f"archive.path={archive}")


def stampede_results(archive: Path) -> tuple[Gbps, float, MedianMinMax]:
    """Over the mode's runs: read agg GB/s (median of medians, min of minima, max of
    maxima), median restore time to last rank, and cache_resident_pct (median, min, max)."""
    rows = archive_rows(archive)
    bad = [row["invalid_reason"] for row in rows if row["valid"] != "true" or row["errors"] != "0"]
    if bad:
        sys.stderr.write(f"{archive}: a stampede run was invalid or had errors: {bad[0]}\n")
        raise SystemExit(1)
    reads = [row for row in rows if row["op"] == "read"]
    read = (statistics.median(float(row["agg_gbps"]) for row in reads),
            min(float(row["agg_gbps_min"]) for row in reads),
            max(float(row["agg_gbps_max"]) for row in reads))
    last_rank_s = statistics.median(float(row["time_to_last_rank_s"])
                                    for row in rows if row["op"] == "restore")
    # stampede asks mincore only after a cold eviction: empty in warm and direct rows
    resident = [float(row["cache_resident_pct"]) for row in reads if row["cache_resident_pct"]]
    return read, last_rank_s, median_min_max(resident) if resident else NOT_MEASURED


def measure(scratch: Path, nranks: int, args: argparse.Namespace, fio: str | None) -> list[ModeResult]:
    """Prepare once, then every mode on the same files in alternating rounds."""
    job = write_job(scratch, nranks, args.size_bytes)
    root = scratch / f"ckpt_np{nranks}"
    files = [root / shard_path(rank, nranks) for rank in range(nranks)]
    run_stampede("prepare", job, nranks)
    samples = {mode: ReferenceSamples([], [], []) for mode in args.mode_list}
    for round_number in range(args.rounds):
        for mode in args.mode_list:
            archive = archive_for(scratch, nranks, mode)
            if round_number % 2:   # alternate who goes first, so drifting load hits both sides
                stampede_round(mode, job, root, files, archive, args)
            reference_round(mode, root, files, args, samples[mode], fio)
            if round_number % 2 == 0:
                stampede_round(mode, job, root, files, archive, args)
        print(f"  {nranks} rank(s): round {round_number + 1} of {args.rounds} done", flush=True)
    run_stampede("clean", job, 1)
    results = []
    for mode in args.mode_list:
        read, last_rank_s, resident = stampede_results(archive_for(scratch, nranks, mode))
        reference = samples[mode]
        results.append(ModeResult(
            nranks, mode, read, last_rank_s, resident, median_min_max(reference.dd_gbps),
            median_min_max(reference.resident_pct),
            median_min_max(reference.fio_gbps) if reference.fio_gbps else None))
    return results


# --- the table and what it means ----------------------------------------------------------

NOT_MEASURED: MedianMinMax = (math.nan, math.nan, math.nan)


def percent_text(summary: MedianMinMax) -> str:
    """`median` of a residency, with (min-max) when they are a point or more apart."""
    median, low, high = summary
    if math.isnan(median):
        return "-"
    return f"{median:.0f}" if high - low < 1 else f"{median:.0f} ({low:.0f}-{high:.0f})"


def gbps_text(summary: Gbps) -> str:
    """`median (min-max)` GB/s."""
    return f"{summary[0]:6.2f} ({summary[1]:5.2f}-{summary[2]:5.2f})"


def print_table(results: list[ModeResult]) -> None:
    """Per rank count and mode: stampede and the references side by side, with res%; the
    fio columns only where fio ran."""
    with_fio = any(result.fio_gbps for result in results)
    fio_header = f" {'fio GB/s':>21} {'read/fio':>8}" if with_fio else ""
    header = (f"{'ranks':>5} {'mode':<9} {'stampede read GB/s':>21} {'last rank s':>11} "
              f"{'res%':>5} {'dd GB/s':>21} {'read/dd':>7}{fio_header} {'ref res%':>8}  note")
    print(header)
    print("-" * len(header))
    for result in results:
        read, dd, fio = result.read_gbps, result.dd_gbps, result.fio_gbps
        fio_cells = (f" {gbps_text(fio):>21} {read[0] / fio[0]:>8.3f}" if fio else
                     f" {'-':>21} {'-':>8}") if with_fio else ""
        noisy = max(relative_spread(summary) for summary in (read, dd, fio) if summary) > NOISY_SPREAD
        print(f"{result.nranks:>5} {result.mode:<9} {gbps_text(read):>21} "
              f"{result.last_rank_s:>11.3f} {percent_text(result.resident_pct):>5} "
              f"{gbps_text(dd):>21} {read[0] / dd[0]:>7.3f}{fio_cells} "
              f"{percent_text(result.reference_resident_pct):>8}  "
              f"{'noisy: rerun on a quiet machine' if noisy else ''}".rstrip())


def cold_notes(results: list[ModeResult], scratch: Path) -> list[str]:
    """Per rank count: how far below warm cold and direct were, and why cold may not be
    the disk's speed (a cache below this kernel, or an eviction that did not take)."""
    device = mount_of(scratch).device
    notes = []
    for nranks in sorted({result.nranks for result in results}):
        by_mode = {result.mode: result for result in results if result.nranks == nranks}
        warm = by_mode.get("warm")
        if warm and warm.reference_resident_pct[0] < WARM_RESIDENT_MIN:
            notes.append(f"{nranks} rank(s): warm was not all warm: "
                         f"{warm.reference_resident_pct[0]:.0f}% of the bytes were in the page "
                         "cache before dd (memory pressure may have evicted some)")
        for mode in ("cold", "cold+drop", "direct"):
            if warm is None or mode not in by_mode:
                continue
            this = by_mode[mode]
            shares = (this.read_gbps[0] / warm.read_gbps[0], this.dd_gbps[0] / warm.dd_gbps[0])
            notes.append(f"{nranks} rank(s): {mode} = {shares[0]:.2f} x warm for stampede, "
                         f"{shares[1]:.2f} x warm for dd")
            if mode == "direct" or max(shares) < COLD_LIKE_WARM:
                continue
            if max(value for value in (this.resident_pct[2], this.reference_resident_pct[2])
                   if not math.isnan(value)) > COLD_RESIDENT_MAX:
                notes.append(f"  {mode} was not cold: up to {this.resident_pct[2]:.0f}% "
                             f"(stampede) / {this.reference_resident_pct[2]:.0f}% (dd) of the "
                             "bytes were still in the page cache after eviction")
            else:
                notes.append(f"  {mode} ~ warm although ~0% was in this kernel's page cache: "
                             "the reads were served by a cache below it. On a virtual machine "
                             f"that is the host caching under the virtual disk ({device}), "
                             "which makes cold reads ~0.7-2 GB/s on this project's VMs and "
                             "can bring them near warm: cold here measures that cache, not "
                             "the storage device")
    if VIRTUAL_DISK.match(device) and any(r.mode.startswith("cold") for r in results):
        notes.append(f"scratch is on {device}, a virtual disk: the host may cache beneath it, "
                     "so cold and direct here are that path's speed, not a physical disk's")
    return notes


def main() -> int:
    """Measure every rank count in a fresh scratch directory, print the table, clean up."""
    args = parse_args()
    fio = shutil.which("fio")
    with scratch_directory("stampede-cache-modes-", args.dir) as scratch:
        print(machine_facts(scratch, fio))
        print(f"cache_modes: {args.size} {LAYOUT}, 4 MiB blocks, ranks {args.ranks}, modes "
              f"{','.join(args.mode_list)}; {args.rounds} round(s) of stampede "
              f"{args.iterations} iteration(s) (+1 warmup) and dd{'/fio' if fio else ''} "
              f"{args.repeats} repeat(s)" + (f"; {args.skipped}" if args.skipped else "")
              + ("" if fio else "; fio not installed: skipped"), flush=True)
        results = [result for nranks in args.rank_counts for result in measure(scratch, nranks, args, fio)]
        print()
        print_table(results)
        print("GB = 1e9 B; medians with (min-max) over all rounds; read/dd, read/fio = median "
              "stampede read GB/s / median reference GB/s;\nlast rank s = stampede restore time "
              "to last rank (barrier exit to the slowest rank's last byte, open and close "
              "included);\nres% = share of the bytes to read in the page cache when the phase "
              "started (mincore, after eviction): stampede's cache_resident_pct (cold runs "
              "only: '-' where stampede does not ask), and the same measured before each "
              "dd/fio read (ref res%)")
        for note in cold_notes(results, scratch):
            print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
