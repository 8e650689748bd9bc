"""`stampede plan`: what a job would do, rendered before any I/O (a synthetic job's
options and who reads what), and what an existing checkpoint holds (from its headers)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from stampede.ops import OPS
from stampede.present.tables import ItemColumn, Verbatim, item_table
from stampede.targets import S3_PREFIX_RATES_PER_S
from stampede.units import (
    BYTES_PER_GIB,
    format_amplification,
    format_bytes,
    format_duration,
    format_number,
    format_percent,
)

if TYPE_CHECKING:
    from rich.console import Console

    from stampede.checkpoint.plan import Extent, RankPlan
    from stampede.checkpoint.prefix_requests import PrefixLoad
    from stampede.checkpoint.save_plan import FileWrite, SavePlan
    from stampede.model.traffic import LayoutBytes
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

SHOWN_EXTENTS = 4   # a rank reading more extents (whole-file) shows its first and last
# What a catalogue's items are called, by format (the others hold tensors).
ITEMS = {"dcp": "saved items", "torch": "storages", "tensorizer": "files (whole)"}


def render_plan(spec: JobSpec, nranks: int, backend: str, layouts: Sequence[PlannedRestore], space: str,
                console: Console, served: Sequence[LayoutBytes] = (), where: str = "") -> None:
    """`stampede plan`: the validated options and who reads what; touches no storage.
    `layouts`: per layout (name, files, [(rank, plan, reads storage)]); rank -1 stands for
    the ranks not shown. `served`: what storage would serve every layout at this rank
    count (`where`: how the ranks sit on nodes), so that a layout's N-fold reads show
    before it runs."""
    console.print(item_table(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s), "
                             f"backend {backend}", OPTIONS, spec.values.items()))

    def afterwards(read: RankRead) -> str:
        """What the rank does after its reads: the exchange, or how it learns the names."""
        plan = read.plan
        if plan.list_on_root and read.rank:
            return "gets rank 0's listing"
        exchange = {"bcast": "Bcast", "allgather": "Allgatherv",
                    "scatter": "to its node"}.get(plan.exchange, "-")
        if plan.by_node:   # node-once: the node's reader is known at run time
            exchange += " (reads if first on its node)"
        elif plan.leader_reads and spec.broadcast_group == "node":
            exchange += " (reads if first of its group on its node)"
        return exchange

    columns: tuple[ItemColumn[RankRead], ...] = (
        ItemColumn("rank", lambda read: str(read.rank)),
        ItemColumn("reads from storage", lambda read: read.extent.relpath if read.extent else "-",
                   left=True),
        ItemColumn("offset", lambda read: f"{read.extent.offset:,}" if read.extent else ""),
        ItemColumn("bytes", lambda read: format_bytes(read.extent.length) if read.extent else ""),
        ItemColumn("storage ops", lambda read: _counts(read.plan.op_counts(read.leads)),
                   left=True),
        ItemColumn("then", afterwards, left=True),
        ItemColumn("holds", lambda read: f"shard {read.plan.group}", left=True))
    for layout, files, shown in layouts:
        total = sum(size for _, size in files)
        lines: list[RankRead | Verbatim] = []
        for rank, plan, leads in shown:
            if rank < 0 or plan is None:   # the two go together
                lines.append(_more_ranks(nranks, len(shown)))
                continue
            # a line per extent it reads; one where it reads none (it receives its shard)
            extents: list[Extent | None] = [extent for extent in plan.extents if leads]
            if len(extents) > SHOWN_EXTENTS:   # whole-file: every slice; the first, the last
                lines += [RankRead(rank, plan, leads, extents[0]),
                          Verbatim(("", f"... {len(extents) - 2:,} more slices")),
                          RankRead(rank, plan, leads, extents[-1])]
                continue
            lines += [RankRead(rank, plan, leads, extent) for extent in extents or [None]]
        console.print(item_table(f"{layout}: {len(files)} file(s), {format_bytes(total)} "
                                 f"({total:,} B); per iteration each rank:", columns, lines))
    if served:
        render_served(served, f"{nranks} rank(s), {where}", console)
    console.print(f"space: {space}", markup=False)
    console.print(f"[dim]no storage was touched (the target's free space was asked); "
                  f"`stampede prepare` writes these files, `stampede run` reads them (cache "
                  f"{spec.cache}, {spec.iterations} iterations + {spec.warmup} warmup)[/]")


def render_served(served: Sequence[LayoutBytes], where: str, console: Console,
                  rates: tuple[str, float, float] | None = None) -> None:
    """Every layout's bytes from storage per restore at a scale (`where`), and their read
    amplification: `plan` at its rank count, `project` at the target. `rates`: (the layout
    fitted, B_agg, B_node in bytes/s; inf: not measured) price the bytes in seconds: the
    storage's share of them and the busiest NIC's (its reads, then its exchange)."""
    columns = list(SERVED)
    note = ""
    if rates is not None:
        fitted, agg_bps, node_bps = rates
        columns += [
            ItemColumn("storage s", lambda item: _seconds_at(item.storage_bytes, agg_bps)),
            ItemColumn("NIC s", lambda item: _seconds_at(item.node_bytes + item.exchange_bytes,
                                                         node_bps))]
        note = f"; seconds at {fitted}'s fitted B_agg" + \
            (" and B_node" if math.isfinite(node_bps) else " (B_node not measured)")
    console.print(item_table(f"every layout at {where}: bytes from storage per restore and "
                             f"their read amplification (over the "
                             f"{format_bytes(served[0].needed_bytes)} the job needs){note}",
                             columns, served))


def _seconds_at(nbytes: float, rate_bps: float) -> str:
    """Bytes at a rate, in seconds ('-' where the rate is not known)."""
    return format_duration(nbytes / rate_bps) if math.isfinite(rate_bps) and rate_bps > 0 \
        else "-"


def render_save_plan(spec: JobSpec, nranks: int, layouts: Sequence[PlannedSave], space: str,
                     console: Console) -> None:
    """`stampede plan --save`: who writes what in one save of each layout (rank -1 stands
    for the ranks not shown), and whether the versions kept at once fit."""
    console.print(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s): each save "
                  f"writes a new version, {spec.save_mode}, durability {spec.durability}, "
                  f"validate {spec.validate}, keep {spec.keep}, mkdir by {spec.mkdir_by}")
    for layout, files, directories, shown in layouts:
        total = sum(size for _, size in files)
        lines: list[RankWrite | Verbatim] = []
        for rank, plan in shown:
            if plan is None:
                lines.append(_more_ranks(nranks, len(shown)))
                continue
            lines += [RankWrite(rank, file.relpath, file.extents[0].offset, file.extents[0].length,
                            _does(file, spec.block_bytes)) for file in plan.files] or \
                [RankWrite(rank, "-", None, None, "holds its shard; writes nothing")]
            if plan.index is not None:
                lines.append(RankWrite(rank, plan.index.relpath, 0, spec.index_bytes,
                                   "the index, once every shard is durable; then publishes"))
            elif rank == 0:
                lines.append(RankWrite(0, "saves/" + layout + "/latest", None, None, "publishes"))
        console.print(item_table(f"{layout} save: {len(files)} file(s), {format_bytes(total)} "
                                 f"({total:,} B), {len(directories)} directories per version; "
                                 "each rank:", WRITES, lines))
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
        lines = [RankShare(rank, plans[rank], shares[rank]) if rank >= 0
                 else _more_ranks(nranks, len(shown)) for rank in shown]
        console.print(item_table(f"assign {policy}: {nranks} rank(s), largest share "
                                 f"{format_bytes(max(shares))}, smallest "
                                 f"{format_bytes(min(shares))}; per iteration each rank:",
                                 SHARES, lines))
    console.print("[dim]only the headers were read; `stampede run --checkpoint PATH` restores "
                  "it read-only[/]")


class RankRead(NamedTuple):
    """A line of a layout's restore plan: a rank and one extent it reads (None: none)."""

    rank: int
    plan: RankPlan
    leads: bool                       # it reads storage (not only its group's first rank)
    extent: Extent | None


