"""`stampede gpu`: host -> device copies per rank, the data term's last hop to HBM.

Modes (each at every size of the sweep, all ranks at once after a barrier):
  pageable     copy from an ordinary (page-aligned, not page-locked) host buffer
  pinned       copy from a buffer page-locked beforehand (the pinning is not timed)
  pin+copy     page-lock the buffer (op pin), then copy: what a loader pays per buffer
  file         read a file into a page-locked buffer (op read, block by block), then copy;
               the file's pages are evicted before each trial unless --cache warm
  safetensors  load a safetensors file to the device as loaders do
               (safe_open(framework="pt", device=...) and get_tensor for every tensor)
Every trial ends with the pseudo-op restore: from the barrier until the rank's bytes are
in device memory; GB/s by the storage definitions (bytes / (last stop - first start)).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from stampede.backends.posix import PosixBackend
from stampede.run.devices import LINK_PEAKS_GBPS

MODES = ("pageable", "pinned", "pin+copy", "file", "safetensors")
CUDA_ONLY = ("pinned", "pin+copy", "safetensors")
DEFAULT_SIZES = "64MiB,256MiB,1GiB"
TENSOR_BYTES = 64 * 2**20   # the safetensors file holds fp16 tensors of up to 64 MiB


def write_safetensors(path: Path, nbytes: int) -> None:
    """A real safetensors file of fp16 tensors totalling nbytes (8-byte header length,
    JSON header, then the data), written without the safetensors package."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "stampede"}}
    offset, index = 0, 0
    while offset < nbytes:
        length = min(TENSOR_BYTES, nbytes - offset) // 2 * 2
        if length == 0:
            break
        header[f"layer{index:05d}.weight"] = {"dtype": "F16", "shape": [length // 2],
                                              "data_offsets": [offset, offset + length]}
        offset, index = offset + length, index + 1
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(encoded)) + encoded)
        _write_pattern(stream, offset)
        stream.flush()
        os.fsync(stream.fileno())


def _write_pattern(stream: Any, nbytes: int) -> None:
    import numpy as np
    # finite fp16 values (a NaN pattern would be a poor stand-in for weights)
    chunk = np.random.default_rng(7).standard_normal(min(nbytes, 2**24) // 2).astype(np.float16)
    data = chunk.tobytes()
    for start in range(0, nbytes, len(data)):
        stream.write(data[:min(len(data), nbytes - start)])


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "gpu", formatter_class=formatter,
        help="Time host -> device copies per rank (pageable, pinned, pin+copy, file -> HBM, "
             "safetensors -> HBM) over a size sweep; archive and report with the link's peak.",
        description="Host -> device copy bandwidth per rank (GPU `local_rank % device_count`).",
        epilog=__doc__)
    sub.add_argument("--device", default="cuda", choices=("cuda", "host"),
                     help="cuda (PyTorch; exit 2 without a GPU) or host (memcpy, labelled "
                          "as not a GPU: for tests)")
    sub.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes per copy (default {DEFAULT_SIZES})")
    sub.add_argument("--modes", default="pageable,pinned,file",
                     help=f"comma-separated, of {', '.join(MODES)}")
    sub.add_argument("--trials", type=int, default=5, help="measured trials (default 5)")
    sub.add_argument("--warmup", type=int, default=1, help="trials run and dropped (default 1)")
    sub.add_argument("--cache", default="cold", choices=("cold", "warm"),
                     help="file and safetensors modes: evict the file before each trial")
    sub.add_argument("--dir", default="", help="where file modes write their files "
                     "(default: a temporary directory, removed after)")
    sub.add_argument("--link", default="pcie5x16",
                     choices=sorted(name for name in LINK_PEAKS_GBPS if name != "host"),
                     help="the link's nominal one-way peak shown for context (default pcie5x16)")
    sub.add_argument("--archive", default="results/gpu.csv", help="archive to append to")
    sub.set_defaults(func=cmd_gpu)


