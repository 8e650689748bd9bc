"""The terminal report, rendered from archive rows alone (so `run` and `report` agree).

It only formats: every number shown is a cell of the CSV. rich is imported here, lazily,
and only rank 0 ever calls this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from stampede.units import format_bytes, format_in, format_number, format_seconds, seconds_unit

DEFINITIONS = (
    "time to last rank = slowest rank's time from the phase's start (its node's first rank out "
    "of the start barrier) until it holds all its "
    "bytes (median over iterations, min-max spread); first done = fastest rank; straggler = "
    "slowest / median rank. agg GB/s = total bytes / (last stop - first start), GB = 1e9 B, "
    "per-rank rates never summed; slowest-rank GB/s = bytes per rank / time to last rank; "
    "storage / network part = first start to last stop of the storage ops (list, index, "
    "stat, open, header, read, close) / of the exchange ops (bcast, allgather), all ranks. "
    "Latencies pool every rank's samples of every measured iteration."
)


def _float(row: dict[str, str], column: str) -> float:
    text = row.get(column, "")
    return float(text) if text else float("nan")


def _int(row: dict[str, str], column: str) -> int:
    text = row.get(column, "")
    return int(text) if text else 0


def _seconds(row: dict[str, str], column: str) -> str:
    return format_seconds(_float(row, column))


def _range(row: dict[str, str], low: str, high: str) -> str:
    """'30.7-49.3 ms': a min-max spread in one unit."""
    unit, factor = seconds_unit(_float(row, high))
    return f"{format_in(_float(row, low), factor)}-{format_in(_float(row, high), factor)} {unit}"


def _table(title: str, headers: Sequence[str], left: Sequence[str] = ()) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for header in headers:
        if header in left:  # names and paths fold rather than lose their tail
            table.add_column(header, justify="left", overflow="fold")
        else:
            table.add_column(header, justify="right", no_wrap=True)
    return table


def _runs(rows: Iterable[dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    grouped: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        grouped.setdefault(row["run_id"], []).append(row)
    return grouped


# Output to a file or pipe (CI logs, `| less`) is not squeezed into 80 columns.
PIPE_WIDTH = 120


def make_console(file: Any = None, width: int | None = None) -> Any:
    from rich.console import Console
    console = Console(file=file, width=width, highlight=False)
    if width is None and not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def render_archive(rows: Sequence[dict[str, str]], console: Any, run_ids: Sequence[str] = (),
                   last: int = 1) -> None:
    """The chosen runs in full (default: the last one), then every run's restore in a line."""
    grouped = _runs(rows)
    chosen = list(run_ids) or list(grouped)[-last:]
    for run_id in chosen:
        if run_id not in grouped:
            from stampede.errors import UsageError
            raise UsageError(f"run {run_id!r} is not in the archive",
                             hint="the history table lists the run ids")
        render_run(grouped[run_id], console)
    if len(grouped) > 1:
        render_history(rows, console)