class RankWrite(NamedTuple):
    """A line of a layout's save plan: a file a rank writes into, or what it does instead."""

    rank: int
    relpath: str
    offset_bytes: int | None          # None: it writes no bytes of it
    length_bytes: int | None
    does: str


class RankShare(NamedTuple):
    """A line of an existing checkpoint's restore plan: a rank's share under one policy."""

    rank: int
    plan: RankPlan
    share_bytes: int


OPTIONS: tuple[ItemColumn[tuple[str, object]], ...] = (
    ItemColumn("key", lambda option: option[0], left=True),
    ItemColumn("value", lambda option: _option_text(option[1]), left=True))

WRITES: tuple[ItemColumn[RankWrite], ...] = (
    ItemColumn("rank", lambda write: str(write.rank)),
    ItemColumn("writes into", lambda write: write.relpath, left=True),
    ItemColumn("offset", lambda write: "" if write.offset_bytes is None
               else f"{write.offset_bytes:,}"),
    ItemColumn("bytes", lambda write: "" if write.length_bytes is None
               else format_bytes(write.length_bytes)),
    ItemColumn("does", lambda write: write.does, left=True))

SERVED: tuple[ItemColumn[LayoutBytes], ...] = (
    ItemColumn("layout", lambda served: served.layout, left=True),
    ItemColumn("from storage", lambda served: format_bytes(served.storage_bytes)),
    ItemColumn("read ampl", lambda served: format_amplification(served.amplification)),
    ItemColumn("busiest node", lambda served: format_bytes(served.node_bytes)),
    ItemColumn("a reader", lambda served: format_bytes(served.reader_bytes)),
    ItemColumn("NIC exchange", lambda served: format_bytes(served.exchange_bytes)
               if served.exchange_bytes else "-"))

