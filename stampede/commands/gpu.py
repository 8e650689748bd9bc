"""`stampede gpu`: host -> device copies per rank over a size sweep (the trials are
stampede.run.h2d's; the devices stampede.run.devices'); archived and reported with the
link's peak."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_ARCHIVE, OUTPUT_DIRECTORY, add_output
from stampede.run import h2d
from stampede.run.devices import LINK_PEAKS_GBPS

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.run.h2d import Swept

# The modes each device can run (host has no pinned memory): the defaults work as given.
DEFAULT_MODES = {"cuda": "pageable,pinned,file", "host": "pageable,file"}


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "gpu", formatter_class=formatter,
        help="Time host -> device copies per rank (pageable, pinned, pin+copy, file -> HBM, "
             "safetensors -> HBM, gds: file -> HBM through cuFile) over a size sweep; archive "
             "and report with the link's peak.",
        description="Host -> device copy bandwidth per rank (GPU `local_rank % device_count`).",
        epilog=h2d.__doc__)
    sub.add_argument("--device", default="cuda", choices=("cuda", "host"),
                     help="cuda (PyTorch; exit 2 without a GPU) or host (memcpy, labelled "
                          "as not a GPU: for tests)")
    sub.add_argument("--sizes", default=h2d.DEFAULT_SIZES,
                     help=f"bytes per copy (default {h2d.DEFAULT_SIZES})")
    sub.add_argument("--modes", default=None,
                     help=f"comma-separated, of {', '.join(h2d.MODES)} (default: "
                          f"{DEFAULT_MODES['cuda']} on cuda, {DEFAULT_MODES['host']} on host)")
    sub.add_argument("--trials", type=int, default=5, help="measured trials (default 5)")
    sub.add_argument("--warmup", type=int, default=1, help="trials run and dropped (default 1)")
    sub.add_argument("--cache", default="cold", choices=("cold", "warm"),
                     help="file, safetensors and gds modes: evict the file before each trial")
    add_output(sub, "--dir", kind=OUTPUT_DIRECTORY, default="", metavar="DIR",
               help="where file modes write their files (default: a temporary directory, "
                    "removed after)")
    sub.add_argument("--link", default="pcie5x16",
                     choices=sorted(name for name in LINK_PEAKS_GBPS if name != "host"),
                     help="the link's nominal one-way peak shown for context (default pcie5x16)")
    add_output(sub, "--archive", kind=OUTPUT_ARCHIVE, default="results/gpu.csv",
               help="archive to append to")
    sub.set_defaults(func=cmd_gpu)


def parse_request(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...]]:
    from stampede.errors import UsageError
    from stampede.units import parse_size

    try:
        sizes = tuple(parse_size(text.strip()) for text in args.sizes.split(",") if text.strip())
    except ValueError as error:
        raise UsageError(f"--sizes {args.sizes!r}: {error}") from None
    if args.modes is None:
        args.modes = DEFAULT_MODES[args.device]
    modes = tuple(text.strip() for text in args.modes.split(",") if text.strip())
    unknown = [mode for mode in modes if mode not in h2d.MODES]
    if not sizes or min(sizes) <= 0 or not modes or unknown:
        raise UsageError(f"--sizes {args.sizes!r} --modes {args.modes!r}: sizes > 0, modes of "
                         f"{', '.join(h2d.MODES)}" + (f" (not {unknown})" if unknown else ""))
    if args.device == "host" and any(mode in h2d.CUDA_ONLY for mode in modes):
        raise UsageError(f"--device host: modes {', '.join(m for m in modes if m in h2d.CUDA_ONLY)} "
                         "need a CUDA device", hint="use --modes pageable,file on host")
    if "gds" in modes:
        import importlib.util
        if importlib.util.find_spec("kvikio") is None:
            from stampede.errors import install_hint
            raise UsageError("--modes gds (GPUDirect Storage) needs kvikio, which is not "
                             "installed", hint=f"{install_hint('gds')} (kvikio-cu12 or -cu13 "
                                                "for your CUDA), or leave gds out")
    if args.trials < 1 or args.warmup < 0:
        raise UsageError(f"--trials {args.trials} --warmup {args.warmup}: trials >= 1, warmup >= 0")
    return sizes, modes


def cmd_gpu(args: argparse.Namespace) -> int:
    from stampede import mpi

    sizes, modes = parse_request(args)          # before MPI and any I/O
    comm = mpi.world()
    local_rank = mpi.node_rank(comm)
    from stampede.run.devices import open_device
    device = mpi.collective(comm, "opening the device", lambda: open_device(args.device, local_rank))
    if "gds" in modes:   # beside the device: only the gds rows carry its label
        from stampede.run.devices import Gds
        device.gds = mpi.collective(comm, "opening cuFile (kvikio)", Gds)
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="stampede-gpu-"))
    try:
        swept = h2d.sweep(comm, device, sizes, modes, args.trials, args.warmup, args.cache,
                          workdir)
    finally:
        device.close()
        if not args.dir:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    if swept is not None:
        from stampede.present.report import make_console, render_gpu
        from stampede.results.recorder import Recorder
        from stampede.results.rows import new_run_id

        console = make_console()
        recorder = Recorder(args.archive, new_run_id(), "gpu",
                            lambda rows, _: render_gpu(rows, console))
        recorder.record(_archive_rows(swept, args, recorder.run_id),
                        _sidecar(swept, args, mpi.library_version(comm)))
        console.print(recorder.archived(), markup=False)
    return 0


def _sidecar(swept: Swept, args: argparse.Namespace, mpi_library: str) -> dict[str, object]:
    """What the rows cannot hold: each rank's host and device (and cuFile's state), the
    sweep as asked (the link's peak is on every row)."""
    from stampede.sysinfo import slurm_variables

    return {"mpi_library": mpi_library, "hosts_by_rank": list(swept.hosts),
            "devices_by_rank": list(swept.labels), "gds_by_rank": list(swept.gds_labels),
            "groups": [[mode, size] for mode, size in swept.groups], "trials": args.trials,
            "warmup": args.warmup, "cache": args.cache, "link": args.link,
            "slurm": slurm_variables()}


def _archive_rows(swept: Swept, args: argparse.Namespace, run_id: str) -> list[dict[str, str]]:
    """Rank 0: one layout (= mode) per group, its ops as rows, the device on every row."""
    import numpy as np

    from stampede.results.columns import GPU_PHASE
    from stampede.results.rows import now_stamp, op_rows, shared_columns
    from stampede.results.stats import layout_stats

    nranks = len(swept.samples_by_rank)
    samples = np.concatenate([np.column_stack([part[:, :6], np.full(len(part), rank), part[:, 6]])
                              for rank, part in enumerate(swept.samples_by_rank)])
    stamp = now_stamp()
    host_device = args.device == "host"
    peak = LINK_PEAKS_GBPS["host" if host_device else args.link]
    rows: list[dict[str, str]] = []
    for group, (mode, size) in enumerate(swept.groups):
        stats = layout_stats(mode, samples[samples[:, 7] == group][:, :7], nranks)
        device, warnings = _device_cells(swept, mode, host_device)
        shared = {
            **shared_columns(run_id, stamp, "gpu", "posix" if mode in h2d.FILE_MODES else "-",
                             mode, swept.hosts, phase=GPU_PHASE),
            "format": "raw", "cache": args.cache if mode in h2d.FILE_MODES else "-",
            "bytes_per_rank": size, "bytes_total": size * nranks, "block_bytes": size,
            "iterations": stats.iterations, "device": device,
            "link_peak_gbps": peak, "warnings": " | ".join(warnings),
        }
        rows.extend(op_rows(shared, stats, size, swept.hosts))
    return rows


def _device_cells(swept: Swept, mode: str, host_device: bool) -> tuple[str, list[str]]:
    """A mode's device column and warnings: the GPUs, and for gds what cuFile did (its
    compatibility mode, or cuFile without nvidia-fs, said NOT GDS in both)."""
    from stampede.run.devices import HOST_LABEL, NOT_GDS

    device = " ".join(sorted(set(swept.labels)))
    warnings = [f"device is {HOST_LABEL}"] if host_device else []
    if mode == "gds":
        states = sorted(set(swept.gds_labels))
        device += f" via {' / '.join(states)}"
        warnings += [f"gds: {state}: file -> HBM went through host memory; not GPUDirect "
                     "Storage numbers" for state in states if NOT_GDS in state]
    return device, warnings
