"""Checkpoint writes: `stampede save` versus the real DLIO (dlio-benchmark from PyPI), same
files per rank, same directory's file system, alternating rounds, one run.

PyPI's dlio-benchmark is 2.0.0 (2024), older than MLPerf Storage's checkpointing
workload: its checkpoint is written inside a training loop, every rank its own
`model-E-S-R.pt` (torch.save of one int8 tensor of checkpoint.model_size bytes) with no
fsync and no read phase, and its per_epoch_stats.json gives each checkpoint's duration as
rank 0 saw it, rounded to 10 ms, with no barrier after the writes. So the two sides here:

  DLIO      `mpiexec -n N dlio_benchmark` of a workload generated here (a tiny npz
            dataset, one step between checkpoints, --checkpoints of them; layers and
            optimizer states off, so each rank writes one file of --size bytes); GB/s =
            N x the file's bytes / rank 0's duration, per checkpoint; the round's median.
  stampede  `mpiexec -n N stampede save` of the sharded layout, checkpoint.size_per_rank
            = --size (one file per rank), save.durability = none (DLIO 2.0 does not
            fsync: both sides hand the bytes to the page cache), validate none, keep 1,
            --checkpoints saves: GB/s = N x --size / the `save` op's time to last rank
            (phase start to the last rank's last write and rename), the round's median.

The definitions differ, in stampede's disfavour: DLIO's duration is rank 0's alone, and
stampede's the slowest rank's; stampede also creates a temporary name and renames it
(the save's atomic publish), DLIO opens the final name. DLIO pickles: torch.save wraps the
tensor in a zip archive (the file is ~1.5 KiB larger) and writes it through Python's
buffered file object: the script also times torch.save of the same state into memory
(no storage), DLIO's ceiling on this CPU. The ratio stampede/DLIO is printed with both
medians; within 10% where the definitions agree is the target; how far apart they are is
printed, never an exit status.

DLIO lives in a scratch venv (--dlio-venv, created when missing; never the project's
venv): pip install --no-deps dlio-benchmark==2.0.0, then hydra-core omegaconf pandas
psutil pydftracer==1.0.2 PyYAML Pillow h5py mpi4py mpich torch tensorflow-cpu. GB = 1e9.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import (
    add_scratch_parent_option,
    archive_rows,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    run_checked,
    run_stampede,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

from stampede.units import format_bytes, parse_size

WITHIN = 0.10   # where the definitions agree, the sides should be this close
DLIO_PACKAGES = ("hydra-core", "omegaconf", "pandas", "psutil", "pydftracer==1.0.2", "PyYAML",
                 "Pillow", "h5py", "mpi4py", "mpich", "torch", "tensorflow-cpu")
WORKLOAD = """\
model: stampede_compare
framework: pytorch
workflow: {{generate_data: True, train: True, checkpoint: True}}
dataset: {{data_folder: {data}, format: npz, num_files_train: {files},
          num_samples_per_file: 1, record_length: 4096}}
reader: {{data_loader: pytorch, batch_size: 1, read_threads: 1}}
train: {{epochs: 1, computation_time: 0.0}}
checkpoint: {{checkpoint_folder: {checkpoints}, steps_between_checkpoints: 1,
             model_size: {size}, type: all_ranks, num_layers: 0, layer_parameters: [],
             optimization_groups: []}}
output: {{folder: {output}}}
"""


def ensure_dlio(venv: Path) -> Path:
    """The scratch venv's dlio_benchmark, installed there first when missing."""
    program = venv / "bin" / "dlio_benchmark"
    if program.exists():
        return program
    print(f"installing dlio-benchmark 2.0.0 into {venv} (a scratch venv)", file=sys.stderr)
    run_checked([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "pip"), "install", "-q"]
    run_checked([*pip, "--no-deps", "dlio-benchmark==2.0.0"])
    run_checked([*pip, *DLIO_PACKAGES])
    return program


def dlio_round(program: Path, scratch: Path, nranks: int, size: int, checkpoints: int) -> float:
    """One DLIO run: the median GB/s of its checkpoints."""
    run = scratch / "dlio"
    subprocess.run(["rm", "-rf", str(run)], check=True)
    (run / "conf" / "workload").mkdir(parents=True)
    (run / "conf" / "workload" / "compare.yaml").write_text(WORKLOAD.format(
        data=run / "data", files=nranks * checkpoints, checkpoints=run / "ckpt", size=size,
        output=run / "out"))
    mpiexec = program.parent / "mpiexec"
    run_checked([str(mpiexec), "-n", str(nranks), str(program), "--config-dir",
                 str(run / "conf"), "workload=compare", f"hydra.run.dir={run / 'hydra'}"])
    files = sorted((run / "ckpt").glob("model-*.pt"))
    file_bytes = files[0].stat().st_size
    stats = json.loads((run / "out" / "per_epoch_stats.json").read_text())
    durations = [float(entry["duration"]) for epoch in stats.values() if isinstance(epoch, dict)
                 for key, entry in epoch.items() if key.startswith("ckpt")]
    return statistics.median(nranks * file_bytes / seconds / 1e9 for seconds in durations)