def render_run(rows: Sequence[dict[str, str]], console: Any, messages: Sequence[str] = ()) -> None:
    first = rows[0]
    if first["job"] == "gpu" and first.get("device"):
        render_gpu(rows, console)   # `stampede gpu` runs: one line per mode and size
        return
    console.print()
    console.rule(f"[bold]stampede[/] {first['job']}  run {first['run_id']}")
    if first["layout"] == "startup":
        _render_startup(rows, console)
        return
    console.print(
        f"{first['nranks']} ranks on {first['nnodes']} node(s) ({first['ranks_per_node']}/node), "
        f"backend {first['backend']} ({first.get('fs_type') or '?'}) at {first.get('target', '')}\n"
        f"cache [bold]{first['cache']}[/], {format_bytes(_int(first, 'bytes_per_rank'))} per rank, "
        f"block {format_bytes(_int(first, 'block_bytes'))}, pattern {first.get('pattern', '')}, "
        f"{first['iterations']} iterations + {first.get('warmup', '?')} warmup, "
        f"verify {first.get('verify', 'none')}, {first['timestamp']}"
        + (f"\nh2d {first['h2d']} to [bold]{first.get('device', '')}[/]"
           if first.get("h2d", "none") not in ("none", "") else ""))
    restores = sorted((row for row in rows if row["op"] == "restore"),
                      key=lambda row: _float(row, "time_to_last_rank_s"))
    table = _table("Restore: time until every rank holds its bytes (best first)",
                   ("layout", "last\nrank", "min-max", "first\ndone", "strag-\ngler", "agg\nGB/s",
                    "slowest\nGB/s", "storage\nops/it", "storage\npart", "network\npart", "valid"),
                   left=("layout",))
    for row in restores:  # none in rows imported from IOR or mdtest
        table.add_row(
            row["layout"], _seconds(row, "time_to_last_rank_s"),
            _range(row, "time_to_last_rank_min_s", "time_to_last_rank_max_s"),
            _seconds(row, "first_done_s"), f"{_float(row, 'straggler_ratio'):.2f}",
            format_number(_float(row, "agg_gbps")), format_number(_float(row, "slowest_rank_gbps")),
            format_number(_float(row, "storage_ops_per_iteration")), _seconds(row, "storage_s"),
            _seconds(row, "network_s"),
            "yes" if row["valid"] == "true" else "[red]NO[/]")
    if restores:
        console.print(table)
    for row in restores:
        slowest = ", ".join(f"rank {item.rsplit(':', 1)[0]} {format_seconds(float(item.rsplit(':', 1)[1]))}"
                            for item in row["slowest_ranks"].split())
        console.print(f"  {row['layout']}: slowest ranks (median restore): {slowest or '-'}")
    for layout in dict.fromkeys(row["layout"] for row in rows):
        _render_layout_ops([row for row in rows if row["layout"] == layout], console)
    for message in messages:
        console.print(f"[red]error:[/] {message}")
    console.print(f"[dim]{DEFINITIONS}[/]")


def _render_startup(rows: Sequence[dict[str, str]], console: Any) -> None:
    """`stampede startup`: T_pod_init per rank, the same latency table as any op."""
    startup = next(row for row in rows if row["op"] == "startup")
    console.print(f"{startup['nranks']} ranks on {startup['nnodes']} node(s) "
                  f"({startup['ranks_per_node']}/node), {startup['timestamp']}")
    slowest = ", ".join(f"rank {item.rsplit(':', 1)[0]} {format_seconds(float(item.rsplit(':', 1)[1]))}"
                        for item in startup["slowest_ranks"].split())
    console.print(f"Start-up (T_pod_init): last rank ready after [bold]"
                  f"{_seconds(startup, 'time_to_last_rank_s')}[/], first after "
                  f"{_seconds(startup, 'first_done_s')}, straggler "
                  f"{_float(startup, 'straggler_ratio'):.2f}; slowest ranks: {slowest or '-'}")
    _render_layout_ops(rows, console)
    console.print("[dim]interpreter = launch -> stampede's first line; import = stampede's run "
                  "modules and --import; mpi_init = MPI_Init; startup = launch -> MPI ready. "
                  "Wall clock (time.time_ns) across processes.[/]")


def _render_layout_ops(rows: Sequence[dict[str, str]], console: Any) -> None:
    layout = rows[0]["layout"]
    approximate = rows[0].get("samples") == "histogram"
    table = _table(f"{layout}: latency per op, all ranks and iterations"
                   + (" (p50-p99.9 from histograms, within 12%)" if approximate else ""),
                   ("op", "unit", "count", "err", "min", "p50", "p90", "p99", "p99.9", "max",
                    "ops/s", "agg\nGB/s"), left=("op", "unit"))
    for row in rows:
        unit, factor = seconds_unit(_float(row, "lat_p50_s"))
        table.add_row(row["op"], unit, row["count"], row["errors"] if row["errors"] == "0" else
                      f"[red]{row['errors']}[/]",
                      *(format_in(_float(row, f"lat_{name}_s"), factor)
                        for name in ("min", "p50", "p90", "p99", "p999", "max")),
                      format_number(_float(row, "ops_per_s")), format_number(_float(row, "agg_gbps")))
    console.print(table)
    first = rows[0]
    if first.get("invalid_reason"):
        console.print(f"[red]{layout}: INVALID: {first['invalid_reason']}[/]")
    for warning in filter(None, first.get("warnings", "").split(" | ")):
        console.print(f"[yellow]{layout}: warning:[/] {warning}")


