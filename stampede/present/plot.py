"""`stampede plot`: the pictures a storage engineer wants from an archive and its sidecars.

Three figures, one PNG each (matplotlib, Agg backend, never a display):
- cdf: latency CDF of every op, one panel per op, one line per layout, of one run. Drawn
  from the sidecar's histograms (the edges it holds: histogram.HISTOGRAM_EDGES_S, 1 ns
  wide below 100 ns, then 2%; older sidecars' 2% or 12%, from 100 ns to 10^4 s; all
  measured iterations and ranks pooled): at each bucket edge the curve is the exact
  fraction of samples below it, flat between.
- scaling: aggregate GB/s (restore and read rows) and time to last rank against the rank
  count, one line per layout, over every valid run of the archive (CSV only). Where
  several runs share a rank count the point is the median of their medians, and the error
  bar spans the lowest *_min to the highest *_max of those runs (their iteration spread).
- timeline: one run's herd: per rank a bar from its first op's start to done (restore
  end), marks where its first read and last read ended, one panel per layout, for one
  iteration (default: the one whose time to last rank is nearest the median).

The data of each figure (series, ranges, ticks, colours) is present.figures', which the
HTML report's SVG draws too. The module's top level imports only the stdlib and that: the
CLI imports it on every start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stampede.errors import install_hint
from stampede.ops import TIMELINE_COLOURS
from stampede.present.figures import (
    DONE_S,
    FIRST_BYTE_S,
    FRACTION_TICKS,
    GBPS_SPREAD,
    ITERATION,
    LAST_RANK_SPREAD,
    LAST_READ_S,
    RANK,
    START_S,
    CdfPanel,
    Series,
    cdf_panels,
    colour_map,
    log_seconds_ticks,
    median_iteration,
    phases_present,
    rank_segments,
    rank_ticks,
    scaling_series,
    series_label,
    shared_span_s,
    timeline_rows,
    timeline_span_s,
)
from stampede.results.cells import Row
from stampede.units import format_plain

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from stampede.results.archived import Archive

KINDS = ("cdf", "scaling", "timeline")
INSTALL_HINT = install_hint("plot")
DPI = 110


def require_matplotlib() -> None:
    """matplotlib is an optional extra: say how to get it (exit 2) when it is missing."""
    from stampede.errors import UsageError

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("stampede plot needs matplotlib, which is not installed",
                         hint=INSTALL_HINT) from None


def output_paths(output: str | Path, kinds: Sequence[str]) -> dict[str, Path]:
    """One kind: `output` itself; several: `output` as a stem, `<stem>-<kind>.png` each."""
    output = Path(output)
    if len(kinds) == 1:
        return {kinds[0]: output}
    stem = output.with_suffix("") if output.suffix == ".png" else output
    return {kind: stem.with_name(f"{stem.name}-{kind}.png") for kind in kinds}


def save(figure: Figure, path: Path) -> None:
    """Write one figure; the format follows the extension (.png; .svg and .pdf work too)."""
    from stampede.errors import UsageError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=DPI)
    except OSError as error:
        raise UsageError(f"-o {path}: cannot write it ({error.strerror})") from None
    except ValueError as error:   # an extension matplotlib cannot write
        raise UsageError(f"-o {path}: {error}", hint="use a .png (or .svg, .pdf) name") from None


def build_figures(archive: Archive, kinds: Sequence[str], run_id: str | None = None,
                  iteration: int | None = None) -> tuple[dict[str, Figure], list[str]]:
    """The figures of `kinds` that the data allows, and notes on those it does not."""
    rows = archive.rows
    run_id = select_run(archive, run_id)
    run_rows = [row for row in rows if row["run_id"] == run_id]
    notes: list[str] = []
    figures: dict[str, Figure | None] = {}
    if "scaling" in kinds:
        figures["scaling"] = scaling_figure(rows, notes)
    if "cdf" in kinds or "timeline" in kinds:
        beside = archive.beside([run_id], traces=False)
        notes += beside.notes
        document = beside.sidecars.get(run_id)
        if "cdf" in kinds:
            figures["cdf"] = cdf_figure(run_rows, document, notes) if document else None
        if "timeline" in kinds:
            figures["timeline"] = (timeline_figure(run_rows, document, notes, iteration)
                                   if document else None)
    return ({kind: figure for kind, figure in figures.items() if figure is not None},
            list(dict.fromkeys(notes)))


def select_run(archive: Archive, run_id: str | None) -> str:
    """The run to draw: `run_id`, or the archive's last; a UsageError when there is none."""
    from stampede.errors import UsageError

    runs = archive.runs()
    if not runs:
        raise UsageError(f"{archive.label}: the archive holds no runs")
    if run_id is None:
        return runs[-1]
    if run_id not in runs:
        raise UsageError(f"--run {run_id}: no such run in {archive.label}",
                         hint="runs there: " + ", ".join(runs[-5:]))
    return run_id


