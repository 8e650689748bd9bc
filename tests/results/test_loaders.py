"""A loaders run's verdicts from its rows alone: efficiency against the ceiling of the same
policy, cache and rank count in the same run; what dominates; the report at 80 and 100
columns, skips and how each loader was called said in it. Rows go through the archive
(written, read back) as every reader sees them."""

from __future__ import annotations

import io
import math
from pathlib import Path

from stampede.present.report import make_console
from stampede.present.report_loaders import render_loaders
from stampede.results.archive import append_rows
from stampede.results.archived import Archive
from stampede.results.loaders import loader_lines


def _row(tool: str, op: str, p50_s: float, gbps: float = math.nan, layout: str = "files",
         cache: str = "cold", run_id: str = "r1", device: str = "") -> dict[str, object]:
    return {"run_id": run_id, "job": "existing", "layout": layout, "op": op, "valid": "true",
            "nranks": 2, "nnodes": 1, "ranks_per_node": 2, "backend": "posix", "tool": tool,
            "cache": cache,
            "iterations": 3, "timestamp": "2026-12-01T00:00:00+00:00", "device": device,
            "lat_p50_s": p50_s, "agg_gbps": gbps, "bytes_total": 10**9,
            "time_to_last_rank_s": p50_s * 1.1 if op == "restore" else None, "warnings": ""}


def _archive(tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "loaders.csv"
    append_rows(path, [
        _row("stampede", "read", 0.01, 8.0), _row("stampede", "restore", 0.20, 5.0),
        _row("safetensors", "header", 0.01), _row("safetensors", "load", 0.70, 1.5, device="cpu"),
        _row("safetensors", "restore", 0.80, 1.25, device="cpu"),
        _row("dcp", "index", 0.30, device="cpu"), _row("dcp", "plan", 0.10, device="cpu"),
        _row("dcp", "load", 0.20, device="cpu"), _row("dcp", "restore", 1.00, 1.0, device="cpu"),
        # another cache state, and another run: never each other's ceiling
        _row("stampede", "restore", 0.10, 10.0, cache="warm"),
        _row("runai", "restore", 0.40, 2.5, cache="warm", device="cpu"),
        _row("runai", "restore", 0.40, 2.5, run_id="r2", device="cpu"),
    ])
    return Archive.open(path).rows


def test_efficiency_is_against_the_same_runs_same_cache_ceiling(tmp_path: Path) -> None:
    by_name = {(line.loader, line.cache): line for line in loader_lines(_archive(tmp_path))
               if line.loader != "runai" or line.cache == "warm"}
    assert math.isnan(by_name[("stampede (posix)", "cold")].efficiency)
    assert by_name[("safetensors", "cold")].efficiency == 1.25 / 5.0
    assert by_name[("dcp", "cold")].efficiency == 1.0 / 5.0
    assert by_name[("runai", "warm")].efficiency == 2.5 / 10.0
    other_run = [line for line in loader_lines(_archive(tmp_path / "again"))
                 if line.loader == "runai" and line.cache == "cold"]
    assert [math.isnan(line.efficiency) for line in other_run] == [True]  # no ceiling in r2


def test_what_dominates_is_the_largest_phase_or_what_lies_outside_them(tmp_path: Path) -> None:
    lines = {(line.loader, line.cache): line for line in loader_lines(_archive(tmp_path))}
    assert lines[("safetensors", "cold")].dominant == "load 88%"
    assert lines[("dcp", "cold")].dominant == "other 40%"   # 1.0 - (0.3 + 0.1 + 0.2) s
    assert dict(lines[("dcp", "cold")].phases) == {"index": 0.3, "plan": 0.1, "load": 0.2}


def test_the_report_says_skips_notes_and_calls(tmp_path: Path) -> None:
    lines = loader_lines(_archive(tmp_path))
    for width in (80, 100):
        stream = io.StringIO()
        render_loaders(lines, [("fastsafetensors", "fastsafetensors is not installed (pip "
                                "install -e '/x[loaders-fastsafetensors]')")],
                       ["dcp files: only 3 measured iterations"],
                       [("dcp", "torch.distributed.checkpoint.load [gloo]")],
                       make_console(stream, width=width))
        text = stream.getvalue()
        assert all(len(line) <= width for line in text.splitlines()), text
        assert "ceiling" in text and "25%" in text and "load 88%" in text
        assert "[loaders-fastsafetensors]" in text   # brackets are not rich markup
        assert "torch.distributed.checkpoint.load [gloo]" in text
        assert "note: dcp files: only 3 measured iterations" in text


def test_read_amplification_per_node_and_rank_is_read_back_and_shown(tmp_path: Path) -> None:
    path = tmp_path / "loaders.csv"
    append_rows(path, [_row("stampede", "restore", 0.20, 5.0),
                       {**_row("torch.load", "restore", 0.80, 1.25, device="cpu"),
                        "needed_bytes": 10**9, "read_amplification": 2.0,
                        "read_amplification_node_max": 2.0, "read_amplification_rank_max": 2.0}])
    lines = {line.loader: line for line in loader_lines(Archive.open(path).rows)}
    assert lines["torch.load"].amplification == (2.0, 2.0, 2.0)
    assert all(math.isnan(ratio) for ratio in lines["stampede (posix)"].amplification)
    stream = io.StringIO()
    render_loaders(list(lines.values()), [], [], [], make_console(stream, width=100))
    assert "2.0x 2.0x/2.0x" in stream.getvalue()
