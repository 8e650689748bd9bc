"""checkpoint.prefetch, cold: an existing safetensors checkpoint restored with and without
the large-read prefetch, in alternating rounds of one run, and the ratio of their times.

The script writes one safetensors file (--size, default 512 MiB, --tensors tensors of
equal size, F32) and restores it in place (`checkpoint.source = "existing"`) with
`mpiexec -n --ranks stampede run`, run.cache = cold (every file a rank reads evicted
before each iteration), --block-size requests (default 1 MiB, a loader's size: small
enough for the disk to idle between them without a prefetch), under --assign (default
tensor-slices). Each of --rounds rounds runs once without the prefetch
(checkpoint.prefetch = 0) and once with it (--window, default 64 MiB), the order
alternating so a drift of the machine falls on both.

Printed: each run's median time to last rank over its iterations, then per setting the
median over rounds (min-max), and the ratio without / with (above 1: the prefetch made
the cold restore faster). Read amplification is printed too: a prefetch reads no byte the
restore did not need, so both say 1.00x. GB = 1e9 bytes. A busy machine widens the
spread: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

from common import (
    add_scratch_parent_option,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    read_archive,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.units import parse_size

CHUNK_BYTES = 16 * 1024 * 1024   # written a chunk at a time, never held whole


def parse_args() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="512MiB", help="checkpoint size (default 512MiB)")
    parser.add_argument("--tensors", type=int, default=8, help="tensors (default 8)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--assign", default="tensor-slices",
                        help="checkpoint.assign policy (default tensor-slices)")
    parser.add_argument("--block-size", default="1MiB", help="request size (default 1MiB)")
    parser.add_argument("--window", default="64MiB", help="checkpoint.prefetch (default 64MiB)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="measured iterations per run (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes = parse_size(args.size)
        args.window_bytes = parse_size(args.window)
        parse_size(args.block_size)
    except ValueError as error:
        parser.error(str(error))
    if args.tensors < 1 or args.ranks < 1 or args.rounds < 1 or args.window_bytes <= 0:
        parser.error("--tensors, --ranks, --rounds and --window must be positive")
    return args


def write_safetensors(path: Path, size_bytes: int, tensors: int) -> None:
    """`tensors` F32 tensors of equal size (rows of 1,024 elements), their bytes a pattern."""
    elements = max(size_bytes // tensors // 4 // 1024, 1) * 1024
    header, offset = {}, 0
    for index in range(tensors):
        header[f"layer.{index}.weight"] = {"dtype": "F32", "shape": [elements // 1024, 1024],
                                           "data_offsets": [offset, offset + elements * 4]}
        offset += elements * 4
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    pattern = bytes(range(256)) * (CHUNK_BYTES // 256)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(text)) + text)
        left = offset
        while left:
            stream.write(pattern[:min(left, CHUNK_BYTES)])
            left -= min(left, CHUNK_BYTES)


def one_run(scratch: Path, job: Path, args: argparse.Namespace, window: int,
            number: int) -> tuple[float, float]:
    """(median time to last rank, read amplification) of one run."""
    archive = scratch / f"run-{number}.csv"
    run_stampede("run", job, args.ranks, f"checkpoint.prefetch={window}",
                 f"archive.path={archive}")
    restore = next(row for row in read_archive(archive) if row["op"] == "restore")
    return float(restore["time_to_last_rank_s"]), float(restore["read_amplification"])


def main() -> int:
    args = parse_args()
    with scratch_directory("stampede-prefetch-", args.dir) as scratch:
        print(f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; load average "
              f"{load_average_text()}")
        print(f"prefetch_cold: {args.size} in {args.tensors} tensors, {args.ranks} ranks, "
              f"assign {args.assign}, {args.block_size} requests, prefetch {args.window}, "
              f"cold, {args.iterations} iterations, {args.rounds} rounds", flush=True)
        (scratch / "ckpt").mkdir()   # the archives never lie beside the checkpoint
        checkpoint = scratch / "ckpt" / "model.safetensors"
        write_safetensors(checkpoint, args.size_bytes, args.tensors)
        job = write_job_toml(scratch / "prefetch.toml", {
            "target": {"path": checkpoint},
            "checkpoint": {"source": "existing", "assign": [args.assign],
                           "block_size": args.block_size},
            "run": {"iterations": args.iterations, "warmup": 1, "cache": "cold"},
            "archive": {"path": scratch / "results.csv"},
        })
        times: dict[int, list[float]] = {0: [], args.window_bytes: []}
        amplification: dict[int, float] = {}
        number = 0
        for round_index in range(args.rounds):
            order = [0, args.window_bytes] if round_index % 2 == 0 else [args.window_bytes, 0]
            for window in order:
                seconds, amplification[window] = one_run(scratch, job, args, window, number)
                number += 1
                times[window].append(seconds)
                print(f"round {round_index + 1}: prefetch {window:>11,} B: time to last rank "
                      f"{seconds * 1e3:8.1f} ms, read ampl {amplification[window]:.2f}x",
                      flush=True)
        without, with_prefetch = (median_min_max(times[0]),
                                  median_min_max(times[args.window_bytes]))
        print()
        for label, (median, low, high) in (("no prefetch", without),
                                           (f"prefetch {args.window}", with_prefetch)):
            print(f"{label:<16} {median * 1e3:8.1f} ms ({low * 1e3:.1f}-{high * 1e3:.1f}), "
                  f"{args.size_bytes / median / 1e9:.2f} GB/s")
        print(f"ratio no prefetch / prefetch: {without[0] / with_prefetch[0]:.2f} "
              "(medians over rounds; above 1: the prefetch made the cold restore faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
