"""`stampede html`: one self-contained HTML file from an archive and its sidecars: the
verdict first (model.assessment's, computed by the command and handed in), then the
restore and save tables, the figures (present.html_figures: inline SVG), the warnings, the
machine, storage and MPI context of the sidecar, and the definitions (results.definitions)
one click away. Nothing is fetched: a Content-Security-Policy of default-src 'none' lets
only the inline style and inline images in. Rendering only: every number is a cell of
the CSV, a sidecar value or a model's result. The stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from stampede.present import html_figures as figures
from stampede.present.html_tags import table, tag
from stampede.present.html_trace import trace_figures
from stampede.present.html_verdict import verdict_section
from stampede.present.report import grouped_warnings
from stampede.present.tables import RESTORE, SAVE, TableSpec
from stampede.results.cells import flag, number
from stampede.results.definitions import METRICS, SAVE_METRICS
from stampede.units import format_bytes, format_number, format_seconds

MAX_OP_ROWS = 200
Row = dict[str, str]
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:980px;padding:0 12px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.6em}
.verdict{background:#eef6ee;border:1px solid #7a7;padding:8px 14px;border-radius:6px}
.scroll{overflow-x:auto}table{border-collapse:collapse;font-size:.9em}
td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
svg.figure{width:100%;height:auto;max-width:760px;display:block;margin:6px 0 14px}
.note{color:#555;font-size:.9em}pre{white-space:pre-wrap;font-size:.85em}
details{margin:4px 0}summary{cursor:pointer}
@media (max-width:600px){body{font-size:14px}td,th{padding:2px 4px}}
@media print{details{display:block}details>*{display:block}.scroll{overflow:visible}
 h2{break-after:avoid}svg.figure{break-inside:avoid}body{max-width:none}}
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
                       f"{first['nnodes']} node(s), {format_bytes(number(first, 'bytes_per_rank'))}"
                       " per rank", class_="note")
            + table([column.one_line for column in spec.columns],
                    [[column.cell(line) for column in spec.columns] for line in lines])
            + "".join(tag("p", escape(note), class_="note") for note in spec.notes(lines)))


def ops_table(rows: Sequence[Row]) -> str:
    """Every op row of the archive's runs (imported IOR and mdtest rows have no completion
    op), the latest MAX_OP_ROWS."""
    body = [[row["job"], row["layout"], row["op"], row["nranks"], row.get("count", ""),
             format_number(number(row, "agg_gbps")), format_number(number(row, "ops_per_s")),
             format_seconds(number(row, "lat_p50_s")), format_seconds(number(row, "lat_p99_s"))]
            for row in rows[-MAX_OP_ROWS:]]
    return (tag("h2", "Ops", id="ops")
            + table(("job", "layout", "op", "ranks", "count", "agg GB/s", "ops/s", "p50", "p99"),
                    body))


def figures_section(archive_rows: list[Row], sidecars: dict[str, dict[str, Any]],
                    assessment: Any, traces: dict[str, Any] | None = None) -> str:
    """Scaling per phase; then per phase, from the sidecar of the run its verdict ranks
    (`sidecars` by run id: a cycle's restore and save are runs of their own), the latency
    CDFs and each layout's timeline of its slowest iteration; then, of a run with a trace
    (`traces` by run id), its throughput and ranks inside an op over time."""
    palette = figures.colours([row["layout"] for row in archive_rows])
    parts = []
    valid = [row for row in archive_rows if flag(row, "valid")]
    for phase in ("restore", "save"):
        verdict = assessment.phases.get(phase)
        fits = [(series, projection) for series, projection, _ in verdict.projections] \
            if verdict else []
        drawn = figures.scaling_figure(valid, phase, fits, assessment.target_ranks, palette)
        if drawn:
            parts.append(tag("h3", f"Scaling of the {phase}") + drawn + tag(
                "p", "dots: measured median, bar: min–max over iterations; line: the fitted "
                     "model; dashed to the square: its projection, the thick bar its band",
                class_="note"))
    drew = False
    for phase, verdict in assessment.phases.items():
        sidecar = sidecars.get(verdict.run_id) or {}
        entries = sidecar.get("saves" if phase == "save" else "layouts") or {}
        stats = {name: entry["stats"] for name, entry in entries.items() if entry.get("stats")}
        parts += _phase_figures(phase, stats, sidecar.get("hosts_by_rank") or [], palette)
        drew = drew or bool(stats)
    if not drew:
        parts.append(tag("p", "no sidecar with statistics for the runs ranked: no CDF or "
                              "timeline", class_="note"))
    for run_id, trace in (traces or {}).items():
        drawn_trace = trace_figures(trace, palette)
        if drawn_trace:
            parts += drawn_trace + [tag("p", f"from the trace of run {escape(run_id)} "
                                             "(--trace; `stampede analyze` reads it)",
                                        class_="note")]
    return tag("h2", "Figures", id="figures") + "".join(parts)


def warnings_section(run_rows: Sequence[Row]) -> str:
    common, by_layout = grouped_warnings(run_rows)
    items = [tag("li", escape(text)) for text in common]
    items += [tag("li", f"<b>{escape(layout)}</b>: {escape(text)}")
              for layout, texts in by_layout.items() for text in texts]
    return tag("h2", "Warnings", id="warnings") + (tag("ul", "".join(items)) if items else
                                                    tag("p", "none", class_="note"))


def _phase_figures(phase: str, stats: dict[str, Any], hosts: list[str], palette: Any) -> list[str]:
    """One phase's latency CDFs (an op per figure, its layouts in their colours) and each
    layout's timeline of its slowest iteration."""
    parts = []
    ops = list(dict.fromkeys(op for s in stats.values() for op in (s.get("histograms") or {})))
    for op in ops:
        drawn = figures.cdf_figure(op, {layout: s["histograms"][op] for layout, s in stats.items()
                                        if op in (s.get("histograms") or {})}, palette)
        if drawn:
            parts.append(tag("h3", f"Latency CDF: {phase} {op}") + drawn)
    for layout, layout_stats in stats.items():
        drawn_timeline = figures.timeline_figure(layout_stats, hosts)
        if drawn_timeline:
            svg_text, iteration = drawn_timeline
            parts.append(tag("h3", f"Timeline: {phase} {layout}, slowest iteration "
                                   f"({iteration}, 0-based)") + svg_text)
    return parts


def context_section(first: Row, sidecar: dict[str, Any] | None) -> str:
    """Machine, storage and MPI: the sidecar's facts (the CSV's where there is none)."""
    facts: list[tuple[str, str]] = [(key, first.get(key, "")) for key in
                                    ("job", "backend", "fs_type", "target", "cache", "nranks",
                                     "nnodes", "stampede_version", "schema")]
    if sidecar:
        facts += [(key, str(value)) for key, value in sidecar.items()
                  if key not in ("layouts", "job", "hosts_by_rank")]
        hosts = sidecar.get("hosts_by_rank") or []
        facts.append(("hosts", ", ".join(dict.fromkeys(hosts))))
    rows = [(key, value) for key, value in facts if value not in ("", "{}", "None")]
    return tag("h2", "Machine, storage and MPI", id="context") + table(("fact", "value"), rows)


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
    return tag("h2", "Definitions", id="definitions") + "".join(
        tag("details", tag("summary", escape(term)) + tag("p", escape(" ".join(text))))
        for term, text in entries)


def render_html(archive: str, rows: list[Row], sidecars: dict[str, dict[str, Any]],
                assessment: Any, notes: Sequence[str] = (),
                traces: dict[str, Any] | None = None) -> str:
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
    if not tables:
        tables = ops_table(rows)
    note = tag("ul", "".join(tag("li", escape(n)) for n in notes), class_="note") if notes else ""
    body = (tag("h1", f"stampede report: {escape(rows[-1].get('job') or archive)}")
            + tag("p", f"{escape(archive)}: {len({r['run_id'] for r in rows})} run(s); "
                       f"target {assessment.target_ranks} ranks", class_="note")
            + verdict_section(assessment) + note + tables
            + figures_section(rows, sidecars, assessment, traces)
            + warnings_section(shown_rows)
            + context_section(run_rows[0], sidecar) + definitions_section())
    head = (f'<meta charset="utf-8"><meta name="viewport" content="width=device-width, '
            f'initial-scale=1"><meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>stampede: {escape(archive)}</title><style>{STYLE}</style>")
    return f"<!DOCTYPE html><html lang=\"en\"><head>{head}</head><body>{body}</body></html>\n"


def run_rows_of(rows: Sequence[Row], run_id: str) -> list[Row]:
    return [row for row in rows if row["run_id"] == run_id]
