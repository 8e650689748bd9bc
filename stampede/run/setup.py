"""What a rank prepares once per layout, untimed, and reuses every iteration: its plan's
paths, the buffer, the exchange group (MPI, or torch.distributed: run.exchange), the
hashes to expect, the device and where each extent's bytes go in its memory (`RankSetup`)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from stampede import mpi
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import RankPlan, stripes
from stampede.run import metadata_loop
from stampede.run.digests import new_digest
from stampede.run.prefetch import Prefetch
from stampede.run.where import Where
from stampede.spec import JobSpec

if TYPE_CHECKING:
    from stampede.existing.catalogue import Catalogue
    from stampede.run.devices import Device
    from stampede.run.torch_exchange import TorchExchange

class RankSetup(NamedTuple):
    """What a rank prepares once per layout, untimed, and reuses every iteration."""

    plan: RankPlan
    backend: Backend
    paths: dict[str, str | bytes]   # relpath -> backend path (and the listed directory)
    buffer: AlignedBuffer           # one block (read and discard), or the whole held shard
    direct: bool
    world: mpi.Comm                 # communicator for list-bcast
    leads: bool = True              # False: a broadcast member that reads no storage
    group: mpi.Comm | None = None   # communicator of the exchange group (exchange layouts)
    stripes: tuple[tuple[int, int], ...] = ()
    scatter: tuple[tuple[int, int], ...] = ()   # node-once's reader: each member's slice
                                    # (place in its memory, length), in group order
    format: str = "raw"             # checkpoint.format: formatted files start with a header
    verify: str = "none"            # run.verify: the hash algorithm
    expected: dict[tuple[str, str, int], str] | None = None   # (path, tensor, offset) -> hash
    finite_dtype: str = ""          # run.check_finite: the dtype to check, or ""
    tensor_dtypes: dict[str, str] | None = None   # existing checkpoints: per tensor instead
    record_digests: bool = False    # existing checkpoints: keep each extent's hash
    tensors_of_file: Mapping[str, tuple[str, ...]] = MappingProxyType({})   # for headers
    index_parser: Any = None        # existing checkpoints: bytes -> parsed index (or raise)
    content_block_bytes: int = 0    # prepare's block size: to say which bytes are corrupt
    follow_links: bool = True       # False: a prepared checkpoint's files are not links
    device: Any = None              # run.h2d: where the restored bytes go on to
    device_buffer: object = None    # the held shard's place in device memory
    places: tuple[int, ...] = ()    # each extent's first byte in the device buffer
    torch: TorchExchange | None = None   # run.exchange = torch: the TorchExchange
    notes: tuple[str, ...] = ()     # what the phases should say (the exchange, cuFile)
    where: Where | None = None      # --trace: each op's file and offset (else nothing kept)
    prefetch: Prefetch | None = None   # checkpoint.prefetch: WILLNEED ahead of the reads
    program: metadata_loop.Program | None = None  # stat, open and close only: the compiled pass (else None)

    @property
    def checks(self) -> bool:
        """Anything to compute over the bytes read (timed apart, as op verify)."""
        return self.verify != "none" or bool(self.finite_dtype)

    @property
    def holds(self) -> bool:
        """Reads land at their place in a buffer holding the whole shard (exchange layouts)."""
        return bool(self.plan.exchange)

    @property
    def on_device(self) -> bool:
        """The exchange moves device memory (nccl): the readers' bytes go there first."""
        return self.torch is not None and self.torch.backend == "nccl"


