"""One table spec, two renderers: the restore and save tables the terminal shows (the
wide columns on a wide terminal only, an invalid layout in red) are the HTML report's,
cell for cell, in the same order. The terminal's own specs (a layout's ops, the archive's
history) draw their rows as archived."""

from __future__ import annotations

import io
import math
import re
from html import unescape

from stampede.present.html import restore_table, save_table
from stampede.present.report import (
    NARROW,
    make_console,
    render_history,
    render_layout,
    render_table,
)
from stampede.present.tables import RESTORE, SAVE, TableSpec
from stampede.results.cells import Row, cell, typed
from stampede.units import format_amplification

COMMON = {"run_id": "r1", "job": "j", "nranks": 4, "nnodes": 1, "ranks_per_node": 4,
          "backend": "posix", "iterations": 3, "bytes_per_rank": 2**20,
          "timestamp": "2026-12-01T00:00:00+00:00", "errors": 0, "slowest_ranks": "3@a:0.2"}


def row(layout: str, op: str, phase: str = "restore", valid: bool = True,
        **values: object) -> Row:
    """A row as archived and read back (typed)."""
    return typed({key: cell(value) for key, value in {
        **COMMON, "layout": layout, "op": op, "phase": phase, "valid": valid, **values}.items()})


def completion(layout: str, phase: str, median: float, valid: bool = True,
               **values: object) -> Row:
    return row(layout, phase, phase, valid, time_to_last_rank_s=median,
               time_to_last_rank_min_s=median * 0.95, time_to_last_rank_max_s=median * 1.05,
               first_done_s=median / 2, straggler_ratio=1.25, agg_gbps=12.5,
               slowest_rank_gbps=3.25, storage_s=median / 3, network_s=median / 4,
               storage_ops_per_iteration=7, unprotected_s=0.0, **values)


RUN = [completion("shared", "restore", 0.2, read_amplification=4.0),
       completion("sharded", "restore", 0.1, read_amplification=1.0),
       completion("broadcast", "restore", 0.3, valid=False),
       completion("shared", "save", 0.4, durability="none"),
       row("shared", "published", "save", elapsed_s=0.41),
       row("shared", "validate", "save", errors=0),
       completion("sharded", "save", 0.5)]


def terminal(spec: TableSpec, width: int) -> list[list[str]]:
    """The table's body as the terminal draws it, cell by cell (column gaps are 2+ spaces,
    the last-rank cell has single ones)."""
    stream = io.StringIO()
    render_table(spec, RUN, make_console(stream, width=width))
    lines = stream.getvalue().splitlines()
    rule = next(index for index, line in enumerate(lines) if line.strip().startswith("─"))
    return [re.split(r" {2,}", line.strip()) for line in lines[rule + 1:] if line.strip()]


def html(spec: TableSpec) -> tuple[list[str], list[list[str]]]:
    page = (restore_table if spec is RESTORE else save_table)(RUN)
    headers = [unescape(text) for text in re.findall(r"<th>(.*?)</th>", page)]
    rows = [[unescape(text) for text in re.findall(r"<td>(.*?)</td>", found)]
            for found in re.findall(r"<tr>(.*?)</tr>", page) if "<td>" in found]
    return headers, rows


def test_the_terminal_and_the_html_draw_one_spec_cell_for_cell() -> None:
    for spec, layouts in ((RESTORE, ["sharded", "shared", "broadcast"]),
                          (SAVE, ["shared", "sharded"])):
        headers, cells = html(spec)
        assert headers == [column.one_line for column in spec.columns]
        assert [line[0] for line in cells] == layouts   # ranked: best first, invalid last
        assert terminal(spec, 200) == cells
        narrow = terminal(spec, NARROW - 1)
        essential = [index for index, column in enumerate(spec.columns) if not column.wide]
        assert narrow == [[line[index] for index in essential] for line in cells]
        assert len(essential) < len(spec.columns)
    restore = dict(zip(html(RESTORE)[0], html(RESTORE)[1][1], strict=True))
    assert restore["last rank (min-max)"] == "200 (190-210) ms"
    assert restore["vs best"] == "+100%" and restore["first done"] == "100 ms"
    assert restore["read ampl"] == "4.0x"   # what it read over what the job needed
    assert [line[6] for line in html(RESTORE)[1]] == ["1.0x", "4.0x", "-"]   # unmeasured: -
    assert html(RESTORE)[1][2][2] == "INVALID"
    save = dict(zip(html(SAVE)[0], html(SAVE)[1][0], strict=True))
    assert save["published"] == "410 ms" and save["validate errors"] == "0"
    assert save["agg GB/s"].endswith(" buf")   # handed to the page cache only
    assert "buf = save.durability = none" in save_table(RUN)


