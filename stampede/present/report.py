"""The terminal report of runs, rendered from archive rows alone (so `run` and `report`
agree), and the pieces every renderer shares (the console, tables, cells as text).

Renderers only format: every number shown is a cell of the CSV or a value a model
computed. rich is imported here, lazily, and only rank 0 ever calls these modules
(report_plan: `stampede plan`; report_models: compare, mttr, project).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from stampede.present.tables import (
    HISTORY,
    OPS,
    RESTORE,
    SAVE,
    Column,
    Line,
    TableSpec,
    companion,
    new_table,
)
from stampede.results.cells import Row
from stampede.results.columns import OWN_TOOL
from stampede.results.definitions import POINTER, SAVE_POINTER
from stampede.targets import local_files
from stampede.units import (
    format_bytes,
    format_in,
    format_number,
    format_plain,
    format_seconds,
    seconds_unit,
)

if TYPE_CHECKING:
    from rich.console import Console


def seconds(row: Row, column: str) -> str:
    return format_seconds(row[column])


def spread_text(row: Row, low: str, high: str) -> str:
    """'30.7-49.3 ms': a min-max spread in one unit."""
    unit, factor = seconds_unit(row[high])
    return f"{format_in(row[low], factor)}-{format_in(row[high], factor)} {unit}"


def _runs(rows: Iterable[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row["run_id"], []).append(row)
    return grouped


# Output to a file or pipe (CI logs, `| less`) without COLUMNS is not squeezed into 80.
PIPE_WIDTH = 120
NARROW = 100   # below this width the restore table shows its essential columns only


def terminal_width() -> int | None:
    """The width to render at: COLUMNS, else stdout's terminal's, else (under mpiexec or
    srun, whose ranks write to a pipe the launcher copies to the user's terminal) the
    controlling terminal's, else None (a file, a pipe, a batch log)."""
    from stampede.launcher import launcher_size

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(1).columns
    except OSError:
        pass
    if launcher_size() is None:
        return None
    try:
        descriptor = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return os.get_terminal_size(descriptor).columns
    except OSError:
        return None
    finally:
        os.close(descriptor)


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    from rich.console import Console

    if width is None and file is None:
        width = terminal_width() or PIPE_WIDTH
    return Console(file=file, width=width, highlight=False)


def render_archive(rows: Sequence[Row], console: Console, run_ids: Sequence[str] = (),
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


def render_run(rows: Sequence[Row], console: Console, messages: Sequence[str] = ()) -> None:
    """A whole run, as `stampede report` shows it: what ran, the layouts ranked, each
    layout's ops, the warnings (each once), the errors; a loaders run's loaders beside."""
    own = [row for row in rows if row.get("tool", OWN_TOOL) == OWN_TOOL]
    if own and len(own) < len(rows):   # `stampede loaders`: stampede's ceiling, then them
        from stampede.present.report_loaders import render_loaders
        from stampede.results.loaders import loader_lines

        render_run(own, console, messages)
        render_loaders(loader_lines(rows), (), (), (), console)
        return
    first = rows[0]
    if first["job"] == "gpu" and first.get("device"):
        render_gpu(rows, console)   # `stampede gpu` runs: one line per mode and size
        return
    if first["layout"] == "startup":
        render_header(first, console)
        _render_startup(rows, console)
        return
    render_header(first, console)
    for phase, layout in dict.fromkeys((row.get("phase", ""), row["layout"]) for row in rows):
        render_layout([row for row in rows if row["layout"] == layout
                       and row.get("phase", "") == phase], console)
    render_summary(rows, console, messages)


class RunReport:
    """A run's report as it is recorded (run, save, cycle, rejoin: a results.recorder
    Recorder's `show`): the header once, each layout as it completes, from its rows and
    the sidecar beside them; the layouts ranked at the end."""

    def __init__(self, console: Console | None = None) -> None:
        self.console, self.begun = console, False

    def show(self, rows: Sequence[Row], sidecar: Mapping[str, Any]) -> None:
        first = rows[0]
        console = self.console = self.console or make_console()
        if not self.begun:
            self.begun = True
            render_header(first, console)
            render_rpcs((sidecar.get("storage") or {}).get("rpcs_per_op"), console)
        render_layout(rows, console)
        part = "layouts" if first.get("phase") == "restore" else "saves"
        entry = (sidecar.get(part) or {}).get(first["layout"], {})
        counted = entry.get("kernel_nfs_rpcs")
        render_kernel_nfs(first["layout"], counted if isinstance(counted, dict) else None,
                          console)
        render_file_system(first["layout"], entry, console)
        render_mds(rows, entry.get("mds_requests"), console)

    def finish(self, rows: Sequence[Row], messages: Sequence[str], archived: str) -> None:
        if not self.begun:   # nothing measured
            return
        assert self.console is not None   # show made it
        render_summary(rows, self.console, messages)
        self.console.print(archived, markup=False)


def render_header(first: Row, console: Console) -> None:
    """The run's title and what it ran (from its first row: every row carries it)."""
    console.print()
    console.rule(f"[bold]stampede[/] {first['job']}  run {first['run_id']}")
    if first["layout"] == "startup":
        return
    if first.get("phase") == "save":
        console.print(
            f"{first['nranks']} ranks on {first['nnodes']} node(s) ({first['ranks_per_node']}/"
            f"node), backend {first['backend']} ({first.get('fs_type') or '?'}) at "
            f"{first.get('target', '')}\nsave [bold]{first.get('save_mode', '')}[/], durability "
            f"[bold]{first.get('durability', '')}[/], validate {first.get('validate', '')}, keep "
            f"{first.get('keep', '')}, "
            + (f"parts of {format_bytes(first['part_size'])}, " if first.get("part_size")
               else "")
            + (f"mkdir by {first.get('mkdir_by', '')}, cache {first['cache']}, "
               if local_files(first.get("target", "")) else "")
            + f"{format_bytes(first['bytes_per_rank'])} per shard, block "
            f"{format_bytes(first['block_bytes'])}, "
            f"{first['iterations']} saves + {first.get('warmup', '?')} warmup, "
            f"{first['timestamp']}")
        return
    console.print(
        f"{first['nranks']} ranks on {first['nnodes']} node(s) ({first['ranks_per_node']}/node), "
        f"backend {first['backend']} ({first.get('fs_type') or '?'}) at {first.get('target', '')}\n"
        f"cache [bold]{first['cache']}[/], {format_bytes(first['bytes_per_rank'])} per rank, "
        f"block {format_bytes(first['block_bytes'])}, pattern {first.get('pattern', '')}, "
        f"{first['iterations']} iterations + {first.get('warmup', '?')} warmup, "
        f"verify {first.get('verify', 'none')}, {first['timestamp']}"
        + (f"\nh2d {first['h2d']} to [bold]{first.get('device', '')}[/]"
           if first.get("h2d", "none") not in ("none", "") else ""))


def render_rpcs(probed: Any, console: Console) -> None:
    """An NFS target's RPCs per op (the backend's probe, in the sidecar's storage), one
    line per op: how many calls, and which."""
    if not probed:
        return
    ops = probed.get("ops") or {}
    console.print(f"NFS RPCs per op ({probed.get('how', '')}):" if ops else
                  f"NFS RPCs per op: {probed.get('how', '')}", markup=False)
    for op, runs in ops.items():
        total = sum(count for count, _ in runs)
        calls = ", ".join(name if count == 1 else f"{count} x {name}" for count, name in runs)
        console.print(f"  {op:<7} {total}: {calls or '-'}", markup=False)


def render_kernel_nfs(layout: str, counted: Any, console: Console) -> None:
    """A kernel NFS mount's RPCs during a layout (stampede.run.file_system), busiest first:
    calls, and the average round trip and execution time of each."""
    ops = (counted or {}).get("ops") or {}
    if not counted:
        return
    parts = [f"{name} {moved['ops']} (rtt {moved['rtt_ms'] / moved['ops']:.2f} ms, exe "
             f"{moved['execute_ms'] / moved['ops']:.2f} ms)"
             for name, moved in sorted(ops.items(), key=lambda item: -item[1]["ops"])
             if moved["ops"] > 0]
    retried = sum(moved["transmissions"] - moved["ops"] for moved in ops.values())
    timeouts = sum(moved["timeouts"] for moved in ops.values())
    console.print(f"{layout}: kernel NFS RPCs on {counted['mount']} ({counted['scope']}): "
                  + (", ".join(parts) or "none") + f"; retransmissions {retried}, major "
                  f"timeouts {timeouts}", markup=False)


def render_file_system(layout: str, entry: Mapping[str, object], console: Console) -> None:
    """What the file system's client said around a layout (stampede.run.file_system),
    beside the kernel NFS RPCs: a Lustre client's llite counters, busiest first (bytes
    where they count bytes), and the layout a few of its files got."""
    llite = entry.get("lustre_llite")
    if isinstance(llite, dict):
        ops = llite.get("ops") or {}
        parts = [f"{name} {moved['count']}" + (f" ({format_bytes(moved['sum'])})"
                                               if "sum" in moved else "")
                 for name, moved in sorted(ops.items(), key=lambda item: -item[1]["count"])]
        console.print(f"{layout}: Lustre llite on {llite.get('mount')} ({llite.get('scope')}): "
                      + (", ".join(parts) or "none"), markup=False)
    layouts = entry.get("file_layouts")
    if isinstance(layouts, str):
        console.print(f"{layout}: file layouts {layouts}", markup=False)
    elif isinstance(layouts, dict):
        for path, got in (layouts.get("files") or {}).items():
            said = got if isinstance(got, str) else " ".join(
                f"{key}={value}" for key, value in got.items()
                if key != "path" and not isinstance(value, list | dict)) + (
                f" osts={','.join(map(str, got['osts']))}" if "osts" in got else "")
            console.print(f"{layout}: {path}: {said} ({layouts.get('how')})", markup=False)


def render_mds(rows: Sequence[Row], counted: object, console: Console) -> None:
    """A CephFS MDS's own requests during a layout (stampede.run.mds_counts), busiest
    first with their mean latency, its capability messages, and beside them stampede's
    own count of each metadata op (its measured iterations; the MDS's include the warmup);
    or why the layout was not counted (a CephFS mount whose MDS could not be asked)."""
    layout = rows[0]["layout"]
    if isinstance(counted, str):
        console.print(f"{layout}: MDS requests {counted}", markup=False)
    if not isinstance(counted, dict):
        return
    ops = counted.get("ops")
    parts = [f"{name} {moved['requests']} ({format_plain(moved['mean_ms'])} ms)"
             for name, moved in (ops.items() if isinstance(ops, dict) else ())]
    own = ", ".join(f"{row['op']} {row['count']}" for row in rows
                    if row.get("op") not in ("restore", "save") and row.get("count"))
    console.print(f"{layout}: MDS requests (its own counters, every client, warmup included): "
                  + (", ".join(parts) or "none")
                  + f"; caps revoked {counted.get('caps_revoked', 0)}, granted "
                  f"{counted.get('caps_granted', 0)}; stampede's ops: {own or '-'}", markup=False)


def render_summary(rows: Sequence[Row], console: Console, messages: Sequence[str] = ()) -> None:
    """The layouts ranked by time to last rank (saves, restores, both side by side), the
    warnings once, the errors."""
    _render_saves(rows, console)
    _render_restores(rows, console)
    _render_cycle(rows, console)
    render_warnings(rows, console)
    for message in messages:
        console.print(f"[red]error:[/] {message}", markup=True)
    saves = any(row.get("phase") == "save" for row in rows)
    console.print(f"[dim]{SAVE_POINTER if saves else POINTER}[/]")


def render_table(spec: TableSpec, rows: Sequence[Row], console: Console) -> list[Line]:
    """A table of present.tables (its wide columns on a wide terminal only); returns its
    lines (none: nothing drawn, e.g. rows imported from IOR or mdtest have no restore)."""
    lines = spec.lines(rows)
    if lines:
        _draw(spec, rows, lines, console)
    return lines


def _draw(spec: TableSpec, rows: Sequence[Row], lines: Sequence[Line], console: Console) -> None:
    columns = spec.shown(console.width >= NARROW)
    table = new_table(spec.title_of(rows), [column.header for column in columns],
                      left=[column.header for column in columns if column.left],
                      whole=[column.header for column in columns if column.whole])
    for line in lines:
        table.add_row(*(_cell(column, line) for column in columns))
    console.print(table)


def _cell(column: Column, line: Line) -> str:
    text = _escaped(column.cell(line))
    return f"[red]{text}[/]" if column.alarm and column.alarm(line) else text


def _render_restores(rows: Sequence[Row], console: Console) -> None:
    lines = render_table(RESTORE, rows, console)
    _render_slowest(lines, "restore", console)
    for note in RESTORE.notes(lines):
        console.print(f"[dim]{_escaped(note)}[/]")


def _render_slowest(lines: Sequence[Line], what: str, console: Console) -> None:
    """Per layout, its slowest ranks by their median time (from the slowest_ranks cell)."""
    for line in lines:
        slowest = ", ".join(f"rank {item.rsplit(':', 1)[0]} "
                            f"{format_seconds(float(item.rsplit(':', 1)[1]))}"
                            for item in line.row["slowest_ranks"].split())
        console.print(f"  {line.row['layout']}: slowest ranks (median {what}): {slowest or '-'}",
                      markup=False)


def _render_saves(rows: Sequence[Row], console: Console) -> None:
    lines = render_table(SAVE, rows, console)
    if not lines:
        return
    _render_slowest(lines, "save", console)
    for note in SAVE.notes(lines):
        console.print(f"[dim]{_escaped(note)}[/]")


def _render_cycle(rows: Sequence[Row], console: Console) -> None:
    """A cycle's two halves side by side, layout by layout."""
    saves = {row["layout"]: row for row in rows if row["op"] == "save"}
    restores = {row["layout"]: row for row in rows if row["op"] == "restore"}
    both = [layout for layout in saves if layout in restores]
    if not both:
        return
    table = new_table("Save and restore, side by side (median time to last rank)",
                      ("layout", "save\n(durable)", "published", "restore", "save\nGB/s",
                       "restore\nGB/s", "valid"), left=("layout",))
    for layout in both:
        save, restore = saves[layout], restores[layout]
        published = companion(rows, save, "published")
        table.add_row(layout, seconds(save, "time_to_last_rank_s"),
                      seconds(published, "elapsed_s") if published else "-",
                      seconds(restore, "time_to_last_rank_s"),
                      format_number(save["agg_gbps"]),
                      format_number(restore["agg_gbps"]),
                      "yes" if save["valid"] and restore["valid"] else "[red]NO[/]")
    console.print(table)


def grouped_warnings(rows: Sequence[Row], column: str = "warnings"
                     ) -> tuple[list[str], dict[str, list[str]]]:
    """Each warning (or note) once: (those every layout has, in order; per layout what
    differs)."""
    by_layout: dict[str, list[str]] = {}
    for row in rows:
        name = row["layout"] + (" save" if row.get("phase") == "save" else "")
        if name not in by_layout:
            by_layout[name] = [text for text in row.get(column, "").split(" | ")
                                        if text]
    if not by_layout:
        return [], {}
    common = set.intersection(*(set(texts) for texts in by_layout.values()))
    if len(by_layout) == 1:
        common = set()
    return ([text for text in next(iter(by_layout.values())) if text in common],
            {layout: [text for text in texts if text not in common]
             for layout, texts in by_layout.items()})


def render_warnings(rows: Sequence[Row], console: Console) -> None:
    """Each note, then each warning, once: those every layout has for the run, then per
    layout only what differs."""
    for column, word, colour in (("notes", "note", "cyan"), ("warnings", "warning", "yellow")):
        common, by_layout = grouped_warnings(rows, column)
        for text in common:
            console.print(f"[{colour}]{word}:[/] {_escaped(text)}")
        for layouts, text in by_kind(by_layout):
            console.print(f"[{colour}]{layouts}: {word}:[/] {_escaped(text)}")


def by_kind(by_layout: dict[str, list[str]]) -> list[tuple[str, str]]:
    """grouped_warnings' per-layout warnings, the same warning of several layouts once:
    (the layouts it applies to, its text; with different figures, the first layout's and
    whose they are), in order. The terminal and the HTML page say them alike."""
    kinds: dict[str, list[tuple[str, str]]] = {}   # a kind: (layout, its text), in order
    for layout, texts in by_layout.items():
        for text in texts:
            kinds.setdefault(warning_kind(text), []).append((layout, text))
    said = []
    for found in kinds.values():
        figures = f" (figures: {found[0][0]}'s; each layout's in its table)" \
            if len({text for _, text in found}) > 1 else ""
        said.append((", ".join(layout for layout, _ in found), found[0][1] + figures))
    return said


def warning_kind(text: str) -> str:
    """What a warning says, without its figures: the same warning of several layouts
    (time to last rank varies 111% / 160%) is one line."""
    import re

    return re.sub(r"[\d.,%-]+", "#", re.sub(r"\([^)]*\)", "", text))


def _escaped(text: str) -> str:
    from rich.markup import escape

    return str(escape(text))


def _render_startup(rows: Sequence[Row], console: Console) -> None:
    """`stampede startup`: T_pod_init per rank, the same latency table as any op."""
    startup = next(row for row in rows if row["op"] == "startup")
    console.print(f"{startup['nranks']} ranks on {startup['nnodes']} node(s) "
                  f"({startup['ranks_per_node']}/node), {startup['timestamp']}")
    slowest = ", ".join(f"rank {item.rsplit(':', 1)[0]} {format_seconds(float(item.rsplit(':', 1)[1]))}"
                        for item in startup["slowest_ranks"].split())
    console.print(f"Start-up (T_pod_init): last rank ready after [bold]"
                  f"{seconds(startup, 'time_to_last_rank_s')}[/], first after "
                  f"{seconds(startup, 'first_done_s')}, straggler "
                  f"{startup['straggler_ratio']:.2f}; slowest ranks: {slowest or '-'}")
    render_layout(rows, console)
    render_warnings(rows, console)
    console.print("[dim]interpreter = launch -> stampede's first line; import = stampede's run "
                  "modules and --import; mpi_init = MPI_Init; startup = launch -> MPI ready. "
                  "Wall clock (time.time_ns) across processes.[/]")


def render_layout(rows: Sequence[Row], console: Console) -> None:
    """One layout: the latency of every op, all ranks and iterations, and each op's
    throttling, retries and backoff where it met any; INVALID and why."""
    for note in OPS.notes(render_table(OPS, rows, console)):
        console.print(f"[yellow]{_escaped(note)}[/]")
    first = rows[0]
    if first.get("invalid_reason"):
        console.print(f"[red]{first['layout']}: INVALID:[/] {_escaped(first['invalid_reason'])}")


def render_history(rows: Sequence[Row], console: Console) -> None:
    """Every run's completion rows, one line each (drawn with its headers even when no
    row has one)."""
    _draw(HISTORY, rows, HISTORY.lines(rows), console)


def render_gpu(rows: Sequence[Row], console: Console) -> None:
    """`stampede gpu`: one line per (mode, size), the device named on every report."""
    first = rows[0]
    console.print()
    console.rule(f"[bold]stampede gpu[/]  run {first['run_id']}")
    console.print(f"{first['nranks']} ranks on {first['nnodes']} node(s), device "
                  f"[bold]{first['device']}[/], {first['iterations']} trials per size")
    table = new_table("Host -> device, per rank (all ranks at once)",
                   ("mode", "size", "h2d p50", "h2d agg\nGB/s", "restore\nlast rank",
                    "slowest-rank\nGB/s", "of link\npeak", "cache"), left=("mode", "cache"))
    peak = first["link_peak_gbps"]
    for restore in (row for row in rows if row["op"] == "restore"):
        h2d = next((row for row in rows if row["op"] == "h2d" and row["layout"] == restore["layout"]
                    and row["block_bytes"] == restore["block_bytes"]), Row())
        slowest = restore["slowest_rank_gbps"]
        table.add_row(restore["layout"], format_bytes(restore["block_bytes"]),
                      seconds(h2d, "lat_p50_s") if h2d else "-",
                      format_number(h2d["agg_gbps"]) if h2d else "-",
                      seconds(restore, "time_to_last_rank_s"), format_number(slowest),
                      "-" if peak != peak else f"{slowest / peak:.0%}", restore["cache"])
    console.print(table)
    # a mode may reach the device another way (gds: through cuFile, or NOT GDS): said per mode
    for layout, device in dict.fromkeys((row["layout"], row.get("device", "")) for row in rows):
        if device != first.get("device", ""):
            console.print(f"{layout}: device [bold]{device}[/]")
    for warning in dict.fromkeys(text for row in rows
                                 for text in row.get("warnings", "").split(" | ") if text):
        console.print(f"[yellow]warning:[/] {warning}")
    console.print(f"[dim]GB/s = 1e9 B/s; h2d = the copy alone (CUDA events on a GPU); restore = "
                  f"barrier -> bytes in device memory (file modes: read + copy; gds: the reads "
                  f"alone, file -> HBM); link peak {format_number(peak)} GB/s one way.[/]")


