"""The device check, prepared for the first GPU this project is lent: one script that runs
in under 4 minutes on one GPU and prints every number beside its reference, measured in
the same run, as a ratio, with the device named.

  h2d pageable, pinned  `stampede gpu --modes pageable,pinned` (the copy of an aligned host
                        buffer, CUDA events: size / p50) vs torch's own copy loop (a
                        pageable or pinned torch tensor .copy_() to the device, CUDA
                        events, median), and nvbandwidth's host_to_device_memcpy_ce when
                        `nvbandwidth` is on PATH
  file -> HBM (bounce)  `stampede gpu --modes file` (cold: evicted before each trial; read
                        into a page-locked buffer, then the copy; slowest rank's GB/s) vs
                        min(storage, link): storage = the same size read cold here with
                        os.preadv into an aligned buffer, link = torch's pinned copy above
  file -> HBM (gds)     `--modes gds` (kvikio's CuFile straight to HBM) vs the same bound,
                        where kvikio is installed; its compatibility mode is labelled NOT GDS
  safetensors -> HBM    `--modes safetensors` (safe_open(device=cuda) + get_tensor) vs the
                        same bound
  NCCL init, broadcast  bare torch at the GPU count present, one rank per GPU under the
                        venv's mpiexec: init_process_group("nccl", device_id=...) (eager:
                        the communicator is made there) and broadcasts of the size, first
                        and steady (1 GPU: a self-broadcast); with 2+ GPUs also stampede's
                        broadcast layout with run.exchange = torch (ops pg_init,
                        bcast_first, bcast) vs those bare numbers

Budget: --budget-s (default 220 s) for everything. Each step states its worst case and is
skipped, saying so, when what is left would not cover it; each command runs under the
time left. --quick: 256 MiB instead of 1 GiB, 3 trials instead of 5. --dry-run lists the
steps and commands without running them, and so does a machine without a CUDA device
(or without torch): it prints "no CUDA device visible", what it would run, and exits 0.
GB = 1e9 B. The script exits non-zero only when a command it runs fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    VENV_BIN,
    add_scratch_parent_option,
    archive_rows,
    docstring_parser,
    machine_text,
    mpiexec_command,
    scratch_directory,
    scratch_text,
    write_job_toml,
)

MiB = 2**20
BLOCK_BYTES = 16 * MiB          # stampede gpu's file-mode block, and the storage reference's
NO_DEVICE = "no CUDA device visible"
NCCL_SOURCE = r'''
import json, socket, statistics, sys, time
from datetime import timedelta
from mpi4py import MPI
import torch, torch.distributed as dist

size, repeats = int(sys.argv[1]), int(sys.argv[2])
comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()
device = torch.device("cuda", rank % torch.cuda.device_count())
torch.cuda.set_device(device)
if rank == 0:
    with socket.socket() as probe:
        probe.bind(("", 0))
        address = (socket.gethostname(), probe.getsockname()[1])
address = comm.bcast(address if rank == 0 else None)
tensor = torch.full((size,), rank, dtype=torch.uint8, device=device)
comm.Barrier()
start = time.perf_counter()
dist.init_process_group("nccl", init_method=f"tcp://{address[0]}:{address[1]}", rank=rank,
                        world_size=nranks, timeout=timedelta(seconds=120), device_id=device)
init_s = time.perf_counter() - start
seconds = []
for _ in range(1 + repeats):
    comm.Barrier()
    start = time.perf_counter()
    dist.broadcast(tensor, src=0)
    torch.cuda.synchronize(device)
    seconds.append(time.perf_counter() - start)
ok = bool((tensor == 0).all())
dist.destroy_process_group()
everyone = comm.gather((init_s, seconds, ok), root=0)
if rank == 0:
    print(json.dumps({"init_s": max(e[0] for e in everyone),
                      "first_s": max(e[1][0] for e in everyone),
                      "steady_s": statistics.median(max(e[1][i] for e in everyone)
                                                    for i in range(1, 1 + repeats)),
                      "ok": all(e[2] for e in everyone)}))
'''


@dataclass
class Check:
    """One step: what it measures, its worst case, and what it runs (for the listing)."""

    name: str
    worst_s: float
    runs: str
    action: Callable[[Context], None]


@dataclass
class Context:
    """What the steps share: options, the scratch directory, the clock, the device, what
    earlier steps measured (the link's pinned GB/s, the storage's)."""

    size: int
    trials: int
    budget_s: float
    scratch: Path
    started: float = field(default_factory=time.monotonic)
    device: str = ""
    gpus: int = 0
    measured: dict[str, float] = field(default_factory=dict)

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


def parse_args() -> Any:
    parser = docstring_parser(__doc__)
    parser.add_argument("--budget-s", type=float, default=220.0,
                        help="time for the whole check, seconds (default 220: under 4 minutes)")
    parser.add_argument("--quick", action="store_true", help="256 MiB and 3 trials")
    parser.add_argument("--dry-run", action="store_true", help="list the steps, run nothing")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    if not args.budget_s > 0:
        parser.error("--budget-s must be > 0")
    args.size, args.trials = (256 * MiB, 3) if args.quick else (1024 * MiB, 5)
    return args


def probe_device() -> tuple[str, int]:
    """(device name, GPU count), or ("", 0) with the reason printed."""
    try:
        import torch
    except ImportError:
        print(f"{NO_DEVICE}: torch is not installed (pip install -e '.[gpu]')")
        return "", 0
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"{NO_DEVICE} (torch {torch.__version__}: torch.cuda.is_available() is False)")
        return "", 0
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(index) for index in range(count)})
    return f"{count} x {' / '.join(names)} (torch {torch.__version__}, CUDA {torch.version.cuda})", count


# --- the steps -------------------------------------------------------------------------

def stampede_gpu(context: Context, modes: str, label: str) -> list[dict[str, str]]:
    """`stampede gpu --device cuda` of one size; its archive's rows."""
    archive = context.scratch / f"gpu-{label}.csv"
    command = [str(VENV_BIN / "python"), "-m", "stampede", "gpu", "--device", "cuda", "--sizes",
               str(context.size), "--modes", modes, "--trials", str(context.trials),
               "--dir", str(context.scratch / "files"), "--archive", str(archive)]
    run_within(context, command)
    return archive_rows(archive)


