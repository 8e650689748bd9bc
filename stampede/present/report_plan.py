"""`stampede plan`: what a job would do, rendered before any I/O (a synthetic job's
options and who reads what), and what an existing checkpoint holds (from its headers)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stampede.ops import OPS
from stampede.present.tables import new_table
from stampede.units import BYTES_PER_GIB, format_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from stampede.checkpoint.plan import Extent, RankPlan
    from stampede.checkpoint.save_plan import SavePlan
    from stampede.spec import JobSpec

    # per layout: its name, its files (name, bytes), (rank, plan, whether it reads storage)
    # of the ranks shown (-1 and None: the ranks not shown)
    PlannedRestore = tuple[str, tuple[tuple[str, int], ...],
                           list[tuple[int, RankPlan | None, bool]]]
    # per layout: its name, its files (name, bytes), its directories, (rank, plan) of the
    # ranks shown (-1 and None: the ranks not shown)
    PlannedSave = tuple[str, tuple[tuple[str, int], ...], tuple[str, ...],
                        list[tuple[int, SavePlan | None]]]

    from typing import Protocol

    class _Tensor(Protocol):
        @property
        def dtype(self) -> str: ...

    class ExistingCheckpoint(Protocol):
        """What `stampede plan` shows of an existing checkpoint: stampede.existing's
        Catalogue fits it (a layer present does not import)."""

        @property
        def root(self) -> str: ...
        @property
        def format(self) -> str: ...
        @property
        def files(self) -> Sequence[tuple[str, int]]: ...
        @property
        def tensors(self) -> Sequence[_Tensor]: ...
        @property
        def index_file(self) -> str: ...
        @property
        def saving_ranks(self) -> int: ...
        @property
        def total_bytes(self) -> int: ...

# What a catalogue's items are called, by format (the others hold tensors).
ITEMS = {"dcp": "saved items", "torch": "storages", "tensorizer": "files (whole)"}


def render_plan(spec: JobSpec, nranks: int, backend: str, layouts: Sequence[PlannedRestore], space: str,
                console: Console) -> None:
    """`stampede plan`: the validated options and who reads what; touches no storage.
    `layouts`: per layout (name, files, [(rank, plan, reads storage)]); rank -1 stands for
    the ranks not shown."""
    options = new_table(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s), "
                        f"backend {backend}", ("key", "value"), left=("key", "value"))
    for key, value in spec.values.items():
        text = "+".join(value) if isinstance(value, tuple) else "-" if value is None else str(value)
        options.add_row(key, text)
    console.print(options)
    for layout, files, shown in layouts:
        total = sum(size for _, size in files)
        table = new_table(f"{layout}: {len(files)} file(s), {format_bytes(total)} ({total:,} B); "
                          "per iteration each rank:",
                          ("rank", "reads from storage", "offset", "bytes", "storage ops", "then",
                           "holds"), left=("reads from storage", "storage ops", "then", "holds"))
        for rank, plan, leads in shown:
            if rank < 0 or plan is None:   # the two go together
                table.add_row("...", f"({nranks - len(shown) + 1} more ranks)", *[""] * 5)
                continue
            then = {"bcast": "Bcast", "allgather": "Allgatherv"}.get(plan.exchange, "-")
            if plan.leader_reads and spec.broadcast_group == "node":
                then += " (reads if first of its group on its node)"
            if plan.list_on_root and rank:
                then = "gets rank 0's listing"
            read: list[Extent | None] = [extent for extent in plan.extents if leads]
            for extent in read or [None]:
                table.add_row(str(rank), extent.relpath if extent else "-",
                              f"{extent.offset:,}" if extent else "",
                              format_bytes(extent.length) if extent else "",
                              _counts(plan.op_counts(leads)), then, f"shard {plan.group}")
        console.print(table)
    console.print(f"space: {space}", markup=False)
    console.print(f"[dim]no storage was touched (the target's free space was asked); "
                  f"`stampede prepare` writes these files, `stampede run` reads them (cache "
                  f"{spec.cache}, {spec.iterations} iterations + {spec.warmup} warmup)[/]")


def render_save_plan(spec: JobSpec, nranks: int, layouts: Sequence[PlannedSave], space: str,
                     console: Console) -> None:
    """`stampede plan --save`: who writes what in one save of each layout (rank -1 stands
    for the ranks not shown), and whether the versions kept at once fit."""
    console.print(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s): each save "
                  f"writes a new version, {spec.save_mode}, durability {spec.durability}, "
                  f"validate {spec.validate}, keep {spec.keep}, mkdir by {spec.mkdir_by}")
    for layout, files, directories, shown in layouts:
        total = sum(size for _, size in files)
        table = new_table(f"{layout} save: {len(files)} file(s), {format_bytes(total)} "
                          f"({total:,} B), {len(directories)} directories per version; each "
                          "rank:", ("rank", "writes into", "offset", "bytes", "does"),
                          left=("writes into", "does"))
        for rank, plan in shown:
            if plan is None:
                table.add_row("...", f"({nranks - len(shown) + 1} more ranks)", "", "", "")
                continue
            for file in plan.files or [None]:
                if file is None:
                    table.add_row(str(rank), "-", "", "", "holds its shard; writes nothing")
                    continue
                extent = file.extents[0]
                does = ("create, " if file.creates else "open, ") + \
                    f"{-(-extent.length // spec.block_bytes)} write, fsync, close" + \
                    (", rename" if file.creates else "")
                table.add_row(str(rank), file.relpath, f"{extent.offset:,}",
                              format_bytes(extent.length), does)
            if plan.index is not None:
                table.add_row(str(rank), plan.index.relpath, "0", format_bytes(spec.index_bytes),
                              "the index, once every shard is durable; then publishes")
            elif rank == 0:
                table.add_row("0", "saves/" + layout + "/latest", "", "", "publishes")
        console.print(table)
    console.print(f"space: {space}", markup=False)
    console.print("[dim]no storage was touched (the target's free space was asked); "
                  "`stampede save` writes these versions, `stampede run` restores the "
                  "published one[/]")


def render_existing_plan(catalogue: ExistingCheckpoint, nranks: int,
                         policies: Sequence[tuple[str, list[RankPlan], list[int]]],
                         console: Console) -> None:
    """`stampede plan --checkpoint PATH`: what the checkpoint holds (from its headers) and
    who reads what under each assign policy: (policy, [plan of every rank], ranks shown)."""
    for line in _describe_checkpoint(catalogue):
        console.print(line)
    for policy, plans, shown in policies:
        shares = [sum(extent.length for extent in plan.extents) for plan in plans]
        table = new_table(f"assign {policy}: {nranks} rank(s), largest share "
                          f"{format_bytes(max(shares))}, smallest {format_bytes(min(shares))}; "
                          "per iteration each rank:",
                          ("rank", "files", "tensors", "bytes", "storage ops"),
                          left=("files", "storage ops"))
        for rank in shown:
            if rank < 0:
                table.add_row("...", f"({nranks - len(shown) + 1} more ranks)", "", "", "")
                continue
            plan = plans[rank]
            files = plan.files
            table.add_row(str(rank), f"{len(files)}: {', '.join(files[:2])}"
                          + (" ..." if len(files) > 2 else ""),
                          str(len(plan.extents)), f"{shares[rank]:,}", _counts(plan.op_counts()))
        console.print(table)
    console.print("[dim]only the headers were read; `stampede run --checkpoint PATH` restores "
                  "it read-only[/]")


def _counts(counts: dict[str, int]) -> str:
    """'1 stat 1 open 2 read 1 close', in the order a restore runs the ops."""
    ordered = sorted(counts.items(), key=lambda item: OPS.index(item[0]))
    return " ".join(f"{count} {op}" for op, count in ordered if count) or "-"


def _describe_checkpoint(catalogue: ExistingCheckpoint) -> list[str]:
    """Human lines for `stampede plan`: format, files, tensors, bytes, index, savers."""
    kinds = {"safetensors": "safetensors", "dcp": "PyTorch DCP", "hdf5": "HDF5",
             "torch": "torch.save zip", "tensorizer": "tensorizer, whole files"}
    file_bytes = sum(size for _, size in catalogue.files)
    more = f" and {len(catalogue.files) - 3} more" if len(catalogue.files) > 3 else ""
    dtypes = Counter(t.dtype or "bytes" for t in catalogue.tensors)
    lines = [
        f"checkpoint: {catalogue.root} ({kinds.get(catalogue.format, catalogue.format)})",
        f"files: {len(catalogue.files)} data file(s), {file_bytes:,} bytes "
        f"({format_bytes(file_bytes)}): {', '.join(name for name, _ in catalogue.files[:3])}{more}",
        f"{ITEMS.get(catalogue.format, 'tensors')}: "
        f"{len(catalogue.tensors)} ("
        + ", ".join(f"{dtype} {count}" for dtype, count in dtypes.most_common()) + ")",
        f"bytes to restore: {catalogue.total_bytes:,} ({catalogue.total_bytes / BYTES_PER_GIB:.3f} GiB)",
        f"index file: {catalogue.index_file or 'none'}"
        + (" (read whole by every rank first)" if catalogue.format == "dcp" else ""),
    ]
    if catalogue.format == "dcp":
        lines.append(f"saving ranks: {catalogue.saving_ranks}")
    return lines
