"""`stampede html`: one self-contained HTML file from an archive and its sidecars, for
reading: the verdict first (model.assessment's, computed by the command and handed in),
then one screen of summary (each layout's time to last rank with its spread, the op its
ranks spent most time in, the warnings) and the restore and save tables; then the parts a
reader opens (<details>, no script; print opens them): the latency CDFs as small
multiples, the scaling curves, the timelines, a traced run's figures (present.html_figures
and html_trace: inline SVG of present.figures' data), the machine, storage and MPI context
of the sidecar, and the definitions (results.definitions). Nothing is fetched: a
Content-Security-Policy of default-src 'none' lets only the inline style and inline images
in. Rendering only: every number is a cell of the CSV, a sidecar value or a model's result.
The stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from stampede.present import figures, html_figures
from stampede.present.html_tags import table, tag
from stampede.present.html_trace import trace_figures
from stampede.present.html_verdict import verdict_section
from stampede.present.report import by_kind, grouped_warnings
from stampede.present.tables import (
    RESTORE,
    SAVE,
    TableSpec,
    ceiling_efficiency,
    last_rank,
    read_amplification,
)
from stampede.results.cells import Row, cell
from stampede.results.compare import ranked
from stampede.results.definitions import METRICS, SAVE_METRICS
from stampede.units import format_bytes, format_number, format_seconds

if TYPE_CHECKING:
    from stampede.model.assessment import Assessment
    from stampede.results.trace import Trace

MAX_OP_ROWS = 200
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
# One screen first (the verdict, a summary, the tables), the rest in <details> a reader
# opens: no script, and print opens every one (::details-content, and display:block where
# a browser has no such pseudo-element).
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 12px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.2em}
.verdict{background:#eef6ee;border:1px solid #7a7;padding:8px 14px;border-radius:6px}
.scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:.9em}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom;min-width:4em}
td:first-child,th:first-child{text-align:left}
svg.figure{width:100%;height:auto;max-width:760px;display:block;margin:6px 0 14px}
.facts td{text-align:left;white-space:normal;overflow-wrap:anywhere}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:4px 14px}
.grid svg.figure{margin:0}
.legend span{margin-right:14px;white-space:nowrap}
.legend i{display:inline-block;width:10px;height:10px;margin-right:5px}
.note{color:#555;font-size:.9em}pre{white-space:pre-wrap;font-size:.85em}
.trust{border-left:4px solid #d62728;padding-left:.6em}
details{margin:4px 0}summary{cursor:pointer}
details.part{border-top:1px solid #ccc;margin-top:.6em}details.part>summary{padding:6px 0}
details.part>summary h2{display:inline;border:0;font-size:1.1em}
@media (max-width:600px){body{font-size:14px}td,th{padding:2px 4px}.fit td{white-space:normal}}
@media print{details::details-content{content-visibility:visible;display:block}
 details>*{display:block}.scroll{overflow:visible}
 h2,h3{break-after:avoid}svg.figure{break-inside:avoid}body{max-width:none}}
"""


def restore_table(rows: Sequence[Row]) -> str:
    return spec_table(RESTORE, rows)


def save_table(rows: Sequence[Row]) -> str:
    """The save's own table (published, blocked, unprotected, validate errors, "buf" for a
    save never made durable); the HTML report once showed the restore's columns for it, a
    storage part longer than the time to last rank among them."""
    return spec_table(SAVE, rows)


def spec_table(spec: TableSpec, rows: Sequence[Row]) -> str:
    """A table of present.tables, every column (the page scrolls sideways), the notes
    under it; "" where the run has no such phase."""
    lines = spec.lines(rows)
    if not lines:
        return ""
    first = lines[0].row
    return (tag("h2", spec.title, id=spec.anchor)
            + tag("p", f"run {escape(first['run_id'])}: {first['nranks']} ranks on "
                       f"{first['nnodes']} node(s), {format_bytes(first['bytes_per_rank'])}"
                       " per rank", class_="note")
            + table([column.one_line for column in spec.columns],
                    [[column.cell(line) for column in spec.columns] for line in lines])
            + "".join(tag("p", escape(note), class_="note") for note in spec.notes(lines)))


def ops_table(rows: Sequence[Row]) -> str:
    """Every op row of the archive's runs (imported IOR and mdtest rows have no completion
    op), the latest MAX_OP_ROWS."""
    body = [[row["job"], row["layout"], row["op"], cell(row["nranks"]), cell(row["count"]),
             format_number(row["agg_gbps"]), format_number(row["ops_per_s"]),
             format_seconds(row["lat_p50_s"]), format_seconds(row["lat_p99_s"])]
            for row in rows[-MAX_OP_ROWS:]]
    return (tag("h2", "Ops", id="ops")
            + table(("job", "layout", "op", "ranks", "count", "agg GB/s", "ops/s", "p50", "p99"),
                    body))


def part(anchor: str, title: str, content: str) -> str:
    """A part of the report a reader opens on demand (print opens it)."""
    return tag("details", tag("summary", tag("h2", escape(title))) + content, class_="part",
               id=anchor)