def run_within(context: Context, command: list[str]) -> str:
    """Run a command under the time left; its stdout. A failure ends the script."""
    try:
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=max(context.left_s(), 1.0))
    except subprocess.TimeoutExpired:
        raise SystemExit(f"budget: {' '.join(command[:6])} ... ran past --budget-s") from None
    if result.returncode:
        sys.stderr.write(f"FAILED ({result.returncode}): {' '.join(command)}\n"
                         f"{result.stdout[-3000:]}{result.stderr[-3000:]}")
        raise SystemExit(result.returncode)
    return result.stdout


def row_of(rows: list[dict[str, str]], layout: str, op: str) -> dict[str, str]:
    return next(row for row in rows if row["layout"] == layout and row["op"] == op)


def report(name: str, ours_gbps: float, reference_gbps: float, reference: str,
           device: str) -> None:
    """One line: stampede's GB/s, the reference's, their ratio, the device."""
    ratio = ours_gbps / reference_gbps if reference_gbps > 0 else float("nan")
    print(f"  {name:<24} stampede {ours_gbps:8.3f} GB/s   {reference:<34} "
          f"{reference_gbps:8.3f} GB/s   ratio {ratio:5.2f}   [{device}]", flush=True)


def torch_copy_gbps(size: int, pinned: bool, trials: int) -> float:
    """torch's own loop: a host tensor .copy_() to the device, CUDA events, median."""
    import torch

    host = torch.full((size,), 0x5A, dtype=torch.uint8, pin_memory=pinned)
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    device.copy_(host)   # first touch and warm-up, untimed
    seconds = []
    for _ in range(trials):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        device.copy_(host, non_blocking=pinned)
        end.record()
        end.synchronize()
        seconds.append(begin.elapsed_time(end) / 1e3)
    return size / statistics.median(seconds) / 1e9


