"""`stampede plan`: what a job would do, rendered before any I/O (a synthetic job's
options and who reads what), and what an existing checkpoint holds (from its headers)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from stampede.results.report import new_table
from stampede.units import format_bytes


def render_plan(spec: Any, nranks: int, backend: str, console: Any, shown_ranks: int = 4) -> None:
    """`stampede plan`: the validated options and who reads what; touches no storage."""
    from stampede.checkpoint.plan import Extent, checkpoint_files, plan_rank
    from stampede.results.samples import OPS

    options = new_table(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s), "
                     f"backend {backend}", ("key", "value"), left=("key", "value"))
    for key, value in spec.values.items():
        text = "+".join(value) if isinstance(value, tuple) else "-" if value is None else str(value)
        options.add_row(key, text)
    console.print(options)
    for layout in spec.layouts:
        files = checkpoint_files(spec, layout, nranks)
        total = sum(size for _, size in files)
        table = new_table(f"{layout}: {len(files)} file(s), {format_bytes(total)} ({total} B); "
                       "per iteration each rank:",
                       ("rank", "reads from storage", "offset", "bytes", "storage ops", "then",
                        "holds"), left=("reads from storage", "storage ops", "then", "holds"))
        ranks = list(range(nranks))
        if nranks > 2 * shown_ranks:
            ranks = ranks[:shown_ranks] + [-1] + ranks[-shown_ranks:]
        for rank in ranks:
            if rank < 0:
                table.add_row("...", f"({nranks - 2 * shown_ranks} more ranks)", *[""] * 5)
                continue
            plan = plan_rank(spec, layout, nranks, rank)
            # broadcast by replica: a group's leader is its lowest rank, the shard's index;
            # by node the leaders are only known at run time.
            leads = not plan.leader_reads or (spec.broadcast_group == "replica"
                                              and rank == plan.group)
            ordered = sorted(plan.op_counts(leads).items(), key=lambda item: OPS.index(item[0]))
            counts = " ".join(f"{count} {op}" for op, count in ordered if count)
            then = {"bcast": "Bcast", "allgather": "Allgatherv"}.get(plan.exchange, "-")
            if plan.leader_reads and spec.broadcast_group == "node":
                then += " (reads if first of its group on its node)"
            if plan.list_on_root and rank:
                then = "gets rank 0's listing"
            reads: list[Extent | None] = [extent for extent in plan.extents if leads] or [None]
            for extent in reads:
                table.add_row(str(rank), extent.relpath if extent else "-",
                              str(extent.offset) if extent else "", str(extent.length) if extent else "",
                              counts or "-", then, f"shard {plan.group}")
        console.print(table)
    console.print(f"[dim]no storage was touched; `stampede prepare` writes these files, "
                  f"`stampede run` reads them (cache {spec.cache}, {spec.iterations} iterations "
                  f"+ {spec.warmup} warmup)[/]")


def render_existing_plan(spec: Any, catalogue: Any, nranks: int, console: Any,
                         shown_ranks: int = 4) -> None:
    """`stampede plan --checkpoint PATH`: what the checkpoint holds (from its headers) and
    who reads what under each assign policy."""
    from stampede.existing.assign import plan_existing
    from stampede.results.samples import OPS

    for line in _describe_checkpoint(catalogue):
        console.print(line)
    for policy in spec.assign:
        plans = [plan_existing(catalogue, spec, policy, nranks, rank) for rank in range(nranks)]
        shares = [sum(extent.length for extent in plan.extents) for plan in plans]
        table = new_table(f"assign {policy}: {nranks} rank(s), largest share "
                       f"{format_bytes(max(shares))}, smallest {format_bytes(min(shares))}; "
                       "per iteration each rank:",
                       ("rank", "files", "tensors", "bytes", "storage ops"),
                       left=("files", "storage ops"))
        ranks = list(range(nranks))
        if nranks > 2 * shown_ranks:
            ranks = ranks[:shown_ranks] + [-1] + ranks[-shown_ranks:]
        for rank in ranks:
            if rank < 0:
                table.add_row("...", f"({nranks - 2 * shown_ranks} more ranks)", "", "", "")
                continue
            plan = plans[rank]
            ordered = sorted(plan.op_counts().items(), key=lambda item: OPS.index(item[0]))
            files = plan.files
            table.add_row(str(rank), f"{len(files)}: {', '.join(files[:2])}"
                          + (" ..." if len(files) > 2 else ""),
                          str(len(plan.extents)), f"{shares[rank]:,}",
                          " ".join(f"{count} {op}" for op, count in ordered if count) or "-")
        console.print(table)
    console.print("[dim]only the headers were read; `stampede run --checkpoint PATH` restores "
                  "it read-only[/]")


def _describe_checkpoint(catalogue: Any) -> list[str]:
    """Human lines for `stampede plan`: format, files, tensors, bytes, index, savers."""
    kinds = {"safetensors": "safetensors", "dcp": "PyTorch DCP", "hdf5": "HDF5"}
    file_bytes = sum(size for _, size in catalogue.files)
    more = f" and {len(catalogue.files) - 3} more" if len(catalogue.files) > 3 else ""
    dtypes = Counter(t.dtype or "bytes" for t in catalogue.tensors)
    lines = [
        f"checkpoint: {catalogue.root} ({kinds.get(catalogue.format, catalogue.format)})",
        f"files: {len(catalogue.files)} data file(s), {file_bytes:,} bytes "
        f"({format_bytes(file_bytes)}): {', '.join(name for name, _ in catalogue.files[:3])}{more}",
        f"{'saved items' if catalogue.format == 'dcp' else 'tensors'}: "
        f"{len(catalogue.tensors)} ("
        + ", ".join(f"{dtype} {count}" for dtype, count in dtypes.most_common()) + ")",
        f"bytes to restore: {catalogue.total_bytes:,} ({catalogue.total_bytes / 2**30:.3f} GiB)",
        f"index file: {catalogue.index_file or 'none'}"
        + (" (read whole by every rank first)" if catalogue.format == "dcp" else ""),
    ]
    if catalogue.format == "dcp":
        lines.append(f"saving ranks: {catalogue.saving_ranks}")
    return lines