def build_setup(comm: mpi.Comm, spec: JobSpec, plan: RankPlan, backend: Backend, entry: dict[str, Any],
           buffer: AlignedBuffer, device: Device | None, catalogue: Catalogue | None) -> RankSetup:
    """Untimed, once per layout: paths, the exchange group, expected hashes."""
    named = [*plan.files, *filter(None, (plan.index_file, plan.list_dir))]
    paths = {relpath: backend.path(relpath) for relpath in named}
    group, leads, scatter = None, True, None
    if plan.exchange:  # collective: every rank of the layout splits
        by_node = plan.by_node or (plan.leader_reads and spec.broadcast_group == "node")
        # ordered by replica: member i of a striped group reads stripe i (with rank_shift
        # the replica order is not the world order); an owner leads its group
        group = mpi.split(comm, plan.group, by_node=by_node, key=plan.member)
        leads = not plan.leader_reads or group.Get_rank() == 0
    if plan.exchange == "scatter":   # the reader learns where each member's slice lies
        assert group is not None
        scatter = mpi.gather(group, (_held_place(plan), plan.hold.length))
    expected = None
    if spec.verify != "none" and catalogue is None:
        wanted = {(e.relpath, e.tensor, e.offset) for e in (*plan.extents, plan.hold)}
        expected = {key: s[spec.verify] for s in entry["slices"]
                    if (key := (s["path"], s.get("tensor", ""), s["offset"])) in wanted}
    if spec.verify != "none":   # the hash module's import is not part of a restore
        new_digest(spec.verify)
    backend, device_buffer, notes = _device_side(comm, spec, plan, backend, buffer, device)
    # a file prepare wrote is never a link: one there is not its file (a loader's cache
    # links the files of an existing checkpoint, though)
    follow_links = catalogue is not None
    exchange = None
    if spec.exchange == "torch":   # checked in every layout: before the first one's I/O
        exchange = _torch_exchange(comm, spec, plan, group, buffer, device, device_buffer)
        if exchange is not None:
            notes += (f"exchange through {exchange.label} ("
                      + ("device memory, GPU to GPU)" if exchange.backend == "nccl"
                         else "host memory)"),)
    return RankSetup(plan=plan, backend=backend, paths=paths, buffer=buffer,
                     where=Where() if spec.trace_limit else None,
                     direct=spec.cache == "direct", leads=leads, group=group, world=comm,
                     stripes=(plan.parts or stripes(spec, plan.hold))
                     if plan.exchange == "allgather" else (),
                     scatter=tuple(scatter or ()),
                     format=_format(spec, catalogue), verify=spec.verify, expected=expected,
                     finite_dtype=spec.dtype if spec.check_finite else "",
                     tensor_dtypes=_tensor_dtypes(spec, catalogue),
                     index_parser=mpi.collective(comm, "loading the index parser",
                                                 partial(_index_parser, catalogue)),
                     tensors_of_file={relpath: tuple(e.tensor for e in plan.extents
                                                     if e.relpath == relpath)
                                      for relpath in plan.files},
                     record_digests=catalogue is not None,
                     content_block_bytes=int(entry.get("content_block_bytes", 0)),
                     follow_links=follow_links,
                     device=device, device_buffer=device_buffer,
                     places=_places(plan, catalogue), torch=exchange, notes=notes,
                     prefetch=Prefetch(spec.prefetch_bytes) if spec.prefetch_bytes else None,
                     program=metadata_loop.build(plan, paths, backend, spec.cache == "direct",
                                                 follow_links) if leads else None)


def _held_place(plan: RankPlan) -> int:
    """Where a node-once rank's own slice lies in what its node's reader holds."""
    hold = plan.hold
    return next(extent.at(hold) for extent in plan.extents
                if (extent.relpath, extent.tensor, extent.offset) ==
                (hold.relpath, hold.tensor, hold.offset))


def _places(plan: RankPlan, catalogue: Catalogue | None) -> tuple[int, ...]:
    """Where each extent's first byte goes in the device buffer: at its place in the shard
    (stampede's layouts), or one after another (an existing checkpoint's tensors, whose
    offsets are each in its own file or tensor)."""
    if catalogue is None:
        return tuple(extent.offset - plan.hold.offset for extent in plan.extents)
    starts, place = [], 0
    for extent in plan.extents:
        starts.append(place)
        place += extent.length
    return tuple(starts)


