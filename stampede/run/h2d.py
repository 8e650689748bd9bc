"""`stampede gpu`: host -> device copies per rank, the data term's last hop to HBM.

Modes (each at every size of the sweep, all ranks at once after a barrier):
  pageable     copy from an ordinary (page-aligned, not page-locked) host buffer
  pinned       copy from a buffer page-locked beforehand (the pinning is not timed)
  pin+copy     page-lock the buffer (op pin), then copy: what a loader pays per buffer
  file         read a file into a page-locked buffer (op read, block by block), then copy;
               the file's pages are evicted before each trial unless --cache warm
  safetensors  load a safetensors file to the device as loaders do
               (safe_open(framework="pt", device=...) and get_tensor for every tensor)
  gds          read a file straight into device memory through cuFile (kvikio, GPUDirect
               Storage; op read, block by block, no host copy); kvikio's compatibility
               mode and cuFile without nvidia-fs go through host memory and are labelled
               NOT GDS (device column, warnings, report); evicted like file
Every trial ends with the pseudo-op restore: from the barrier until the rank's bytes are
in device memory; GB/s by the storage definitions (bytes / (last stop - first start)).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from stampede.backends.posix import PosixBackend
from stampede.units import BYTES_PER_MIB

if TYPE_CHECKING:
    import numpy as np

    from stampede.buffers import AlignedBuffer
    from stampede.mpi import Comm
    from stampede.run.devices import Device


@dataclass(frozen=True)
class Swept:
    """A sweep on rank 0: each rank's sample rows (iteration, op, start, stop, bytes, ok,
    group) on one axis, the (mode, size) of each group, the ranks' hosts and devices."""

    samples_by_rank: list[np.ndarray]
    groups: tuple[tuple[str, int], ...]
    hosts: tuple[str, ...]
    labels: tuple[str, ...]
    gds_labels: tuple[str, ...] = ()   # each rank's cuFile state, when gds ran


MODES = ("pageable", "pinned", "pin+copy", "file", "safetensors", "gds")
CUDA_ONLY = ("pinned", "pin+copy", "safetensors", "gds")
FILE_MODES = ("file", "safetensors", "gds")   # read from a file, evicted before each trial
DEFAULT_SIZES = "64MiB,256MiB,1GiB"
TENSOR_BYTES = 64 * BYTES_PER_MIB   # the safetensors file holds fp16 tensors of up to 64 MiB


def write_safetensors(path: Path, nbytes: int) -> None:
    """A real safetensors file of fp16 tensors totalling nbytes, of up to TENSOR_BYTES
    each, its header written by stampede's one safetensors writer."""
    from stampede.checkpoint.formats import safetensors_prefix

    tensors: list[tuple[str, int]] = []
    offset = 0
    while offset < nbytes:
        length = min(TENSOR_BYTES, nbytes - offset) // 2 * 2
        if length == 0:
            break
        tensors.append((f"layer{len(tensors):05d}.weight", length))
        offset += length
    prefix, _ = safetensors_prefix(tensors, "float16")
    with open(path, "wb") as stream:
        stream.write(prefix)
        _write_pattern(stream, offset)
        stream.flush()
        os.fsync(stream.fileno())