def check_h2d(context: Context) -> None:
    rows = stampede_gpu(context, "pageable,pinned", "h2d")
    for mode, pinned in (("pageable", False), ("pinned", True)):
        h2d = row_of(rows, mode, "h2d")
        ours = context.size / float(h2d["lat_p50_s"]) / 1e9
        theirs = torch_copy_gbps(context.size, pinned, context.trials)
        context.measured[mode] = theirs
        report(f"h2d {mode}", ours, theirs, "torch copy loop", h2d["device"])
    nvbandwidth = shutil.which("nvbandwidth")
    if nvbandwidth is None:
        print("  nvbandwidth: not on PATH, not compared")
        return
    output = run_within(context, [nvbandwidth, "-t", "host_to_device_memcpy_ce"])
    found = re.search(r"SUM\s+host_to_device_memcpy_ce\s+([\d.]+)", output)
    if found is None:
        print(f"  nvbandwidth: no SUM line in its output: {output[-300:]!r}")
        return
    pinned = row_of(rows, "pinned", "h2d")
    report("h2d pinned", context.size / float(pinned["lat_p50_s"]) / 1e9, float(found[1]),
           "nvbandwidth host_to_device_ce", pinned["device"])


def storage_gbps(context: Context) -> float:
    """The same size read cold with os.preadv into an aligned buffer, median of 3."""
    import mmap

    from stampede.backends.posix import PosixBackend

    path = context.scratch / "storage.raw"
    chunk = os.urandom(BLOCK_BYTES)
    with open(path, "wb") as stream:
        for offset in range(0, context.size, BLOCK_BYTES):
            stream.write(chunk[:min(BLOCK_BYTES, context.size - offset)])
        stream.flush()
        os.fsync(stream.fileno())
    buffer = mmap.mmap(-1, BLOCK_BYTES)
    view, seconds = memoryview(buffer), []
    for _ in range(3):
        PosixBackend.evict(path, 0, 0)
        fd = os.open(path, os.O_RDONLY)
        start = time.perf_counter()
        for offset in range(0, context.size, BLOCK_BYTES):
            os.preadv(fd, (view,), offset)
        seconds.append(time.perf_counter() - start)
        os.close(fd)
    view.release()
    buffer.close()
    path.unlink()
    return context.size / statistics.median(seconds) / 1e9


def bound(context: Context) -> tuple[float, str]:
    """min(storage read GB/s measured here, the link's pinned GB/s measured here)."""
    if "storage" not in context.measured:
        context.measured["storage"] = storage_gbps(context)
        print(f"  storage read here (cold, os.preadv): {context.measured['storage']:.3f} GB/s",
              flush=True)
    storage, link = context.measured["storage"], context.measured.get("pinned", float("inf"))
    return min(storage, link), "min(storage, link)" + (" = storage" if storage <= link else " = link")


def check_files(context: Context) -> None:
    import importlib.util

    modes = ["file", "safetensors"] + (["gds"] if importlib.util.find_spec("kvikio") else [])
    if "gds" not in modes:
        print("  file -> HBM (gds): kvikio is not installed, not measured "
              "(pip install -e '.[gds]')")
    reference, what = bound(context)
    rows = stampede_gpu(context, ",".join(modes), "files")
    names = {"file": "file -> HBM (bounce)", "gds": "file -> HBM (gds)",
             "safetensors": "safetensors -> HBM"}
    for mode in modes:
        restore = row_of(rows, mode, "restore")
        report(names[mode], float(restore["slowest_rank_gbps"]), reference, what,
               restore["device"])
        for warning in filter(None, restore.get("warnings", "").split(" | ")):
            if "GDS" in warning:
                print(f"    warning: {warning}")