def _device_side(comm: mpi.Comm, spec: JobSpec, plan: RankPlan, backend: Backend,
                 buffer: AlignedBuffer, device: Device | None) -> tuple[Backend, object, tuple[str, ...]]:
    """run.h2d: the device buffer, the read buffer page-locked (cuda-pinned) or the files
    also opened through cuFile (cuda-gds); the backend the reads go through, and notes."""
    if device is None:
        return backend, None, ()
    device_buffer = device.device_buffer(plan.hold.length)
    if spec.h2d == "cuda-pinned":  # in place, untimed: the read buffer is page-locked
        mpi.collective(comm, "page-locking the read buffer", partial(device.pin, buffer))
    if spec.h2d == "cuda-gds":
        backend, notes = _gds(comm, backend, device)
        return backend, device_buffer, notes
    return backend, device_buffer, ()


def _gds(comm: mpi.Comm, backend: Backend, device: Any) -> tuple[Backend, tuple[str, ...]]:
    """run.h2d = cuda-gds: the files also opened through cuFile; the label of what it is."""
    from stampede.run.devices import Gds, GdsFiles

    if getattr(device, "gds", None) is None:
        device.gds = mpi.collective(comm, "opening cuFile (kvikio)", Gds)
    if not backend.capabilities.local_files:
        raise AssertionError("run.h2d = cuda-gds on a target that is not POSIX (spec refuses it)")
    note = f"run.h2d = cuda-gds: {device.gds.label}"
    return cast(Backend, GdsFiles(backend, device.gds)), (note,)


def _torch_exchange(comm: mpi.Comm, spec: JobSpec, plan: RankPlan, group: Any, buffer: AlignedBuffer,
                    device: Device | None, device_buffer: object) -> TorchExchange | None:
    """run.exchange = torch: torch.distributed checked (every rank, exit 2 where missing),
    then, for a layout that exchanges, the exchange over the held shard: the device
    buffer (nccl) or the host buffer, without a copy (gloo)."""
    from stampede.run import torch_exchange

    backend = torch_exchange.backend_for(spec.h2d)
    mpi.collective(comm, "loading torch.distributed", partial(torch_exchange.require, backend))
    if not plan.exchange:
        return None
    if backend == "nccl":
        assert device is not None   # nccl: run.h2d = cuda-*, so a device was opened
        where = mpi.bcast(comm, mpi.gather(comm, (mpi.processor_name(comm), device.index)) or [])
        mpi.collective(comm, "placing the ranks on the GPUs",
                       partial(torch_exchange.one_rank_per_gpu, where))
    import torch

    tensor = device_buffer if backend == "nccl" else \
        torch.frombuffer(buffer.view[:plan.hold.length], dtype=torch.uint8)
    parts = (plan.parts or stripes(spec, plan.hold)) if plan.exchange == "allgather" else ()
    # torch's own timeout for the rendezvous and each collective: past the deadline, as
    # the MPI exchange's wait (a rank that never comes fails the job, never hangs it)
    return torch_exchange.open_exchange(comm, group, backend, tensor, parts, device,
                                        spec.deadline_s + 10.0)


def _format(spec: JobSpec, catalogue: Catalogue | None) -> str:
    """How the files are read: the byte ranges of DCP, torch and tensorizer are raw;
    safetensors and HDF5 have headers."""
    if catalogue is None:
        return spec.format
    from stampede.existing.catalogue import RAW_FORMATS
    return "raw" if catalogue.format in RAW_FORMATS else catalogue.format


def _index_parser(catalogue: Catalogue | None) -> object:
    if catalogue is None:
        return None
    from stampede.existing.scan import index_parser
    return index_parser(catalogue)


def _tensor_dtypes(spec: JobSpec, catalogue: Catalogue | None) -> dict[str, str] | None:
    """Existing checkpoints: run.check_finite checks each float tensor as its own dtype."""
    if catalogue is None or not spec.check_finite:
        return None
    from stampede.existing.assign import finite_dtypes
    return finite_dtypes(catalogue)
