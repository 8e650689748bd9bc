"""Devices for host -> device copies: a CUDA GPU through PyTorch, or `host`.

`host` is a plain memcpy into a page-aligned buffer: it exists so that the whole path can
be tested on machines without a GPU, and it is labelled "host (memcpy, not a GPU)"
everywhere it appears. A CUDA device is never replaced by a CPU copy: without PyTorch or
without a visible GPU, asking for `cuda` is an error (exit 2).

Timing: a CUDA copy is timed with CUDA events around it (device time); the host stamp at
enqueue marks its start, so cross-rank elapsed times stay IOR's max(stop) - min(start).
Each rank uses GPU `local_rank % device_count` of its node.
"""

from __future__ import annotations

import time
from typing import Any

from stampede.buffers import AlignedBuffer
from stampede.errors import UsageError, install_hint

DEVICES = ("cuda", "host")
HOST_LABEL = "host (memcpy, not a GPU)"
# Nominal one-direction peaks, for context in reports (GB/s, 10^9 B/s).
LINK_PEAKS_GBPS = {"pcie4x16": 32.0, "pcie5x16": 64.0, "pcie6x16": 128.0, "host": float("nan")}


class HostDevice:
    """memcpy into an aligned buffer: the test stand-in for a GPU."""

    name = "host"
    label = HOST_LABEL
    index = 0

    def __init__(self, local_rank: int) -> None:
        self.local_rank = local_rank
        self._buffers: list[AlignedBuffer] = []

    def device_buffer(self, nbytes: int) -> memoryview:
        buffer = AlignedBuffer(nbytes, populate=True)
        self._buffers.append(buffer)
        return buffer.view

    def pin(self, buffer: AlignedBuffer) -> float:
        raise UsageError("the host device has no pinned memory: use --device cuda for "
                         "pinned copies, or --modes pageable,file on host")

    def unpin(self, buffer: AlignedBuffer) -> None:
        return None

    def copy(self, destination: Any, offset: int, source: memoryview) -> tuple[int, int]:
        """Copy source to destination[offset:]; returns (start_ns, stop_ns)."""
        start = time.perf_counter_ns()
        destination[offset:offset + len(source)] = source
        return start, time.perf_counter_ns()

    def close(self) -> None:
        for buffer in self._buffers:
            buffer.close()
        self._buffers.clear()


class CudaDevice:
    """A CUDA GPU through PyTorch; copies timed with CUDA events."""

    name = "cuda"

    def __init__(self, local_rank: int) -> None:
        try:
            import torch
        except ImportError:
            raise UsageError("--device cuda needs PyTorch, which is not installed",
                             hint=f"{install_hint('gpu')} (or --device host to test the "
                                  "path without a GPU; it is labelled as such)") from None
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise UsageError("--device cuda: PyTorch sees no CUDA device on this node",
                             hint="check CUDA_VISIBLE_DEVICES and the driver; stampede never "
                                  "reports a CPU copy as a GPU number")
        self.torch = torch
        self.index = local_rank % torch.cuda.device_count()
        self.device = torch.device("cuda", self.index)
        torch.cuda.set_device(self.device)
        self.label = f"cuda:{self.index} {torch.cuda.get_device_name(self.index)}"
        self._pinned: dict[int, int] = {}

    def device_buffer(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def _host_tensor(self, view: memoryview) -> Any:
        return self.torch.frombuffer(view, dtype=self.torch.uint8)

    def pin(self, buffer: AlignedBuffer) -> float:
        """Page-lock the aligned buffer in place (cudaHostRegister); returns the seconds."""
        tensor = self._host_tensor(buffer.view)
        start = time.perf_counter_ns()
        status = self.torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), buffer.nbytes, 0)
        seconds = (time.perf_counter_ns() - start) / 1e9
        if int(status) != 0:
            raise UsageError(f"cudaHostRegister of {buffer.nbytes} bytes failed ({status})")
        self._pinned[id(buffer)] = tensor.data_ptr()
        return seconds

    def unpin(self, buffer: AlignedBuffer) -> None:
        pointer = self._pinned.pop(id(buffer), None)
        if pointer is not None:
            self.torch.cuda.cudart().cudaHostUnregister(pointer)

    def copy(self, destination: Any, offset: int, source: memoryview) -> tuple[int, int]:
        """Copy source to destination[offset:]; device time from CUDA events."""
        torch = self.torch
        host = self._host_tensor(source)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start = time.perf_counter_ns()
        begin.record()
        destination[offset:offset + host.numel()].copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        return start, start + int(begin.elapsed_time(end) * 1e6)

    def close(self) -> None:
        self.torch.cuda.synchronize()


def open_device(name: str, local_rank: int) -> HostDevice | CudaDevice:
    if name == "host":
        return HostDevice(local_rank)
    if name == "cuda":
        return CudaDevice(local_rank)
    raise UsageError(f"device {name!r}: must be one of {', '.join(DEVICES)}")