def figures_sections(archive_rows: list[Row], sidecars: dict[str, dict[str, Any]],
                     assessment: Assessment, traces: dict[str, Trace] | None = None) -> str:
    """Each a part to open: per phase, from the sidecar of the run its verdict ranks
    (`sidecars` by run id: a cycle's restore and save are runs of their own), its ops'
    latency CDFs as small multiples; the scaling curves; each layout's timeline of its
    slowest iteration; then, of a run with a trace (`traces` by run id), its throughput
    and ranks inside an op over time."""
    palette = figures.colour_map([row["layout"] for row in archive_rows])
    cdfs, timelines = [], []
    for phase, verdict in assessment.phases.items():
        sidecar = sidecars.get(verdict.run_id) or {}
        stats = phase_stats(phase, sidecar)
        grid = html_figures.cdf_grid(phase, figures.cdf_panels(
            {layout: s.get("histograms") or {} for layout, s in stats.items()}, phase), palette)
        if grid:
            cdfs.append(tag("h3", f"The {phase}'s ops") + grid)
        for layout, layout_stats in stats.items():
            drawn = html_figures.timeline_figure(layout_stats, sidecar.get("hosts_by_rank") or [])
            if drawn:
                timelines.append(tag("h3", f"Timeline: {phase} {layout}, slowest iteration "
                                           f"({drawn[1]}, 0-based)") + drawn[0])
    none = tag("p", "no sidecar with statistics for the runs ranked: no CDF or timeline",
               class_="note")
    parts = [part("figures", "Latency CDFs, an op per panel", (
        tag("p", "fraction of an op's samples (all ranks, measured iterations) below each "
                 "latency; one time axis for a phase's panels", class_="note")
        + "".join(cdfs)) if cdfs else none)]
    scaling = []
    valid = [row for row in archive_rows if row["valid"]]
    for phase in ("restore", "save"):
        ranked_phase = assessment.phases.get(phase)
        fits = [(series, projection) for series, projection, _ in ranked_phase.projections] \
            if ranked_phase else []
        drawn_scaling = html_figures.scaling_figure(valid, phase, fits, assessment.target_ranks, palette)
        if drawn_scaling:
            scaling.append(tag("h3", f"Scaling of the {phase}") + drawn_scaling)
    parts.append(part("scaling", "Scaling curves", "".join(scaling) + tag(
        "p", "dots: measured median, bar: min–max over iterations; line: the fitted model; "
             "dashed to the square: its projection, the thick bar its band", class_="note")
        if scaling else tag("p", "runs at one rank count only: no scaling curve (stampede "
                                 "sweep runs several)", class_="note")))
    parts.append(part("timelines", "Timelines: each rank's slowest iteration",
                      tag("p", "each rank's time in each phase, end to end from its first "
                               "op; the black tick: done", class_="note") + "".join(timelines)
                      if timelines else none))
    for run_id, trace in (traces or {}).items():
        drawn_trace = trace_figures(trace, palette)
        if drawn_trace:
            parts.append(part(f"trace-{escape(run_id)}", f"Trace of run {run_id}", "".join(
                drawn_trace) + tag("p", "from the run's --trace; `stampede analyze` reads it",
                                   class_="note")))
    return "".join(parts)


def phase_stats(phase: str, sidecar: dict[str, Any]) -> dict[str, Any]:
    """{layout: its statistics} of one phase's sidecar (a save's layouts under "saves")."""
    entries = sidecar.get("saves" if phase == "save" else "layouts") or {}
    return {name: entry["stats"] for name, entry in entries.items() if entry.get("stats")}


def summary_section(rows: Sequence[Row], sidecars: dict[str, dict[str, Any]],
                    assessment: Assessment) -> str:
    """One screen: per phase and layout of the runs ranked, the time to last rank with its
    spread over iterations, its standing, the bytes it read over those it needed (read
    amplification, a restore's), and the op its ranks spent most time in."""
    body: list[list[str]] = []
    for phase, verdict in assessment.phases.items():
        stats = phase_stats(phase, sidecars.get(verdict.run_id) or {})
        panels = figures.cdf_panels({layout: s.get("histograms") or {}
                                     for layout, s in stats.items()}, phase)
        for row, standing in ranked(run_rows_of(rows, verdict.run_id), phase):
            dominant = figures.dominant_op(panels, row["layout"])
            # '1.51 (1.25–1.77) ms': a narrow screen wraps the cell before its spread, never
            # inside a number
            spread = last_rank(row).replace("-", "–\u2060").replace(" ", "\u00a0") \
                .replace("\u00a0(", " (")
            body.append([phase, row["layout"], spread, standing, read_amplification(row),
                         f"{dominant[0]} ({dominant[1]:.0%})" if dominant else "-",
                         ceiling_efficiency(row)])
    if not body:
        return ""
    headers = ["phase", "layout", "last rank (min–max)", "vs best", "read amplification",
               "most rank time in (share)", "of the raw-read ceiling"]
    if not any(line[-1] for line in body):   # run.ceiling measured nothing: no column
        headers.pop()
        body = [line[:-1] for line in body]
    return (tag("h2", "Summary", id="summary")
            + tag("div", table(headers, body), class_="fit"))