# An object store's requests at each layout's busiest prefix (PrefixLoad), against S3's
# documented rates per prefix: a share above 100% is 503 SlowDown until S3 partitions it
PREFIXES: tuple[ItemColumn[PrefixLoad], ...] = (
    ItemColumn("layout", lambda load: load.layout, left=True),
    ItemColumn("prefixes", lambda load: f"{load.prefixes:,}"),
    ItemColumn("busiest", lambda load: load.busiest or "(top)", left=True),
    ItemColumn("GET", lambda load: f"{load.requests['GET']:,}"),
    ItemColumn("HEAD", lambda load: f"{load.requests['HEAD']:,}"),
    ItemColumn("LIST", lambda load: f"{load.requests['LIST']:,}"),
    ItemColumn("reads/s", lambda load: format_number(load.reads_per_s)),
    ItemColumn(f"of {S3_PREFIX_RATES_PER_S['read']:,.0f}", lambda load: _share(load.read_share)),
    ItemColumn("K needed", lambda load: _copies(load.copies_for_rate)),
    ItemColumn("save PUTs", lambda load: f"{load.save_writes:,}" if load.save_prefixes
               else "-"),
    ItemColumn(f"of {S3_PREFIX_RATES_PER_S['write']:,.0f}",
               lambda load: _share(load.write_share) if load.save_prefixes else "-"))


def _copies(needed: int | None) -> str:
    """checkpoint.copies that bring the busiest prefix to S3's rate (None: none can)."""
    return "none" if needed is None else f"{needed:,}"


def _share(share: float) -> str:
    """A share of S3's rate, marked where it is past it (503s until S3 partitions)."""
    text = format_percent(share)
    return f"[bold red]{text}[/]" if share > 1 else text


def render_prefixes(loads: Sequence[PrefixLoad], nranks: int, console: Console) -> None:
    """`stampede plan` on an object store: each layout's requests at its busiest prefix per
    restore (and per save), a second over the restore time, against S3's documented rates,
    and the copies that would bring it to them."""
    restore_s = loads[0].restore_s
    console.print(item_table(
        f"object store requests per prefix at {nranks:,} rank(s), keys {loads[0].keys}: "
        "each layout's busiest "
        f"prefix per restore, a second over a {format_duration(restore_s)} restore (a "
        f"save's PUT and POST over the same time), against S3's documented "
        f"{S3_PREFIX_RATES_PER_S['read']:,.0f} GET/HEAD and "
        f"{S3_PREFIX_RATES_PER_S['write']:,.0f} PUT/POST per prefix a second", PREFIXES, loads))
    console.print("[dim]past 100%: 503 SlowDown until S3 partitions the prefix (minutes); "
                  "checkpoint.copies and key_prefix spread the requests over more "
                  "prefixes (`stampede emulate-s3` throttles a laptop's)[/]")


SHARES: tuple[ItemColumn[RankShare], ...] = (
    ItemColumn("rank", lambda share: str(share.rank)),
    ItemColumn("files", lambda share: f"{len(share.plan.files)}: "
               f"{', '.join(share.plan.files[:2])}" + (" ..." if len(share.plan.files) > 2 else ""),
               left=True),
    ItemColumn("tensors", lambda share: str(len(share.plan.extents))),
    ItemColumn("bytes", lambda share: f"{share.share_bytes:,}"),
    ItemColumn("storage ops", lambda share: _counts(share.plan.op_counts()), left=True))


def _option_text(value: object) -> str:
    """A job key's value: a list joined by '+', an unset one '-'."""
    if isinstance(value, tuple):
        return "+".join(value)
    return "-" if value is None else str(value)


def _more_ranks(nranks: int, shown: int) -> Verbatim:
    """The line standing for the ranks not shown (`shown` counts it)."""
    return Verbatim(("...", f"({nranks - shown + 1} more ranks)"))


def _does(file: FileWrite, block_bytes: int) -> str:
    """A rank's ops on a file it writes: 'create, 4 write, fsync, close, rename'."""
    length = file.extents[0].length
    return ("create, " if file.creates else "open, ") + \
        f"{-(-length // block_bytes)} write, fsync, close" + (", rename" if file.creates else "")


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
