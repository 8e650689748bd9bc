"""The goal of issue 40 in one run: every layout's read amplification and its efficiency
against the node's raw-read ceiling, cold, side by side.

The script prepares one checkpoint (--size, default 1 GiB, --replicas copies of each
shard, default 2, so that a layout that reads a shard once for its replicas shows it),
then runs `mpiexec -n --ranks stampede run` once (default 4 ranks) with run.cache = cold,
run.ceiling = true and every layout of stampede.layouts.TABLE that reads the prepared
checkpoint (all but a workload's own files; at --replicas 1, none of those made for
replicas, which stampede refuses there): before the first layout, the node's raw
ceiling (its share of the checkpoint read cold by 1, 4, 16 and 32 streams of 8 MiB
requests, 3 times each, the best stream count's median GB/s); then each layout,
--block-size requests (default 8 MiB).

Printed per layout, from the archive's restore rows: read amplification (bytes from
storage over the unique bytes needed, per iteration), agg GB/s (the ranks' bytes over the
time to the last rank), storage GB/s per node, and efficiency = that over the ceiling.

The goal (exit 0 on PASS, 1 on FAIL; FAIL names what missed):
  - the best layout, among those that read at most 1.05x the unique bytes, reaches at
    least 0.9x the ceiling, cold; and
  - the whole-file layout shows its N-fold amplification (at least 0.95 x N at N ranks).
Either can fail: a layout slower than raw reads, or a whole-file that read less than every
byte on every rank (a cache that served it, or a plan that did not read whole files).
GB = 1e9 bytes. A busy machine lowers the efficiencies: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import (
    add_scratch_parent_option,
    docstring_parser,
    load_average_text,
    machine_text,
    read_archive,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.layouts import TABLE
from stampede.units import parse_size

MAX_AMPLIFICATION = 1.05     # the best layout reads at most this over the unique bytes
MIN_EFFICIENCY = 0.9         # ... and reaches at least this of the node's raw ceiling
WHOLE_FILE_SHARE = 0.95      # whole-file reads at least this x N at N ranks


@dataclass(frozen=True)
class LayoutResult:
    """One layout's restore row, as the goal reads it."""

    layout: str
    whole_file: bool          # reads every byte on every rank (each_rank_reads_all)
    amplification: float
    agg_gbps: float
    node_storage_gbps: float
    efficiency: float         # storage GB/s per node over the nodes' mean ceiling


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="1GiB", help="checkpoint size (default 1GiB)")
    parser.add_argument("--ranks", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--replicas", type=int, default=2,
                        help="copies of each shard among the ranks (default 2)")
    parser.add_argument("--block-size", default="8MiB", help="restore request size (default 8MiB)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="measured iterations per layout (default 3)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes = parse_size(args.size)
        parse_size(args.block_size)
    except ValueError as error:
        parser.error(str(error))
    if args.ranks < 2 or args.replicas < 1 or args.ranks % args.replicas:
        parser.error(f"--ranks {args.ranks} --replicas {args.replicas}: at least 2 ranks, "
                     "a whole number of replicas of each shard")
    return args


def layouts(replicas: int) -> list[str]:
    """Every layout that reads the prepared checkpoint (not a workload's own files); at one
    replica, not those made for replicas (stampede refuses them: they would be sharded)."""
    return [name for name, layout in TABLE.items() if not layout.workload_files
            and (replicas > 1 or not layout.replica_aware)]


def each_rank_reads_all(name: str) -> bool:
    """Whether every rank reads the whole file (N-fold at N ranks): whole-file, not
    node-once, which TABLE marks whole_file too but where only a node's first rank reads
    it (n-fold at n nodes: 1.0x on this one machine, not a shortfall)."""
    layout = TABLE[name]
    return layout.whole_file and not layout.node_reads


def verdict(results: Sequence[LayoutResult], nranks: int) -> tuple[bool, list[str]]:
    """(passed, what the goal says): the best deduplicating layout against the ceiling,
    and whole-file's amplification against N."""
    said, passed = [], True
    lean = [result for result in results if result.amplification <= MAX_AMPLIFICATION
            and math.isfinite(result.efficiency)]
    best = max(lean, key=lambda result: result.efficiency, default=None)
    if best is None:
        passed = False
        said.append(f"FAIL: no layout read at most {MAX_AMPLIFICATION}x the unique bytes with "
                    "a measured efficiency")
    elif best.efficiency < MIN_EFFICIENCY:
        passed = False
        said.append(f"FAIL: the best layout at <= {MAX_AMPLIFICATION}x, {best.layout} "
                    f"({best.amplification:.2f}x), reached {best.efficiency:.2f}x of the "
                    f"ceiling (goal {MIN_EFFICIENCY}x)")
    else:
        said.append(f"ok: {best.layout} read {best.amplification:.2f}x the unique bytes at "
                    f"{best.efficiency:.2f}x of the ceiling (goal <= {MAX_AMPLIFICATION}x, "
                    f">= {MIN_EFFICIENCY}x)")
    whole = [result for result in results if result.whole_file]
    if not whole:
        passed = False
        said.append("FAIL: no whole-file layout was measured")
    for result in whole:
        if result.amplification >= WHOLE_FILE_SHARE * nranks:
            said.append(f"ok: {result.layout} read {result.amplification:.2f}x at {nranks} "
                        f"ranks (its {nranks}-fold amplification)")
        else:
            passed = False
            said.append(f"FAIL: {result.layout} read {result.amplification:.2f}x at {nranks} "
                        f"ranks, not its {nranks}-fold amplification")
    said.append("PASS" if passed else "FAIL")
    return passed, said


def measure(scratch: Path, args: argparse.Namespace) -> tuple[list[LayoutResult], object]:
    names = layouts(args.replicas)
    archive = scratch / "results.csv"
    job = write_job_toml(scratch / "goal.toml", {
        "target": {"path": scratch / "ckpt"},
        "checkpoint": {"size": args.size, "layout": names, "replicas": args.replicas,
                       "block_size": args.block_size},
        "run": {"iterations": args.iterations, "warmup": 1, "cache": "cold", "ceiling": True},
        "archive": {"path": archive},
    })
    started = time.perf_counter()
    run_stampede("prepare", job, args.ranks)
    print(f"prepared {args.size} x {len(names)} layouts in {time.perf_counter() - started:.0f} s",
          flush=True)
    started = time.perf_counter()
    run_stampede("run", job, args.ranks)
    print(f"ran the ceiling and {len(names)} layouts cold in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    rows = [row for row in read_archive(archive) if row["op"] == "restore"]
    results = []
    for row in rows:
        node_gbps = row["storage_bytes_per_iteration"] / row["nnodes"] / row["storage_s"] / 1e9 \
            if row["storage_s"] and row["storage_s"] > 0 else math.nan
        results.append(LayoutResult(
            row["layout"], each_rank_reads_all(row["layout"]), row["read_amplification"],
            row["agg_gbps"], node_gbps, row["ceiling_efficiency"]))
    return results, rows[0] if rows else None


def print_table(results: Sequence[LayoutResult]) -> None:
    print(f"{'layout':<15} {'read ampl':>9} {'agg GB/s':>9} {'storage GB/s':>13} "
          f"{'vs ceiling':>10}")
    print("-" * 60)
    for result in sorted(results, key=lambda r: -r.efficiency if math.isfinite(r.efficiency)
                         else math.inf):
        print(f"{result.layout:<15} {result.amplification:>8.2f}x {result.agg_gbps:>9.2f} "
              f"{result.node_storage_gbps:>13.2f} {result.efficiency:>9.2f}x")


def stream_steps(reads: Sequence[dict]) -> str:
    """'1: 0.41 0.39 0.44, 4: ...': each stream count's GB/s, every read in the order read."""
    counts: dict[int, list[str]] = {}
    for read in reads:
        gbps = read["gbps"]
        counts.setdefault(read["streams"], []).append("-" if gbps is None else f"{gbps:.2f}")
    return ", ".join(f"{streams}: {' '.join(said)}" for streams, said in counts.items())


def main() -> int:
    args = parse_args()
    with scratch_directory("stampede-goal-", args.dir) as scratch:
        print(f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; load average "
              f"{load_average_text()}")
        print(f"amplification_vs_ceiling: {args.size}, {args.ranks} ranks, {args.replicas} "
              f"replicas, {args.block_size} requests, cold, {args.iterations} iterations",
              flush=True)
        results, row = measure(scratch, args)
        sidecar = read_sidecar(scratch / "results.csv", row)
        print()
        for node in sidecar.get("ceiling", {}).get("nodes", []):
            print(f"raw-read ceiling of {node['host']}: {node['gbps']:.2f} GB/s at "
                  f"{node['best_streams']} streams (GB/s by streams, each read: "
                  f"{stream_steps(node['reads'])}; the best count's median; cold, "
                  f"{node['reads'][0]['bytes_asked']:,} B each)")
        print()
        print_table(results)
        print("read ampl = bytes from storage / unique bytes needed, per iteration; agg GB/s = "
              "the ranks' bytes / time to last rank; storage GB/s = bytes from storage / nodes / "
              "the storage window; vs ceiling = storage GB/s / the node's raw ceiling; "
              "medians over iterations; GB = 1e9 B")
        print()
        passed, said = verdict(results, args.ranks)
        print("\n".join(said))
    return 0 if passed else 1


def read_sidecar(archive: Path, row: object) -> dict:
    import json

    if row is None:
        return {}
    path = archive.parent / f"{archive.stem}.runs" / f"{row['run_id']}.json"  # type: ignore[index]
    return json.loads(path.read_text())


if __name__ == "__main__":
    sys.exit(main())