def parse_request(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[str, ...]]:
    from stampede.errors import UsageError
    from stampede.units import parse_size

    try:
        sizes = tuple(parse_size(text.strip()) for text in args.sizes.split(",") if text.strip())
    except ValueError as error:
        raise UsageError(f"--sizes {args.sizes!r}: {error}") from None
    modes = tuple(text.strip() for text in args.modes.split(",") if text.strip())
    unknown = [mode for mode in modes if mode not in MODES]
    if not sizes or min(sizes) <= 0 or not modes or unknown:
        raise UsageError(f"--sizes {args.sizes!r} --modes {args.modes!r}: sizes > 0, modes of "
                         f"{', '.join(MODES)}" + (f" (not {unknown})" if unknown else ""))
    if args.device == "host" and any(mode in CUDA_ONLY for mode in modes):
        raise UsageError(f"--device host: modes {', '.join(m for m in modes if m in CUDA_ONLY)} "
                         "need a CUDA device", hint="use --modes pageable,file on host")
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
    workdir = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="stampede-gpu-"))
    try:
        rows = _sweep(comm, device, sizes, modes, args, workdir)
    finally:
        device.close()
        if not args.dir:
            import shutil
            shutil.rmtree(workdir, ignore_errors=True)
    if comm.Get_rank() == 0:
        from stampede.results.archive import append_rows
        from stampede.results.report import make_console, render_gpu
        append_rows(args.archive, rows)
        render_gpu(rows, make_console())
        print(f"archived: {args.archive}")
    return 0


def _sweep(comm: Any, device: Any, sizes: tuple[int, ...], modes: tuple[str, ...],
           args: argparse.Namespace, workdir: Path) -> list[dict[str, str]]:
    """Every (mode, size) in turn; returns the archive rows on rank 0."""
    import numpy as np

    from stampede import mpi
    rank = comm.Get_rank()
    groups: list[tuple[str, int]] = []
    log: list[tuple[int, ...]] = []
    origins: dict[int, int] = {}   # phase (one trial of one group) -> barrier exit
    for mode in modes:
        for size in sizes:
            group = len(groups)
            groups.append((mode, size))
            path = workdir / f"rank-{rank:05d}-{size}.{'safetensors' if mode == 'safetensors' else 'raw'}"
            if mode in ("file", "safetensors"):
                workdir.mkdir(parents=True, exist_ok=True)
                (write_safetensors if mode == "safetensors" else _write_raw)(path, size)
            with _Buffers(device, mode, size) as buffers:
                for trial in range(-args.warmup, args.trials):
                    if mode in ("file", "safetensors") and args.cache == "cold":
                        PosixBackend.evict(path, 0, 0)
                    mpi.barrier(comm)
                    phase = len(origins)
                    origins[phase] = time.perf_counter_ns()
                    for row in _trial(device, mode, size, path, buffers):
                        if trial >= 0:  # warmup trials are run and dropped
                            log.append((phase, *row, group))
            if mode in ("file", "safetensors"):
                path.unlink(missing_ok=True)
    from stampede.results.samples import OP_CODE
    from stampede.run.clock import on_one_axis, origins_array

    gathered = mpi.gather_rows(comm, np.array(log, dtype=np.int64).reshape(-1, 7))
    gathered_origins = mpi.gather_rows(comm, origins_array(origins))
    labels = mpi.gather(comm, device.label)
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    if gathered is None or gathered_origins is None or labels is None or hosts is None:
        return []
    on_axis = on_one_axis(gathered, gathered_origins, hosts, OP_CODE["restore"])
    return _archive_rows(on_axis, groups, tuple(hosts), labels, args)


class _Buffers:
    """A (mode, size)'s buffers, set up untimed and reused by every trial: a filled source,
    a destination touched once (no page faults inside the timed copy), pinned where the
    mode pins beforehand (pinned, and file on a GPU)."""

    def __init__(self, device: Any, mode: str, size: int) -> None:
        from stampede.buffers import AlignedBuffer

        self.device, self.mode = device, mode
        self.source = AlignedBuffer(size) if mode != "safetensors" else None
        self.destination = device.device_buffer(size) if mode != "safetensors" else None
        if self.source is not None:
            self.source.view[:] = b"\x5a" * size
            device.copy(self.destination, 0, self.source.view)
            if mode == "pinned" or (mode == "file" and device.name == "cuda"):
                device.pin(self.source)

    def __enter__(self) -> _Buffers:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.source is not None:
            self.device.unpin(self.source)
            self.source.close()