def new_figure(nrows: int, ncols: int, width_in: float, height_in: float,
               **options: Any) -> tuple[Figure, Any]:
    """A Figure on the Agg canvas (no pyplot, no display) and its grid of axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(nrows, ncols, squeeze=False, **options)
    return figure, axes


def layout_colours(rows: list[Row]) -> dict[str, str]:
    """A colour per layout, in the archive's order (the job's order): the same layout has the
    same colour in every figure, the HTML report's included."""
    return colour_map([row["layout"] for row in rows])


def describe_run(run_rows: list[Row]) -> str:
    """'job J, run R, N ranks, cache C' for titles."""
    first = run_rows[0]
    ranks = f"{first['nranks']} rank{'s' if first['nranks'] != 1 else ''}"
    return f"job {first['job']}, run {first['run_id']}, {ranks}, cache {first['cache'] or 'n/a'}"


def layout_stats(document: dict[str, Any], run_rows: list[Row], notes: list[str]
                 ) -> dict[str, dict[str, Any]]:
    """Each layout's stats from a sidecar, in the archive's layout order; layouts without
    stats get a note."""
    entries = document.get("layouts", {})
    order = [*dict.fromkeys(row["layout"] for row in run_rows if row["layout"] in entries),
             *sorted(set(entries) - {row["layout"] for row in run_rows})]
    stats = {}
    for layout in order:
        entry = entries[layout]
        if entry.get("stats"):
            stats[layout] = entry["stats"]
        else:
            notes.append(f"run {document.get('run_id')}: layout {layout} has no stats "
                         f"({entry.get('invalid_reason') or 'no samples'}): not drawn")
    return stats


# ---- cdf ------------------------------------------------------------------------------

def cdf_figure(run_rows: list[Row], document: dict[str, Any], notes: list[str]) -> Figure | None:
    """One panel per op, one step line per layout, x log-scaled in seconds and shared by
    the panels (figures.cdf_panels: the SVG's small multiples are the same data)."""
    stats = layout_stats(document, run_rows, notes)
    panels = cdf_panels({layout: s.get("histograms") or {} for layout, s in stats.items()})
    if not panels:
        notes.append(f"run {run_rows[0]['run_id']}: the sidecar holds no latency histograms: "
                     "no cdf figure")
        return None
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    figure, axes = new_figure(nrows, ncols, 5.0 * ncols + 1.8, 3.6 * nrows + 0.6, sharex=True)
    colours = layout_colours(run_rows)
    span_s = shared_span_s(panels)
    for ax, panel in zip(axes.flat, panels):
        draw_cdf_panel(ax, panel, colours, span_s)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    figure_legend(figure, f"layout (cache {run_rows[0]['cache'] or 'n/a'})", list(colours))
    figure.suptitle(f"Latency CDF per op: {describe_run(run_rows)}\n(steps at the edges of "
                    "20-per-decade log buckets; all ranks and measured iterations pooled)")
    return figure


