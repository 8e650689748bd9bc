"""`stampede loaders`: each real loader beside stampede's raw restore of the same bytes,
rendered from stampede.results.loaders' lines (formatting only; rich, rank 0)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from stampede.present.tables import new_table
from stampede.results.ceiling import efficiency_text
from stampede.results.loaders import LoaderLine
from stampede.units import format_amplification, format_bytes, format_number, format_seconds

if TYPE_CHECKING:
    from rich.console import Console


def render_loaders(lines: Sequence[LoaderLine], skipped: Sequence[tuple[str, str]],
                   notes: Sequence[str], how: Sequence[tuple[str, str]], console: Console,
                   errors: Sequence[str] = ()) -> None:
    """The table, then what was skipped and why, what to know, how each was called, and
    the errors the loaders met."""
    if lines:
        first = lines[0]
        console.print()
        console.rule(f"[bold]stampede loaders[/]  {first.nranks} rank(s), "
                     f"{format_bytes(first.bytes_total)} per restore")
    raw = any(math.isfinite(line.raw_efficiency) for line in lines)   # run.ceiling measured
    ampl = any(math.isfinite(line.amplification[0]) for line in lines)   # rows that say it
    table = new_table("Real loaders beside the storage ceiling (same bytes, same run)",
                      ("loader", "device", "assign", "cache", "last rank", "GB/s",
                       "efficiency", *(("vs raw",) if raw else ()),
                       *(("read ampl\nnode/rank",) if ampl else ()), "dominant"),
                      left=("loader", "device", "assign", "cache", "dominant"))
    for line in lines:
        name = line.loader if line.valid else f"[red]{line.loader} (INVALID)[/]"
        table.add_row(name, line.device or "cpu", line.policy, line.cache,
                      format_seconds(line.time_to_last_rank_s), format_number(line.gbps),
                      "ceiling" if line.loader.startswith("stampede") else
                      "-" if math.isnan(line.efficiency) else f"{line.efficiency:.0%}",
                      *((efficiency_text(line.raw_efficiency) or "-",) if raw else ()),
                      *((_amplification(line.amplification),) if ampl else ()),
                      line.dominant or "-")
    console.print(table)
    if raw:
        console.print("[dim]vs raw = GB/s per node over the node's raw-read ceiling (run.ceiling: "
                      "its share of the checkpoint read cold by 1, 4, 16 and 32 streams of "
                      "large reads, 3 times each, the best stream count's median, measured "
                      "before the ceiling's restore; every read in the sidecar).[/]")
    from rich.markup import escape

    for loader, reason in skipped:
        console.print(f"[yellow]skipped:[/] {escape(loader)}: {escape(reason)}", highlight=False)
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    console.print("[dim]last rank = barrier exit -> the slowest rank's last tensor in memory "
                  "(median over iterations); GB/s = the ranks' assigned bytes (what the "
                  "ceiling reads) / (last stop - first start), 1e9 B/s; efficiency = loader "
                  "GB/s / the ceiling's; dominant = the phase with the largest median span "
                  "per rank, as a share of the median restore"
                  + ("; read ampl = bytes read over the bytes assigned, the job's, then its "
                     "worst node's / worst rank's" if ampl else "") + ".[/]")
    for loader, calls in how:
        console.print(f"[dim]{escape(loader)}: {escape(calls)}[/]", highlight=False)
    for message in errors:
        console.print(f"[red]error:[/] {escape(message)}", highlight=False)


def _amplification(ratios: tuple[float, float, float]) -> str:
    """'2.0x 2.0x/2.0x': the job's, then its worst node's and rank's."""
    job, node, rank = (format_amplification(ratio) for ratio in ratios)
    return "-" if job == "-" else f"{job} {node}/{rank}"
