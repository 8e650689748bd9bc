"""What the loader modules share: the phase recorder, a piece cut out of a tensor it
loaded whole, the device synchronisation that ends a phase on a GPU, the state and the
release of a loader that keeps nothing between loads, and the whole of a loader that
loads each file in one call (whole_files)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stampede.ops import OP_CODE
from stampede.run.loaders.work import RankWork, Wanted

if TYPE_CHECKING:
    from stampede.mpi import Comm

Log = list[tuple[int, int, int, int, int, int]]


@dataclass(frozen=True)
class Plain:
    """The state of a loader that keeps nothing between loads: the rank's work and device."""

    work: RankWork
    device: str


def keeps_nothing(state: object) -> None:
    """release and finish of a loader that keeps nothing between loads."""
    return None


class Record:
    """Stamps one phase of one iteration: record(op, start_ns, bytes) appends
    (iteration, op, start, now, bytes, ok); on a GPU it first waits for the device, so a
    phase ends when its copies have, not when they were queued."""

    def __init__(self, iteration: int, log: Log, synchronize: Callable[[], None] | None) -> None:
        self.iteration, self.log, self.synchronize = iteration, log, synchronize

    def __call__(self, op: str, start_ns: int, nbytes: int = 0) -> int:
        if self.synchronize is not None:
            self.synchronize()
        stop = time.perf_counter_ns()
        self.log.append((self.iteration, OP_CODE[op], start_ns, stop, nbytes, 1))
        return stop


# (file path, device) -> the file's tensors by name, made by the library's one call
TensorsOf = Callable[[str, str], Mapping[str, object]]


def whole_files(package: str, tensors_of: TensorsOf) -> tuple[
        Callable[[Comm, RankWork, str], Plain], Callable[[Plain, Record], dict[str, object]]]:
    """prepare and load of a loader that makes every tensor of a file in one call
    (torch.load, tensorizer): `package` imported by prepare, before any timing; op load
    from the first file's call to the last file's tensors made (the library's phases are
    inside its call, not exposed). Files are whole: under tensor-slices a rank loads every
    file it holds a slice of, and keeps all of it."""
    def prepare(comm: Comm, work: RankWork, device: str) -> Plain:
        importlib.import_module(package)
        return Plain(work, device)

    def load(state: Plain, record: Record) -> dict[str, object]:
        work = state.work
        start = time.perf_counter_ns()
        held: dict[str, object] = {}
        for relpath in work.files:
            held.update({f"{relpath}:{name}": tensor
                         for name, tensor in tensors_of(work.path(relpath), state.device).items()})
        record("load", start, tensor_bytes(held.values()))
        return held

    return prepare, load


def cut(tensor: object, piece: Wanted, first_byte: int = 0) -> object:
    """The piece's bytes of a tensor holding its tensor from byte `first_byte` on, as a
    flat view (no copy): the slice a tensor-parallel rank keeps."""
    if piece.whole and first_byte == 0:
        return tensor
    flat = flat_bytes(tensor)
    start = piece.offset - first_byte
    return flat[start:start + piece.length]


def flat_tensors(value: object, prefix: str = "") -> dict[str, object]:
    """Every tensor in what a loader returned (a state_dict, nested dicts and lists of
    them), by its dotted path; other values are left out."""
    import torch

    if isinstance(value, torch.Tensor):
        return {prefix: value}
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list | tuple) else ()
    found: dict[str, object] = {}
    for key, item in items:
        found.update(flat_tensors(item, f"{prefix}.{key}" if prefix else str(key)))
    return found


PAGE_BYTES = 4096


def touch(tensors: Any) -> int:
    """Read one byte of every page of each tensor (and its last byte): a mapped tensor's
    pages are then in memory, as a first use would make them. Returns the bytes covered."""
    covered = sink = 0
    for tensor in tensors:
        flat = flat_bytes(tensor)
        if flat.numel():
            sink += int(flat[::PAGE_BYTES].sum()) + int(flat[-1])
            covered += int(flat.numel())
    return covered


def flat_bytes(tensor: Any) -> Any:
    """A tensor's bytes as a flat uint8 view (a scalar's too); no copy."""
    import torch

    return tensor.reshape(-1).view(torch.uint8) if tensor.dim() else \
        tensor.reshape(1).view(torch.uint8)


def tensor_bytes(tensors: Any) -> int:
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors)