def draw_cdf_panel(ax: Axes, panel: CdfPanel, colours: dict[str, str],
                   span_s: tuple[float, float]) -> None:
    """One op's panel: a step CDF per layout that has samples of it; n in the title."""
    for layout, (xs, ys) in panel.steps.items():
        ax.step(xs, ys, where="post", color=colours.get(layout), label=layout)
    ax.set_xscale("log")
    ticks = log_seconds_ticks(*span_s)
    ax.set_xticks([value for value, _ in ticks], labels=[label for _, label in ticks])
    ax.minorticks_off()
    ax.set_xlim(*span_s)
    ax.tick_params(axis="x", labelbottom=True)   # every panel labelled, as a shared x hides them
    counts = list(panel.samples.values())
    samples = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
    op = panel.op
    ax.set_title(f"{op if op != 'restore' else 'restore (barrier exit to all bytes held)'}: "
                 f"n = {samples} per layout", fontsize="medium")
    ax.set_xlabel("latency (log scale; unit on each tick)")
    ax.set_ylabel("fraction of ops (CDF, 0-1)")
    ax.set_yticks([value for value, _ in FRACTION_TICKS], labels=[label for _, label in FRACTION_TICKS])
    ax.set_ylim(0, 1.02)
    ax.grid(True, which="both", alpha=0.3)


def figure_legend(figure: Figure, title: str, order: Sequence[str] = ()) -> None:
    """One legend for the whole figure, right of the panels: each label once, those in
    `order` first and in that order."""
    entries: dict[str, Any] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    rank = {label: index for index, label in enumerate(order)}
    entries = dict(sorted(entries.items(), key=lambda item: rank.get(item[0], len(rank))))
    if entries:
        figure.legend(list(entries.values()), list(entries), loc="outside right center", title=title,
                      fontsize="small")


# ---- scaling --------------------------------------------------------------------------

DODGE_OCTAVES = 0.025   # series sit this far apart around a rank count, so error bars do not hide


def draw_series(ax: Axes, series: Series, colours: dict[str, str], factor: float = 1.0,
                style: str = "-") -> None:
    """One line with error bars per series (label: its layout), values divided by `factor`
    (a unit), each series nudged sideways by its place in `colours`."""
    for label, points in series.items():
        ranks = list(points)
        nudge = 2 ** (DODGE_OCTAVES * (list(colours).index(label) - (len(colours) - 1) / 2))
        values = [points[n][0] / factor for n in ranks]
        below = [max(points[n][0] - points[n][1], 0.0) / factor for n in ranks]
        above = [max(points[n][2] - points[n][0], 0.0) / factor for n in ranks]
        ax.errorbar([n * nudge for n in ranks], values, yerr=[below, above], fmt=f"o{style}",
                    capsize=3, markersize=5, color=colours.get(label), label=label,
                    markerfacecolor="none" if style == "--" else colours.get(label))