def warnings_section(run_rows: Sequence[Row]) -> str:
    common, by_layout = grouped_warnings(run_rows)
    items = [tag("li", escape(text)) for text in common]
    items += [tag("li", f"<b>{escape(layouts)}</b>: {escape(text)}")
              for layouts, text in by_kind(by_layout)]
    return tag("h2", "Warnings", id="warnings") + (tag("ul", "".join(items)) if items else
                                                    tag("p", "none", class_="note"))


def context_section(first: Row, sidecar: dict[str, Any] | None) -> str:
    """Machine, storage and MPI: the sidecar's facts (the CSV's where there is none), a
    row per fact (node: cpu_count, not the node's whole record on one line)."""
    facts = {key: cell(first[key]) for key in ("job", "backend", "fs_type", "target", "cache",
                                                  "nranks", "nnodes", "stampede_version", "schema")}
    if sidecar:   # each fact once (the sidecar's where both have it); the statistics are figures
        for key, value in sidecar.items():
            if key not in ("layouts", "saves", "job", "hosts_by_rank"):
                facts |= flat_facts(key, value)
        facts["hosts"] = ", ".join(dict.fromkeys(sidecar.get("hosts_by_rank") or []))
    rows = [(key, value) for key, value in facts.items() if value not in ("", "{}", "[]", "None")]
    return part("context", "Machine, storage and MPI",
                tag("div", table(("fact", "value"), rows), class_="facts"))


def flat_facts(key: str, value: object) -> dict[str, str]:
    """A sidecar value as facts: a record's fields each its own, named key: field."""
    if isinstance(value, dict):
        return {name: text for field, inner in value.items()
                for name, text in flat_facts(f"{key}: {field}", inner).items()}
    return {key: str(value)}


def definitions_section() -> str:
    """Each term of the measurement definitions behind a <details> (the save's marked)."""
    entries: list[tuple[str, list[str]]] = []
    for prefix, text in (("", METRICS), ("save: ", SAVE_METRICS)):
        for line in text.splitlines():
            if line.startswith("  ") and not line.startswith("   "):
                term, _, rest = line.strip().partition("  ")
                entries.append((prefix + term, [rest.strip()]))
            elif entries and line.startswith("   "):
                entries[-1][1].append(line.strip())
    return part("definitions", "Definitions", "".join(
        tag("details", tag("summary", escape(term)) + tag("p", escape(" ".join(text))))
        for term, text in entries))


def render_html(archive: str, rows: list[Row], sidecars: dict[str, dict[str, Any]],
                assessment: Assessment, notes: Sequence[str] = (),
                traces: dict[str, Trace] | None = None) -> str:
    """The whole report, as one string; `sidecars` by run id (the latest run's and those
    of the runs the verdict ranks, where readable)."""
    run_id = rows[-1]["run_id"]
    sidecar = sidecars.get(run_id)
    run_rows = [row for row in rows if row["run_id"] == run_id]
    shown = {run_id, *(verdict.run_id for verdict in assessment.phases.values())}
    shown_rows = [row for row in rows if row["run_id"] in shown]
    tables = "".join(save_table(run_rows_of(rows, verdict.run_id)) if phase == "save" else
                     restore_table(run_rows_of(rows, verdict.run_id))
                     for phase, verdict in assessment.phases.items())
    if not tables and assessment.rejoin is not None:   # a rejoin run: its own tables
        rejoin_rows = run_rows_of(rows, assessment.rejoin.run.run_id)
        tables = save_table(rejoin_rows) + restore_table(rejoin_rows)
    if not tables:
        tables = ops_table(rows)
    note = tag("ul", "".join(tag("li", escape(n)) for n in notes), class_="note") if notes else ""
    body = (tag("h1", f"stampede report: {escape(rows[-1].get('job') or archive)}")
            + tag("p", f"{escape(archive)}: {len({r['run_id'] for r in rows})} run(s); "
                       f"target {assessment.target_ranks} ranks", class_="note")
            + verdict_section(assessment) + note
            + summary_section(rows, sidecars, assessment) + warnings_section(shown_rows)
            + tables + figures_sections(rows, sidecars, assessment, traces)
            + context_section(run_rows[0], sidecar) + definitions_section())
    head = (f'<meta charset="utf-8"><meta name="viewport" content="width=device-width, '
            f'initial-scale=1"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>stampede: {escape(archive)}</title><style>{STYLE}</style>")
    return f"<!DOCTYPE html><html lang=\"en\"><head>{head}</head><body>{body}</body></html>\n"


def run_rows_of(rows: Sequence[Row], run_id: str) -> list[Row]:
    return [row for row in rows if row["run_id"] == run_id]
