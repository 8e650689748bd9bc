"""Each layout's efficiency against the raw-read ceiling where a run measured it
(run.ceiling): a note under the restore table, terminal and HTML alike, and a column of
the HTML summary; a run that measured none shows neither (its pages stay as they were)."""

from __future__ import annotations

import io

from stampede.present.html import restore_table
from stampede.present.report import make_console, render_table
from stampede.present.tables import RESTORE, ceiling_efficiency, ceiling_notes
from stampede.results.cells import Row, cell, typed

COMMON = {"run_id": "r1", "job": "j", "nranks": 4, "nnodes": 1, "ranks_per_node": 4,
          "backend": "posix", "iterations": 3, "bytes_per_rank": 2**20, "phase": "restore",
          "op": "restore", "valid": True, "timestamp": "2026-12-01T00:00:00+00:00",
          "errors": 0, "slowest_ranks": "3@a:0.2", "straggler_ratio": 1.1, "agg_gbps": 2.0,
          "slowest_rank_gbps": 0.5, "first_done_s": 0.1, "storage_s": 0.2, "network_s": 0.0,
          "storage_ops_per_iteration": 8}


def restore(layout: str, seconds: float, **values: object) -> Row:
    return typed({key: cell(value) for key, value in {
        **COMMON, "layout": layout, "time_to_last_rank_s": seconds,
        "time_to_last_rank_min_s": seconds, "time_to_last_rank_max_s": seconds,
        **values}.items()})


MEASURED = [restore("sharded", 0.1, ceiling_gbps=1.5, ceiling_gbps_max=1.5,
                    ceiling_efficiency=0.934),
            restore("whole-file", 0.4, ceiling_gbps=1.5, ceiling_gbps_max=1.5,
                    ceiling_efficiency=0.25)]
UNMEASURED = [restore("sharded", 0.1), restore("whole-file", 0.4)]


def test_a_measured_run_says_each_layouts_efficiency_under_its_table() -> None:
    assert ceiling_efficiency(MEASURED[0]) == "0.93x"
    assert ceiling_efficiency(UNMEASURED[0]) == ""
    [note] = ceiling_notes(RESTORE.lines(MEASURED))
    assert note.startswith("vs the raw-read ceiling (1.5 GB/s,")
    assert note.endswith("sharded 0.93x, whole-file 0.25x")   # best first, as the table
    assert "sharded 0.93x" in restore_table(MEASURED)
    stream = io.StringIO()
    lines = render_table(RESTORE, MEASURED, make_console(stream, width=200))
    assert RESTORE.notes(lines) == [note]


def test_a_run_without_the_ceiling_says_nothing_of_it() -> None:
    assert ceiling_notes(RESTORE.lines(UNMEASURED)) == []
    assert "raw-read ceiling" not in restore_table(UNMEASURED)


def test_two_nodes_name_the_slowest_and_fastest_ceiling() -> None:
    rows = [restore("sharded", 0.1, nnodes=2, ceiling_gbps=1.25, ceiling_gbps_max=2.0,
                    ceiling_efficiency=0.5)]
    [note] = ceiling_notes(RESTORE.lines(rows))
    assert "(1.25-2 GB/s per node," in note, note