def _trial(device: Any, mode: str, size: int, path: Path,
           buffers: _Buffers) -> list[tuple[int, int, int, int, int]]:
    """One trial on this rank: (op, start_ns, stop_ns, bytes, ok) rows, restore last."""
    from stampede.results.samples import OP_CODE

    samples = []
    begin = time.perf_counter_ns()
    if mode == "safetensors":
        _load_safetensors(device, path)
        samples.append((OP_CODE["restore"], begin, time.perf_counter_ns(), size, 1))
        return samples
    source = buffers.source
    assert source is not None
    if mode == "pin+copy":
        device.pin(source)
        samples.append((OP_CODE["pin"], begin, time.perf_counter_ns(), size, 1))
    if mode == "file":
        samples.extend(_read_file(path, source))
    start, stop = device.copy(buffers.destination, 0, source.view)
    samples.append((OP_CODE["h2d"], start, stop, size, 1))
    if mode == "pin+copy":
        device.unpin(source)  # untimed: the next trial pins again
    samples.append((OP_CODE["restore"], begin, stop, size, 1))
    return samples


Sample = tuple[int, int, int, int, int]   # (op, start_ns, stop_ns, bytes, ok)


def _read_file(path: Path, buffer: Any, block_bytes: int = 16 * 2**20) -> list[Sample]:
    from stampede.results.samples import OP_CODE

    samples = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, buffer.nbytes, block_bytes):
            view = buffer.view[offset:offset + block_bytes]
            start = time.perf_counter_ns()
            count = os.preadv(fd, (view,), offset)
            samples.append((OP_CODE["read"], start, time.perf_counter_ns(), count,
                            int(count == len(view))))
    finally:
        os.close(fd)
    return samples


def _load_safetensors(device: Any, path: Path) -> None:
    try:
        from safetensors import safe_open
    except ImportError:
        from stampede.errors import UsageError
        raise UsageError("--modes safetensors needs the safetensors package",
                         hint="pip install -e '.[gpu]'") from None
    with safe_open(str(path), framework="pt", device=f"cuda:{device.index}") as handle:
        for name in handle.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
            handle.get_tensor(name)
    device.torch.cuda.synchronize()


def _write_raw(path: Path, size: int) -> None:
    with open(path, "wb") as stream:
        _write_pattern(stream, size)
        stream.flush()
        os.fsync(stream.fileno())


def _archive_rows(gathered: list[Any], groups: list[tuple[str, int]], hosts: tuple[str, ...],
                  labels: list[str], args: argparse.Namespace) -> list[dict[str, str]]:
    """Rank 0: one layout (= mode) per group, its ops as rows, the device on every row."""
    from datetime import UTC, datetime

    import numpy as np

    from stampede import __version__
    from stampede.results.archive import ARCHIVE_SCHEMA, new_run_id, node_counts
    from stampede.results.rows import hosts_cell, op_rows
    from stampede.results.stats import layout_stats
    from stampede.run.devices import HOST_LABEL

    nranks = len(gathered)
    samples = np.concatenate([np.column_stack([part[:, :6], np.full(len(part), rank), part[:, 6]])
                              for rank, part in enumerate(gathered)])
    stamp = datetime.now(UTC)
    run_id = new_run_id()
    nnodes, per_node = node_counts(hosts)
    host_device = args.device == "host"
    peak = LINK_PEAKS_GBPS["host" if host_device else args.link]
    rows: list[dict[str, str]] = []
    for group, (mode, size) in enumerate(groups):
        stats = layout_stats(mode, samples[samples[:, 7] == group][:, :7], nranks)
        shared: dict[str, object] = {
            "schema": ARCHIVE_SCHEMA, "run_id": run_id, "timestamp": stamp.isoformat(timespec="seconds"),
            "job": "gpu", "backend": args.device, "layout": mode, "format": "raw",
            "cache": args.cache if mode in ("file", "safetensors") else "-", "nranks": nranks,
            "nnodes": nnodes, "ranks_per_node": per_node,
            "bytes_per_rank": size, "bytes_total": size * nranks, "block_bytes": size,
            "iterations": stats.iterations, "valid": True, "stampede_version": __version__,
            "hosts": hosts_cell(hosts), "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "device": " ".join(sorted(set(labels))), "link_peak_gbps": peak,
            "warnings": f"device is {HOST_LABEL}" if host_device else "",
        }
        rows.extend(op_rows(shared, stats, size, hosts))
    return rows