def rank_axis(ax: Axes, ranks: Sequence[int]) -> None:
    """x = rank count, log2-spaced, ticks at the counts measured."""
    ax.set_xscale("log", base=2)
    ticks = rank_ticks(ranks)
    ax.set_xticks([value for value, _ in ticks], labels=[label for _, label in ticks])
    ax.minorticks_off()
    ax.set_xlim(min(ranks) / 1.4, max(ranks) * 1.4)
    ax.set_xlabel("MPI ranks (nranks)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)


def valid_rows(rows: list[Row], notes: list[str]) -> list[Row]:
    """Rows of valid runs; the runs left out get a note."""
    invalid = sorted({row["run_id"] for row in rows if not row["valid"]})
    if invalid:
        notes.append(f"scaling leaves out {len(invalid)} invalid run(s): {', '.join(invalid[:5])}")
    return [row for row in rows if row["run_id"] not in invalid]


def scaling_figure(rows: list[Row], notes: list[str]) -> Figure | None:
    """Aggregate GB/s (restore, read) and time to last rank against ranks, a line per layout."""
    rows = valid_rows(rows, notes)
    mixed = [key for key in ("cache", "job") if len({row[key] for row in rows}) > 1]
    colours = colour_map([series_label(row, mixed) for row in rows])
    done = scaling_series(rows, sorted({row["op"] for row in rows}), *LAST_RANK_SPREAD, mixed)
    if not done:
        notes.append("no valid run with a time to last rank in the archive: no scaling figure")
        return None
    gbps = [scaling_series(rows, (op,), *GBPS_SPREAD, mixed)
            for op in ("restore", "read")]
    ranks = sorted({n for series in (done, *gbps) for points in series.values() for n in points})
    figure, axes = new_figure(1, 2 if any(gbps) else 1, 12 if any(gbps) else 8, 4.8)
    if any(gbps):
        draw_gbps_panel(axes[0, 0], gbps[0], gbps[1], colours)
    completion = "/".join(sorted({row["op"] for row in rows
                                 if math.isfinite(row["time_to_last_rank_s"])}))
    draw_last_rank_panel(axes[0, -1], done, colours, completion)
    for ax in axes.flat:
        rank_axis(ax, ranks)
    figure_legend(figure, "layout" + "".join(f", {key}" for key in mixed), list(colours))
    if len(ranks) == 1:
        notes.append(f"the archive has one rank count ({ranks[0]}): a scaling curve needs runs at "
                     "several (stampede sweep)")
    figure.suptitle(f"Scaling: {describe_archive(rows)}\n(median over runs at a rank count; "
                    "error bars: min-max over their iterations)")
    return figure


def draw_gbps_panel(ax: Axes, restore: Series, read: Series, colours: dict[str, str]) -> None:
    """Aggregate GB/s of the restore (solid, filled) and of the read op (dashed, hollow)."""
    draw_series(ax, restore, colours)
    draw_series(ax, read, colours, style="--")
    ax.set_ylabel("aggregate GB/s (10^9 B/s)")
    ax.set_title("aggregate GB/s: solid, filled = restore; dashed, hollow = read op\n"
                 "(total bytes / (last stop - first start))", fontsize="medium")


def draw_last_rank_panel(ax: Axes, done: Series, colours: dict[str, str], completion: str) -> None:
    """Time to last rank, in the unit that reads best."""
    from stampede.units import seconds_unit

    unit, factor = seconds_unit(max(point[0] for points in done.values() for point in points.values()))
    draw_series(ax, done, colours, factor=factor)
    ax.set_ylabel(f"time to last rank ({unit})")
    ax.set_title(f"time to last rank\n(slowest rank's {completion}, median over iterations)",
                 fontsize="medium")


def describe_archive(rows: list[Row]) -> str:
    """'job J, cache C, K runs' for titles; several values are listed."""
    jobs = ", ".join(sorted({row["job"] for row in rows}))
    caches = ", ".join(sorted({row["cache"] or "n/a" for row in rows}))
    runs = len({row["run_id"] for row in rows})
    return f"job {jobs}, cache {caches}, {runs} run{'s' if runs != 1 else ''}"


# ---- timeline -------------------------------------------------------------------------

def pick_iteration(timeline: Sequence[Sequence[float]], iteration: int | None) -> int:
    """`iteration` if the timeline has it (else a UsageError), or the median one."""
    from stampede.errors import UsageError

    if iteration is None:
        return median_iteration(timeline)
    present = sorted({int(row[ITERATION]) for row in timeline})
    if iteration not in present:
        raise UsageError(f"--iteration {iteration}: the run's measured iterations are "
                         f"{present[0]}..{present[-1]}")
    return iteration


def timeline_figure(run_rows: list[Row], document: dict[str, object], notes: list[str],
                    iteration: int | None = None) -> Figure | None:
    """One panel per layout: each rank's bar from start to done, its time in each phase
    (figures.rank_segments, as the HTML report's timeline), first byte and last read."""
    from stampede.units import seconds_unit

    stats = layout_stats(document, run_rows, notes)
    timelines = {layout: rows for layout, s in stats.items() if (rows := timeline_rows(s))}
    if not timelines:
        notes.append(f"run {run_rows[0]['run_id']}: the sidecar holds no timeline: no timeline figure")
        return None
    chosen = {layout: pick_iteration(rows, iteration) for layout, rows in timelines.items()}
    shown = {layout: [row for row in rows if int(row[ITERATION]) == chosen[layout]]
             for layout, rows in timelines.items()}
    longest_s = max(timeline_span_s(rows) for rows in shown.values())
    unit = seconds_unit(longest_s)
    nranks = int(run_rows[0]["nranks"])
    panel_in = min(max(1.2 + 0.2 * nranks, 2.0), 9.0)
    bar_pt = min(max(0.6 * panel_in * 72 / (nranks + 1), 0.3), 12.0)   # bars fill ~60% of a row
    figure, axes = new_figure(len(shown), 1, 11, panel_in * len(shown) + 1.0, sharex=True)
    colours = layout_colours(run_rows)
    how = "as asked" if iteration is not None else "nearest the median time to last rank"
    for ax, (layout, rows) in zip(axes.flat, shown.items()):
        style = (colours.get(layout, "C0"), stats[layout].get("completion_op") or "restore")
        draw_timeline_panel(ax, rows, unit, bar_pt, style)
        ax.set_title(f"{layout}: measured iteration {chosen[layout]} (0-based, of "
                     f"{stats[layout].get('iterations', '?')}; {how})")
    axes[-1, 0].set_xlim(0, longest_s / unit[1] * 1.03)   # shared by the panels
    axes[-1, 0].set_xlabel(f"time since the rank left the start barrier ({unit[0]})")
    figure.suptitle(f"Per-rank timeline, the herd: {describe_run(run_rows)}")
    return figure


def draw_timeline_panel(ax: Axes, rows: Sequence[Sequence[float]], unit: tuple[str, float],
                        bar_pt: float, style: tuple[str, str]) -> None:
    """Bars (start to done) per rank, its phases over them, marks at first byte and last
    read, a line at the last rank done; times in `unit` (name, seconds per unit); style =
    (colour, completion op)."""
    name, factor = unit
    colour, completion = style
    ranks = [row[RANK] for row in rows]
    start, first, last, done = ([row[column] / factor for row in rows]
                                for column in (START_S, FIRST_BYTE_S, LAST_READ_S, DONE_S))
    ax.hlines(ranks, start, done, colors=colour, linewidth=bar_pt, alpha=0.3,
              label=f"first op start to done ({completion} end)")
    for phase in phases_present(rows):   # a bar per phase, over the rank's start-to-done one
        spans = [(row[RANK], begin / factor, seconds / factor) for row in rows
                 for named, begin, seconds in rank_segments(row) if named == phase]
        ax.barh([rank for rank, _, _ in spans], [width for _, _, width in spans],
                left=[left for _, left, _ in spans], height=0.35,
                color=TIMELINE_COLOURS.get(phase, "0.6"), label=phase, zorder=2)
    for values, marker_colour, label in ((first, "green", "first byte (first read done)"),
                                         (last, "red", "last read done")):
        if any(value == value for value in values):
            ax.scatter(values, ranks, marker="|", s=(bar_pt * 1.6) ** 2, color=marker_colour,
                       zorder=3, label=label)
    finite = [value for value in done if value == value]
    if finite:
        ax.axvline(max(finite), color="k", linestyle="--", linewidth=1,
                   label=f"time to last rank {format_plain(max(finite))} {name}")
    ax.set_ylim(max(ranks) + 0.7, min(ranks) - 0.7)   # rank 0 on top
    if len(ranks) <= 16:
        ax.set_yticks(sorted(set(ranks)))
    ax.set_ylabel("rank")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