def render_history(rows: Sequence[dict[str, str]], console: Any) -> None:
    table = _table("Every run in the archive: time to last rank (restore, or startup)",
                   ("run", "job", "layout", "ranks", "cache", "bytes", "last\nrank",
                    "agg\nGB/s", "valid"), left=("run", "job", "layout"))
    for row in rows:
        if not row.get("time_to_last_rank_s"):
            continue
        table.add_row(row["run_id"], row["job"], row["layout"], row["nranks"], row["cache"],
                      format_bytes(_int(row, "bytes_total")),
                      _seconds(row, "time_to_last_rank_s"),
                      format_number(_float(row, "agg_gbps")),
                      "yes" if row["valid"] == "true" else "[red]NO[/]")
    console.print(table)


def render_plan(spec: Any, nranks: int, backend: str, console: Any, shown_ranks: int = 4) -> None:
    """`stampede plan`: the validated options and who reads what; touches no storage."""
    from stampede.checkpoint.plan import Extent, checkpoint_files, plan_rank
    from stampede.results.samples import OPS

    options = _table(f"job {spec.name} ({spec.source}) - validated, {nranks} rank(s), "
                     f"backend {backend}", ("key", "value"), left=("key", "value"))
    for key, value in spec.values.items():
        text = "+".join(value) if isinstance(value, tuple) else "-" if value is None else str(value)
        options.add_row(key, text)
    console.print(options)
    for layout in spec.layouts:
        files = checkpoint_files(spec, layout, nranks)
        total = sum(size for _, size in files)
        table = _table(f"{layout}: {len(files)} file(s), {format_bytes(total)} ({total} B); "
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
        table = _table(f"assign {policy}: {nranks} rank(s), largest share "
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


def render_comparison(title: str, comparisons: Sequence[Any], console: Any) -> None:
    """`stampede compare`: one line per (configuration, metric), B / A with a verdict."""
    table = _table(f"{title}: ratio B / A (latest run of each configuration)",
                   ("layout", "op", "ranks", "cache", "metric", "A", "B", "B / A", "verdict"),
                   left=("layout", "op", "cache", "metric", "verdict"))
    for comparison in comparisons:
        key = dict(comparison.key)
        seconds = comparison.metric.endswith("_s")
        shown = (format_seconds if seconds else format_number)
        colour = {"better": "green", "worse": "red"}.get(comparison.verdict.rstrip("?"), "dim")
        table.add_row(key.get("layout", "*"), key.get("op", ""), key.get("nranks", ""),
                      key.get("cache", "*"), comparison.metric, shown(comparison.base),
                      shown(comparison.other), f"{comparison.ratio:.3f}",
                      f"[{colour}]{comparison.verdict}[/]")
    console.print(table)
    console.print("[dim]within spread = the two sides' per-iteration min-max ranges overlap. "
                  "p99 has no spread in the archive: '?' marks a verdict by direction only, "
                  "'similar?' a difference under 5%.[/]")


def render_gpu(rows: Sequence[dict[str, str]], console: Any) -> None:
    """`stampede gpu`: one line per (mode, size), the device named on every report."""
    first = rows[0]
    console.print()
    console.rule(f"[bold]stampede gpu[/]  run {first['run_id']}")
    console.print(f"{first['nranks']} ranks on {first['nnodes']} node(s), device "
                  f"[bold]{first['device']}[/], {first['iterations']} trials per size")
    table = _table("Host -> device, per rank (all ranks at once)",
                   ("mode", "size", "h2d p50", "h2d agg\nGB/s", "restore\nlast rank",
                    "slowest-rank\nGB/s", "of link\npeak", "cache"), left=("mode", "cache"))
    peak = _float(first, "link_peak_gbps")
    for restore in (row for row in rows if row["op"] == "restore"):
        h2d = next((row for row in rows if row["op"] == "h2d" and row["layout"] == restore["layout"]
                    and row["block_bytes"] == restore["block_bytes"]), {})
        slowest = _float(restore, "slowest_rank_gbps")
        table.add_row(restore["layout"], format_bytes(_int(restore, "block_bytes")),
                      _seconds(h2d, "lat_p50_s") if h2d else "-",
                      format_number(_float(h2d, "agg_gbps")) if h2d else "-",
                      _seconds(restore, "time_to_last_rank_s"), format_number(slowest),
                      "-" if peak != peak else f"{slowest / peak:.0%}", restore["cache"])
    console.print(table)
    for warning in filter(None, first.get("warnings", "").split(" | ")):
        console.print(f"[yellow]warning:[/] {warning}")
    console.print(f"[dim]GB/s = 1e9 B/s; h2d = the copy alone (CUDA events on a GPU); restore = "
                  f"barrier -> bytes in device memory (file modes: read + copy); link peak "
                  f"{format_number(peak)} GB/s one way.[/]")


def render_mttr(model: Any, extras: dict[str, float],
                spares: Sequence[tuple[float, int, float]], console: Any) -> None:
    """`stampede mttr`: the breakdown, which term dominates, what it costs, spares."""
    table = _table("T_MTTR = T_detect + T_cordon_swap + T_pod_init + S_weights/BW_rank_io + "
                   "T_barrier_sync", ("term", "seconds", "share", "source"), left=("term", "source"))
    dominant = model.dominant
    for term in model.terms:
        name = f"[bold]{term.name}[/]" if term in dominant else term.name
        table.add_row(name, f"{term.seconds:.6g}", f"{term.seconds / model.total_s:.0%}",
                      ("[green]" if term.measured else "[dim]") + term.source + "[/]")
    table.add_row("[bold]T_MTTR[/]", f"[bold]{model.total_s:.6g}[/]", "100%", "")
    console.print(table)
    console.print(f"load term: {model.weights_gb:g} GB / {model.bw_rank_gbps:.4g} GB/s per rank; "
                  f"dominant term{'s (tied)' if len(dominant) > 1 else ''}: "
                  f"[bold]{', '.join(term.name for term in dominant)}[/]")
    if model.metadata_stall_s == model.metadata_stall_s:
        console.print(f"of the measured restore, the slowest rank waited "
                      f"{format_seconds(model.metadata_stall_s)} for its first byte (metadata)")
    lost = extras["gpus"] * (model.total_s + extras["checkpoint_interval_s"] / 2) / 3600
    line = (f"GPU-hours lost per failure at {extras['gpus']:g} GPUs: {lost:.4g}"
            + (f" (incl. half a {extras['checkpoint_interval_s']:g} s checkpoint interval redone)"
               if extras["checkpoint_interval_s"] else ""))
    if extras["mtbf_h"]:
        line += f"; per day at one failure every {extras['mtbf_h']:g} h: {lost * 24 / extras['mtbf_h']:.4g}"
    console.print(line)
    spare_table = _table(f"Hot spares: {extras['nodes']:g} nodes, {extras['node_failures_per_day']:g} "
                         f"failures/node/day, {extras['replenish_h']:g} h to replenish",
                         ("pool", "spares", "P(no warm spare)", "adds to T_cordon_swap"))
    for fraction, count, probability in spares:
        added_s = probability * extras["cold_swap_s"]
        spare_table.add_row(f"{fraction:.0%}", str(count),
                            f"{probability:.3g}" if probability >= 1e-12 else "< 1e-12",
                            format_seconds(added_s) if added_s >= 1e-6 else "< 1 µs")
    console.print(spare_table)


def _describe_checkpoint(catalogue: Any) -> list[str]:
    """Human lines for `stampede plan`: format, files, tensors, bytes, index, savers."""
    from collections import Counter

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
