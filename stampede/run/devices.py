"""Devices for host -> device copies: a CUDA GPU through PyTorch, or `host`; and file ->
HBM without a host copy, through cuFile (GPUDirect Storage, by kvikio).

`host` is a plain memcpy into a page-aligned buffer: it exists so that the whole path can
be tested on machines without a GPU, and it is labelled "host (memcpy, not a GPU)"
everywhere it appears. A CUDA device is never replaced by a CPU copy: without PyTorch or
without a visible GPU, asking for `cuda` is an error (exit 2).

Timing: a CUDA copy is timed with CUDA events around it (device time); the host stamp at
enqueue marks its start, so cross-rank elapsed times stay IOR's max(stop) - min(start).
Each rank uses GPU `local_rank % device_count` of its node.

GPUDirect Storage (`run.h2d = cuda-gds`, `stampede gpu --modes gds`): kvikio's CuFile reads
a file into device memory. kvikio falls back to its compatibility mode (POSIX reads into a
host bounce buffer, then a copy) when cuFile cannot be loaded, and cuFile itself falls back
to a bounce buffer when the nvidia-fs driver is not loaded: either way it is NOT GDS, and
the label (device column, warnings, report) says so. A read returns once the bytes are in
device memory.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from stampede.buffers import AlignedBuffer
from stampede.errors import UsageError, install_hint
from stampede.results.warnings import NOT_GDS
from stampede.units import NS_PER_MS, NS_PER_S

if TYPE_CHECKING:
    from types import ModuleType

    from stampede.backends.base import Backend

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
        self.gds: Gds | None = None   # never opened: cuFile reads into device memory

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
        self.gds: Gds | None = None   # run.h2d = cuda-gds: cuFile opened beside

    def device_buffer(self, nbytes: int) -> object:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def _host_tensor(self, view: memoryview) -> Any:
        return self.torch.frombuffer(view, dtype=self.torch.uint8)

    def pin(self, buffer: AlignedBuffer) -> float:
        """Page-lock the aligned buffer in place (cudaHostRegister); returns the seconds."""
        tensor = self._host_tensor(buffer.view)
        start = time.perf_counter_ns()
        status = self.torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), buffer.nbytes, 0)
        seconds = (time.perf_counter_ns() - start) / NS_PER_S
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
        return start, start + int(begin.elapsed_time(end) * NS_PER_MS)

    def copy_back(self, destination: memoryview, source: Any, offset: int) -> tuple[int, int]:
        """Device source[offset:] -> host destination (for checking bytes that reached HBM
        without a host copy); synchronous, host stamps."""
        host = self._host_tensor(destination)
        start = time.perf_counter_ns()
        host.copy_(source[offset:offset + host.numel()])
        return start, time.perf_counter_ns()

    def close(self) -> None:
        self.torch.cuda.synchronize()


def open_device(name: str, local_rank: int) -> HostDevice | CudaDevice:
    """`host`, `cuda`, or a run.h2d value (cuda-gds also opens cuFile: labelled with it)."""
    if name == "host":
        return HostDevice(local_rank)
    if name.split("-")[0] == "cuda":
        device = CudaDevice(local_rank)
        if name == "cuda-gds":
            device.gds = Gds()
            device.label += f", {device.gds.label}"
        return device
    raise UsageError(f"device {name!r}: must be one of {', '.join(DEVICES)}")


Device = HostDevice | CudaDevice   # where run.h2d puts the restored bytes


class Gds:
    """File -> device memory through kvikio's CuFile; `label` says whether it is GDS."""

    def __init__(self) -> None:
        import importlib
        hint = f"{install_hint('gds')} (kvikio-cu12 or -cu13 for your CUDA)"
        try:   # imported by name: kvikio ships no type stubs
            kvikio = importlib.import_module("kvikio")
        except ImportError:
            raise UsageError("GPUDirect Storage (run.h2d = cuda-gds, --modes gds) needs "
                             "kvikio, which is not installed", hint=hint) from None
        except Exception as error:   # its loader's own errors: libcufile not found, ...
            raise UsageError(f"GPUDirect Storage: kvikio is installed but does not load "
                             f"({type(error).__name__}: {str(error).splitlines()[0]})",
                             hint=hint) from None
        self.kvikio = kvikio
        self.is_gds, self.label = gds_state(kvikio)

    def open(self, path: object) -> object:
        return self.kvikio.CuFile(path, "r")

    @staticmethod
    def read(handle: Any, destination: Any, place: int, length: int, file_offset: int) -> int:
        """length bytes at file_offset into destination[place:] (device memory); blocks
        until they are there."""
        return int(handle.read(destination[place:place + length], length, file_offset))

    @staticmethod
    def close(handle: Any) -> None:
        handle.close()