def test_read_amplification_reads_as_a_multiple() -> None:
    assert [format_amplification(ratio) for ratio in (8.0, 1.0, 1.049, 0.5, 0.25, 0.0,
                                                      2048.0, math.nan, math.inf)] \
        == ["8.0x", "1.0x", "1.0x", "0.5x", "0.25x", "0.0x", "2,048x", "-", "-"]


def test_an_invalid_layout_is_red_on_the_terminal_only() -> None:
    from rich.console import Console

    stream = io.StringIO()
    render_table(RESTORE, RUN, Console(file=stream, width=200, force_terminal=True,
                                       color_system="standard"))
    assert "\x1b[31mINVALID\x1b[0m" in stream.getvalue()
    assert "[red]" not in restore_table(RUN) and "\x1b" not in restore_table(RUN)


def _coloured(render: object, rows: list[dict[str, str]]) -> str:
    from rich.console import Console

    stream = io.StringIO()
    render(rows, Console(file=stream, width=200, force_terminal=True,  # type: ignore[operator]
                         color_system="standard", highlight=False))
    return stream.getvalue()


def test_the_history_draws_every_completion_row_as_archived() -> None:
    """A cell's text is the archive's, never read as markup; a loader's rows name it; an
    invalid run's NO in red; rows that complete nothing (an op's) are left out."""
    archived = {"cache": "cold", "bytes_total": 2**30}
    rows = [completion("shared", "restore", 0.2, job="my[bold]job", **archived),
            completion("files", "restore", 0.3, valid=False, tool="safetensors", **archived),
            row("shared", "read", lat_p50_s=0.001, **archived)]
    text = _coloured(render_history, rows)
    body = [line for line in text.splitlines() if "r1" in line]
    assert len(body) == 2 and "my[bold]job" in body[0]
    assert "files (safetensors)" in body[1] and "\x1b[31mNO\x1b[0m" in body[1]


def test_a_layouts_ops_in_the_unit_of_each_ops_p50() -> None:
    rows = [row("shared", "stat", count=8, errors=3, samples="histogram", lat_min_s=2e-6,
                lat_p50_s=4e-6, lat_p90_s=5e-6, lat_p99_s=6e-6, lat_p999_s=7e-6, lat_max_s=8e-6,
                ops_per_s=1000.0),
            row("shared", "read", count=8, samples="histogram", lat_min_s=0.001,
                lat_p50_s=0.002, lat_p90_s=0.003, lat_p99_s=0.004, lat_p999_s=0.005,
                lat_max_s=0.006, ops_per_s=500.0, agg_gbps=1.5)]
    text = _coloured(render_layout, rows)
    title = " ".join(text.replace("\x1b[3m", "").replace("\x1b[0m", "").split())
    assert "shared: latency per op, all ranks and iterations (p50-p99.9 from histograms, " \
           "within 1%)" in title
    stat, read = (re.split(r" {2,}", line.strip()) for line in text.splitlines()
                  if line.strip().startswith(("stat", "read")))
    assert stat[:5] == ["stat", "µs", "8", "\x1b[31m3\x1b[0m", "2"]   # errors in red
    assert read[:5] == ["read", "ms", "8", "0", "1"] and read[-1] == "1.5"


def test_each_ops_throttling_retries_and_backoff_are_said_under_its_ops() -> None:
    """An object store's throttled run (issue 38): under the layout's ops, each op that met
    throttling or retried, with its 503s, retries and seconds backing off; nothing is said
    where no op did (a POSIX run, or rows of a schema before throttles)."""
    timing = {"count": 8, "lat_min_s": 0.001, "lat_p50_s": 0.002, "lat_p90_s": 0.003,
              "lat_p99_s": 0.004, "lat_p999_s": 0.005, "lat_max_s": 0.006}
    rows = [row("sharded", "stat", throttles=0, retries=0, backoff_s=0.0, **timing),
            row("sharded", "open", throttles=3, retries=3, backoff_s=1.25, **timing),
            row("sharded", "read", throttles=12, retries=11, backoff_s=9.5, **timing),
            row("sharded", "close", throttles=0, retries=1, backoff_s=0.05, **timing)]
    stream = io.StringIO()
    render_layout(rows, make_console(stream, width=160))
    said = " ".join(stream.getvalue().split())
    assert ("throttling answers (429, 503) / retries / time backing off, all ranks and "
            "iterations: open 3 / 3 / 1.25 s, read 12 / 11 / 9.5 s, close 0 / 1 / 50 ms"
            in said), said
    quiet = io.StringIO()
    render_layout([row("sharded", "read", **timing)], make_console(quiet, width=160))
    assert "throttling" not in quiet.getvalue()