def _write_pattern(stream: BinaryIO, nbytes: int) -> None:
    import numpy as np
    # finite fp16 values (a NaN pattern would be a poor stand-in for weights)
    chunk = np.random.default_rng(7).standard_normal(min(nbytes, 2**24) // 2).astype(np.float16)
    data = chunk.tobytes()
    for start in range(0, nbytes, len(data)):
        stream.write(data[:min(len(data), nbytes - start)])


def sweep(comm: Comm, device: Device, sizes: tuple[int, ...], modes: tuple[str, ...],
          trials: int, warmup: int, cache: str, workdir: Path) -> Swept | None:
    """Every (mode, size) in turn, all ranks at once; the samples on one axis on rank 0
    (None elsewhere)."""
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
            if mode in FILE_MODES:
                workdir.mkdir(parents=True, exist_ok=True)
                (write_safetensors if mode == "safetensors" else _write_raw)(path, size)
            with _Buffers(device, mode, size) as buffers:
                for trial in range(-warmup, trials):
                    if mode in FILE_MODES and cache == "cold":
                        PosixBackend.evict(path, 0, 0)
                    mpi.barrier(comm)
                    phase = len(origins)
                    origins[phase] = time.perf_counter_ns()
                    for row in _trial(device, mode, size, path, buffers):
                        if trial >= 0:  # warmup trials are run and dropped
                            log.append((phase, *row, group))
            if mode in FILE_MODES:
                path.unlink(missing_ok=True)
    from stampede.run.clock import on_one_axis, origins_array

    gathered = mpi.gather_rows(comm, np.array(log, dtype=np.int64).reshape(-1, 7))
    gathered_origins = mpi.gather_rows(comm, origins_array(origins))
    labels = mpi.gather(comm, device.label)
    gds = getattr(device, "gds", None)
    gds_labels = mpi.gather(comm, gds.label if gds is not None else "")
    hosts = mpi.gather(comm, mpi.processor_name(comm))
    if gathered is None or gathered_origins is None or labels is None or hosts is None:
        return None
    on_axis = on_one_axis(gathered, gathered_origins, hosts)
    return Swept(on_axis, tuple(groups), tuple(hosts), tuple(labels),
                 tuple(gds_labels or ()) if gds is not None else ())


class _Buffers:
    """A (mode, size)'s buffers, set up untimed and reused by every trial: a filled source,
    a destination touched once (no page faults inside the timed copy), pinned where the
    mode pins beforehand (pinned, and file on a GPU)."""

    def __init__(self, device: Device, mode: str, size: int) -> None:
        from stampede.buffers import AlignedBuffer

        self.device, self.mode = device, mode
        self.source = AlignedBuffer(size) if mode not in ("safetensors", "gds") else None
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


def _trial(device: Device, mode: str, size: int, path: Path,
           buffers: _Buffers) -> list[tuple[int, int, int, int, int]]:
    """One trial on this rank: (op, start_ns, stop_ns, bytes, ok) rows, restore last."""
    from stampede.ops import OP_CODE

    samples = []
    begin = time.perf_counter_ns()
    if mode == "safetensors":
        _load_safetensors(device, path)
        samples.append((OP_CODE["restore"], begin, time.perf_counter_ns(), size, 1))
        return samples
    if mode == "gds":
        samples.extend(_read_gds(device.gds, path, buffers.destination, size))
        samples.append((OP_CODE["restore"], begin, samples[-1][2], size, 1))
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


def _read_file(path: Path, buffer: AlignedBuffer, block_bytes: int = 16 * BYTES_PER_MIB) -> list[Sample]:
    from stampede.ops import OP_CODE

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


def _read_gds(gds: Any, path: Path, destination: object, size: int,
              block_bytes: int = 16 * BYTES_PER_MIB) -> list[Sample]:
    """file -> device memory through cuFile, in the blocks of the file mode (its open and
    registration inside the trial, as file's open is)."""
    from stampede.ops import OP_CODE

    samples = []
    handle = gds.open(path)
    try:
        for offset in range(0, size, block_bytes):
            length = min(block_bytes, size - offset)
            start = time.perf_counter_ns()
            count = gds.read(handle, destination, offset, length, offset)
            samples.append((OP_CODE["read"], start, time.perf_counter_ns(), count,
                            int(count == length)))
    finally:
        gds.close(handle)
    return samples


def _load_safetensors(device: Any, path: Path) -> None:
    try:
        from safetensors import safe_open
    except ImportError:
        from stampede.errors import UsageError, install_hint
        raise UsageError("--modes safetensors needs the safetensors package",
                         hint=install_hint("gpu")) from None
    with safe_open(str(path), framework="pt", device=f"cuda:{device.index}") as handle:
        for name in handle.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
            handle.get_tensor(name)
    device.torch.cuda.synchronize()


def _write_raw(path: Path, size: int) -> None:
    with open(path, "wb") as stream:
        _write_pattern(stream, size)
        stream.flush()
        os.fsync(stream.fileno())