def check_nccl(context: Context) -> None:
    source = context.scratch / "nccl_ref.py"
    source.write_text(NCCL_SOURCE)
    output = run_within(context, mpiexec_command(context.gpus, str(VENV_BIN / "python"),
                                                 str(source), str(context.size),
                                                 str(context.trials)))
    bare = json.loads(output.strip().splitlines()[-1])
    print(f"  NCCL init_process_group, {context.gpus} rank(s): {bare['init_s']:.3f} s (last "
          f"rank); broadcast of {context.size / MiB:.0f} MiB first {bare['first_s'] * 1e3:.2f} "
          f"ms, steady {bare['steady_s'] * 1e3:.2f} ms"
          + ("" if bare["ok"] else "  BYTES WRONG") + f"   [{context.device}]", flush=True)
    if context.gpus < 2:
        print("  stampede's nccl exchange needs 2+ GPUs (a broadcast group of 2 replicas; NCCL "
              "takes one rank per GPU): not compared on 1")
        return
    rows = stampede_nccl(context)
    ops = {row["op"]: row for row in rows if row["layout"] == "broadcast"}
    # elapsed = max stop - min start over ranks (median over iterations): the bare side's
    # slowest rank, as both start together after a barrier
    report("NCCL broadcast (steady)", context.size / float(ops["bcast"]["elapsed_s"]) / 1e9,
           context.size / bare["steady_s"] / 1e9, "bare broadcast, steady", ops["bcast"]["device"])
    init_s, first_s = float(ops["pg_init"]["elapsed_s"]), float(ops["bcast_first"]["elapsed_s"])
    print(f"  NCCL init: stampede pg_init {init_s:.3f} s vs bare {bare['init_s']:.3f} s, ratio "
          f"{bare['init_s'] / init_s:.2f}; first broadcast {first_s * 1e3:.2f} ms vs bare "
          f"{bare['first_s'] * 1e3:.2f} ms, ratio {bare['first_s'] / first_s:.2f} (bare / stampede)")


def stampede_nccl(context: Context) -> list[dict[str, str]]:
    """stampede's broadcast layout over nccl: one group of every GPU's rank."""
    job = write_job_toml(context.scratch / "nccl.toml", {
        "target": {"path": context.scratch / "ckpt"},
        "checkpoint": {"size": context.size, "layout": "broadcast", "replicas": context.gpus,
                       "block_size": BLOCK_BYTES},
        "run": {"cache": "warm", "iterations": context.trials, "warmup": 1, "exchange": "torch",
                "h2d": "cuda-pinned", "verify": "xxh3"},
        "archive": {"path": context.scratch / "nccl.csv"}})
    for step in ("prepare", "run"):
        run_within(context, mpiexec_command(context.gpus, str(VENV_BIN / "stampede"), step,
                                            str(job)))
    return archive_rows(context.scratch / "nccl.csv")


def checks(size: int) -> list[Check]:
    shown = f"{size / MiB:.0f}MiB"
    gpu = f"stampede gpu --device cuda --sizes {shown}"
    return [
        Check("h2d pageable, pinned", 40, f"{gpu} --modes pageable,pinned; torch's copy loop; "
              "nvbandwidth -t host_to_device_memcpy_ce (if on PATH)", check_h2d),
        Check("file / gds / safetensors -> HBM", 90, f"a cold os.preadv read of {shown}; {gpu} "
              "--modes file,safetensors[,gds]", check_files),
        Check("NCCL init, broadcast", 60, f"mpiexec -n GPUS python nccl_ref.py {shown}; with 2+ "
              "GPUs: stampede prepare/run of a broadcast job, run.exchange=torch, "
              "run.h2d=cuda-pinned", check_nccl),
    ]


def main() -> int:
    args = parse_args()
    with scratch_directory("stampede-gpu-check-", args.dir) as scratch:
        context = Context(args.size, args.trials, args.budget_s, scratch)
        print(f"gpu_check: {machine_text(with_ram=True)}; {scratch_text(scratch)}; budget "
              f"{args.budget_s:g} s, {args.size / MiB:.0f} MiB, {args.trials} trials", flush=True)
        context.device, context.gpus = ("", 0) if args.dry_run else probe_device()
        steps = checks(args.size)
        if not context.gpus:
            print("dry run: on a CUDA device this check would run, in order:")
            for step in steps:
                print(f"  - {step.name} (worst case {step.worst_s:g} s): {step.runs}")
            worst_s = sum(step.worst_s for step in steps)
            print(f"worst cases: {worst_s:g} s of the {args.budget_s:g} s budget (a step that "
                  "would not fit in what is left is skipped, saying so)")
            return 0
        print(f"device: {context.device}", flush=True)
        for step in steps:
            if context.left_s() < step.worst_s:
                print(f"{step.name}: skipped, {context.left_s():.0f} s left of the budget "
                      f"< its worst case {step.worst_s:g} s")
                continue
            print(f"{step.name}:", flush=True)
            step.action(context)
        print(f"done in {time.monotonic() - context.started:.0f} s of {args.budget_s:g} s; "
              "ratio = stampede / reference (1.00: no overhead of its own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