TORCH_SAVE = """\
import io, statistics, sys, time, torch
size = int(sys.argv[1])
state = {"a": torch.randint(high=1, size=(size,), dtype=torch.int8)}   # DLIO's tensor
times = []
for _ in range(3):
    start = time.perf_counter()
    torch.save(state, io.BytesIO())
    times.append(time.perf_counter() - start)
print(size / statistics.median(times) / 1e9)
"""


def torch_save_gbps(program: Path, size: int) -> float:
    """torch.save of DLIO's state into memory, one process: the CPU cost of its writes
    (pickling, the zip container's CRC-32), with no storage under it."""
    return float(run_checked([str(program.parent / "python"), "-c", TORCH_SAVE, str(size)]))


def stampede_round(scratch: Path, nranks: int, size: int, checkpoints: int) -> float:
    target, archive = scratch / "stampede", scratch / "stampede.csv"
    subprocess.run(["rm", "-rf", str(target), str(archive), str(scratch / "stampede.runs")],
                   check=True)
    job = write_job_toml(scratch / "save.toml", {
        "target": {"path": target},
        "checkpoint": {"size_per_rank": str(size), "layout": ["sharded"], "block_size": "4MiB"},
        "run": {"iterations": checkpoints, "warmup": 0},
        "save": {"durability": "none", "validate": "none", "keep": 1},
        "archive": {"path": archive}})
    run_stampede("save", job, nranks)
    row = next(row for row in archive_rows(archive) if row["op"] == "save")
    return nranks * size / float(row["time_to_last_rank_s"]) / 1e9


def main() -> None:
    parser = docstring_parser(__doc__)
    parser.add_argument("--size", default="256MiB", help="bytes each rank writes per checkpoint")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=3, help="checkpoints per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dlio-venv", default="/tmp/dlio-venv",
                        help="the scratch venv holding DLIO (created when missing)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    size = parse_size(args.size)
    program = ensure_dlio(Path(args.dlio_venv))
    sides: dict[str, list[float]] = {"stampede": [], "dlio": []}
    with scratch_directory("stampede-vs-dlio-", args.dir) as scratch:
        print(f"{machine_text(with_ram=True)}; {scratch_text(scratch)}; {args.ranks} ranks x "
              f"{format_bytes(size)} per checkpoint, {args.checkpoints} checkpoints x "
              f"{args.rounds} rounds", flush=True)
        for index in range(args.rounds):
            order = ("stampede", "dlio") if index % 2 == 0 else ("dlio", "stampede")
            for side in order:
                gbps = stampede_round(scratch, args.ranks, size, args.checkpoints) \
                    if side == "stampede" else \
                    dlio_round(program, scratch, args.ranks, size, args.checkpoints)
                sides[side].append(gbps)
                print(f"round {index + 1} {side:>8}: {gbps:.3f} GB/s", flush=True)
        print(load_average_text())
        in_memory = torch_save_gbps(program, size)
    ours, theirs = median_min_max(sides["stampede"]), median_min_max(sides["dlio"])
    ratio = ours[0] / theirs[0]
    print(f"stampede save (buffered, time to last rank): {ours[0]:.3f} GB/s "
          f"({ours[1]:.3f}-{ours[2]:.3f})")
    print(f"DLIO 2.0.0 checkpoint (torch.save, rank 0's duration): {theirs[0]:.3f} GB/s "
          f"({theirs[1]:.3f}-{theirs[2]:.3f})")
    print(f"torch.save of one rank's state into memory (no storage): {in_memory:.3f} GB/s per "
          f"process, {args.ranks} processes on {os.cpu_count()} CPUs: at most "
          f"{in_memory * min(args.ranks, os.cpu_count() or 1):.3f} GB/s, DLIO's ceiling here")
    apart = "within 10%" if abs(ratio - 1) <= WITHIN else f"{100 * abs(ratio - 1):.0f}% apart"
    print(f"ratio stampede/DLIO: {ratio:.2f} ({apart}; the definitions differ: DLIO times rank "
          "0 alone and serializes with torch.save, in-memory rate above; stampede times the "
          "slowest rank, writes raw bytes and renames a temporary name)")


if __name__ == "__main__":
    main()