def gds_state(kvikio: ModuleType) -> tuple[bool, str]:
    """(is it GDS, its label): kvikio's compatibility mode, or cuFile without the nvidia-fs
    driver, read POSIX into a host bounce buffer and copy: NOT GDS."""
    import importlib

    defaults = getattr(kvikio, "defaults", None)
    preferred = getattr(defaults, "is_compat_mode_preferred", None)
    legacy = getattr(defaults, "compat_mode", None)   # kvikio < 24.10: a bool
    asked = preferred if preferred is not None else legacy
    try:
        compat = bool(asked()) if asked is not None else True
    except RuntimeError as error:   # kvikio's own failure, said as it is
        return False, f"cuFile state unknown ({error}): counted as {NOT_GDS}"
    if compat:
        return False, f"kvikio compatibility mode (POSIX reads + copies), {NOT_GDS}"
    try:
        properties = importlib.import_module("kvikio.cufile_driver").properties
        loaded = bool(properties.is_gds_available)
        version = f"{properties.major_version}.{properties.minor_version}" if loaded else ""
    except (ImportError, AttributeError, RuntimeError) as error:   # GDS is never assumed
        return False, (f"cuFile loaded, the nvidia-fs driver's state not reported "
                       f"({type(error).__name__}), {NOT_GDS}")
    if not loaded:
        return False, f"cuFile without the nvidia-fs driver (bounce buffer), {NOT_GDS}"
    return True, f"GDS (cuFile, nvidia-fs {version})"


class GdsHandle(NamedTuple):
    posix: object     # the POSIX backend's descriptor: headers and indexes, into host memory
    cufile: object    # kvikio's CuFile: tensor bytes, file -> HBM


class GdsFiles:
    """run.h2d = cuda-gds: the POSIX backend with every file also opened through cuFile
    (the timed open pays both, as a GDS loader registers each file it reads). Headers and
    indexes are read into host memory through the POSIX descriptor; the bytes to restore
    go file -> HBM (`read_device`). Everything else is the POSIX backend's."""

    def __init__(self, posix: Backend, gds: Gds) -> None:
        self._posix, self.gds = posix, gds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._posix, name)

    @staticmethod
    def compiled_calls(direct: bool, follow_links: bool = True) -> None:
        """None: an open here is two (POSIX and cuFile's), so the Python loops run."""

    def opener(self, direct: bool, follow_links: bool = True) -> Callable[[object], GdsHandle]:
        open_posix, open_cufile, close = self._posix.opener(direct, follow_links), \
            self.gds.open, self._posix.close

        def open_both(path: object) -> GdsHandle:
            handle = open_posix(path)   # refuses a link where the POSIX open does
            try:
                return GdsHandle(handle, open_cufile(path))
            except RuntimeError as error:   # kvikio's errors: counted as a failed open
                close(handle)
                raise OSError(errno.EIO, f"cuFile open: {error}") from None
        return open_both

    def read_into(self, handle: GdsHandle, buffer: memoryview, offset: int) -> int:
        return int(self._posix.read_into(handle.posix, buffer, offset))

    def read_device(self, handle: GdsHandle, destination: object, place: int, length: int,
                    offset: int) -> int:
        try:
            return self.gds.read(handle.cufile, destination, place, length, offset)
        except RuntimeError as error:
            raise OSError(errno.EIO, f"cuFile read: {error}") from None

    def close(self, handle: GdsHandle) -> None:
        try:
            self.gds.close(handle.cufile)
        finally:
            self._posix.close(handle.posix)
