"""`stampede plot` on a real sweep archive: stampede itself prepares and runs a small job at
1 rank (plain) and 2 ranks (the venv's mpiexec), shared and sharded, then the figures are
checked against the archive's and sidecars' numbers, and the PNGs against their format."""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from stampede.results.archive import read_rows, sidecar_path
from stampede.results.archived import Archive
from stampede.results.cells import Row
from tests.helpers import requires
from tests.helpers.jobs import RUN_TIMEOUT_S, small_job


@pytest.fixture
def matplotlib_ready() -> None:
    """The plot tests need matplotlib, an optional extra."""
    requires.module("matplotlib", "PLOT", "pip install -e '.[plot]'")


needs_matplotlib = pytest.mark.usefixtures("matplotlib_ready")
RANK_COUNTS = (1, 2)
LAYOUTS = ("shared", "sharded")
ITERATIONS = 2
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SPREAD_COLUMNS = {"agg_gbps": ("agg_gbps_min", "agg_gbps_max"),
                  "time_to_last_rank_s": ("time_to_last_rank_min_s", "time_to_last_rank_max_s")}
SECONDS_PER = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def cli(*args: str, np: int | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real stampede command; under the venv's mpiexec when np is given."""
    from stampede.launcher import find_mpiexec

    command = [sys.executable, "-m", "stampede", *args]
    if np is not None:
        mpiexec = find_mpiexec()
        if mpiexec is None:
            pytest.fail("mpiexec not found: pip install -r requirements/test.txt")
        command = [mpiexec, "-n", str(np), *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=cwd)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep archive: one run at each rank count, both layouts, 2 measured iterations."""
    directory = tmp_path_factory.mktemp("plot")
    job = small_job(directory, run={"iterations": ITERATIONS})
    for nranks in RANK_COUNTS:
        target = f"target.path={directory / f'ckpt-{nranks}'}"
        for step in ("prepare", "run"):
            result = cli(step, str(job), "--set", target, np=nranks if nranks > 1 else None,
                         cwd=directory)
            assert result.returncode == 0, result.stdout + result.stderr
    return directory / "results" / "job.csv"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's IHDR chunk; fails if it is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def restore_row(rows: Sequence[Row], layout: str, nranks: int, op: str = "restore") -> Row:
    (row,) = [r for r in rows if r["layout"] == layout and r["nranks"] == nranks and r["op"] == op]
    return row


def last_sidecar(archive: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(sidecar_path(archive, read_rows(archive)[-1]["run_id"]).read_text())
    return document


def build(archive: Path, kind: str, **options: Any) -> tuple[Any, list[str]]:
    from stampede.present import plot

    figures, notes = plot.build_figures(Archive.open(archive), (kind,), **options)
    return figures.get(kind), notes


@needs_matplotlib
@pytest.mark.mpi
def test_plot_writes_three_readable_pngs(sweep: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()   # -o names files: their directory must exist
    result = cli("plot", str(sweep), "-o", str(tmp_path / "out" / "sweep.png"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    for kind in ("cdf", "scaling", "timeline"):
        path = tmp_path / "out" / f"sweep-{kind}.png"
        assert f"wrote {path}" in result.stdout
        width, height = png_size(path)
        assert 600 <= width <= 4000 and 300 <= height <= 4000, (kind, width, height)
        assert path.stat().st_size > 20_000, f"{path} is suspiciously small: an empty figure?"


@needs_matplotlib
@pytest.mark.mpi
def test_scaling_lines_are_the_archives_medians_and_spreads(sweep: Path) -> None:
    from stampede.units import seconds_unit

    rows = Archive.open(sweep).rows
    unit, factor = seconds_unit(max(row["time_to_last_rank_s"] for row in rows
                                    if math.isfinite(row["time_to_last_rank_s"])))
    figure, notes = build(sweep, "scaling")
    assert notes == []
    gbps_ax, ttlr_ax = figure.axes
    assert "GB/s" in gbps_ax.get_ylabel() and "ranks" in gbps_ax.get_xlabel()
    assert ttlr_ax.get_ylabel() == f"time to last rank ({unit})"
    assert "cache warm" in figure.get_suptitle() and "job job" in figure.get_suptitle()
    # per layout: a restore (solid) and a read (dashed) line on the GB/s panel, one on the other
    assert sorted(c.get_label() for c in gbps_ax.containers) == sorted(LAYOUTS * 2)
    assert sorted(c.get_label() for c in ttlr_ax.containers) == sorted(LAYOUTS)
    for container in ttlr_ax.containers:
        assert_series(container, rows, "restore", "time_to_last_rank_s", factor)
    for container in gbps_ax.containers:
        op = "restore" if container.lines[0].get_linestyle() == "-" else "read"
        assert_series(container, rows, op, "agg_gbps")


def assert_series(container: Any, rows: Sequence[Row], op: str, column: str,
                  factor: float = 1.0) -> None:
    """One plotted line = the archive's value at each rank count, error bars = its spread."""
    data, _caps, (bars,) = container.lines
    found = [restore_row(rows, container.get_label(), n, op) for n in RANK_COUNTS]
    low, high = SPREAD_COLUMNS[column]
    assert data.get_xdata() == pytest.approx(RANK_COUNTS, rel=0.05)   # nudged sideways a little
    assert data.get_ydata() == pytest.approx([float(row[column]) / factor for row in found])
    spread = [float(row[end]) / factor for row in found for end in (low, high)]
    assert [y for segment in bars.get_segments() for _x, y in segment] == pytest.approx(spread)


@needs_matplotlib
@pytest.mark.mpi
def test_cdf_has_a_panel_per_op_and_a_line_per_layout_spanning_the_samples(sweep: Path) -> None:
    rows = [row for row in Archive.open(sweep).rows if row["nranks"] == 2]
    figure, _ = build(sweep, "cdf")
    panels = [ax for ax in figure.axes if ax.get_visible()]
    ops = sorted({row["op"] for row in rows})
    assert sorted(ax.get_title().split(" ")[0].rstrip(":") for ax in panels) == ops
    assert "20-per-decade" in figure.get_suptitle() and "cache warm" in figure.get_suptitle()
    for ax in panels:
        op = ax.get_title().split(" ")[0].rstrip(":")
        counts = sorted({int(restore_row(rows, layout, 2, op)["count"]) for layout in LAYOUTS})
        assert f"n = {'-'.join(map(str, counts))} per layout" in ax.get_title()
        assert ax.get_xscale() == "log" and "latency" in ax.get_xlabel()
        assert [line.get_label() for line in ax.get_lines()] == list(LAYOUTS)
        for line in ax.get_lines():
            xs, ys = line.get_xdata(), line.get_ydata()
            row = restore_row(rows, line.get_label(), 2, op)
            assert ys[0] == 0 and ys[-1] == pytest.approx(1.0) and list(ys) == sorted(ys)
            # the bucket edges bracket the exact extremes of the archive
            assert xs[0] <= float(row["lat_min_s"]) and xs[-1] >= float(row["lat_max_s"])


@needs_matplotlib
@pytest.mark.mpi
def test_timeline_shows_every_rank_of_the_median_or_chosen_iteration(sweep: Path) -> None:
    document = last_sidecar(sweep)
    figure, _ = build(sweep, "timeline")
    assert [ax.get_title().split(":")[0] for ax in figure.axes] == list(LAYOUTS)
    xlabel = figure.axes[-1].get_xlabel()
    assert xlabel.startswith("time since the rank left the start barrier (")
    factor = SECONDS_PER[xlabel.rsplit("(", 1)[1].rstrip(")")]
    for ax, layout in zip(figure.axes, LAYOUTS):
        per_iteration_s = document["layouts"][layout]["stats"]["restore"]["per_iteration_s"]
        (bars,) = ax.collections[:1]
        assert len(bars.get_segments()) == 2                       # one bar per rank
        last_rank = ax.get_lines()[-1].get_xdata()[0] * factor     # the dashed line
        assert last_rank == pytest.approx(min(per_iteration_s), rel=1e-6)   # median_low of 2
        assert_phase_bars(ax, document["layouts"][layout]["stats"]["timeline"], factor)
    chosen, _ = build(sweep, "timeline", iteration=1)
    factor = SECONDS_PER[chosen.axes[-1].get_xlabel().rsplit("(", 1)[1].rstrip(")")]
    for ax, layout in zip(chosen.axes, LAYOUTS):
        per_iteration_s = document["layouts"][layout]["stats"]["restore"]["per_iteration_s"]
        assert "iteration 1 " in ax.get_title()
        assert ax.get_lines()[-1].get_xdata()[0] * factor == pytest.approx(per_iteration_s[1], rel=1e-6)


def assert_phase_bars(ax: Any, timeline: list[list[float | None]], factor: float) -> None:
    """Over each rank's bar, a bar per phase it spent time in (the HTML report's phases,
    present.figures.rank_segments), labelled by phase, as long as the sidecar's column."""
    from stampede.ops import TIMELINE_PHASES
    from stampede.results.model import TIMELINE_MOMENTS

    iteration = int(ax.get_title().split("measured iteration ")[1].split(" ")[0])
    rows = [row for row in timeline if row[1] == iteration]
    present = [phase for index, phase in enumerate(TIMELINE_PHASES)
               if any((row[len(TIMELINE_MOMENTS) + index] or 0) > 0 for row in rows)]
    assert [container.get_label() for container in ax.containers] == present and "read" in present
    for container in ax.containers:
        column = len(TIMELINE_MOMENTS) + list(TIMELINE_PHASES).index(container.get_label())
        widths = {round(bar.get_y() + bar.get_height() / 2): bar.get_width() * factor
                  for bar in container}
        assert widths == pytest.approx({int(row[0]): row[column] for row in rows
                                        if (row[column] or 0) > 0}, rel=1e-6)


@needs_matplotlib
@pytest.mark.mpi
def test_a_run_without_sidecar_gets_a_note_and_the_scaling_figure_only(sweep: Path, tmp_path: Path) -> None:
    shutil.copy(sweep, tmp_path / "job.csv")                      # the CSV without its sidecars
    result = cli("plot", str(tmp_path / "job.csv"), "-o", str(tmp_path / "p"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no readable sidecar" in result.stderr
    assert (tmp_path / "p-scaling.png").exists() and not (tmp_path / "p-cdf.png").exists()
    result = cli("plot", str(tmp_path / "job.csv"), "--kind", "timeline", cwd=tmp_path)
    assert result.returncode == 2 and "nothing to draw" in result.stderr


@needs_matplotlib
@pytest.mark.mpi
@pytest.mark.parametrize(("args", "message"), [
    (["--run", "no-such-run"], "--run no-such-run: no such run"),
    (["--kind", "timeline", "--iteration", "9"], "--iteration 9"),
])
def test_a_bad_run_or_iteration_is_a_usage_error(sweep: Path, tmp_path: Path, args: list[str],
                                                 message: str) -> None:
    result = cli("plot", str(sweep), "-o", str(tmp_path / "x.png"), *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr


@needs_matplotlib
def test_an_archive_without_runs_is_a_usage_error(tmp_path: Path) -> None:
    from stampede.results.archive import COLUMNS

    (tmp_path / "empty.csv").write_text(",".join(COLUMNS) + "\n")
    result = cli("plot", str(tmp_path / "empty.csv"), cwd=tmp_path)
    assert result.returncode == 2 and "holds no runs" in result.stderr, result.stderr


def test_without_matplotlib_plot_says_how_to_install_it_and_exits_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from stampede import cli as stampede_cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    assert stampede_cli.main(["plot", str(tmp_path / "any.csv")]) == 2
    said = capsys.readouterr().err
    repo = Path(__file__).resolve().parents[2]
    assert f"pip install -e '{repo}[plot]'" in said   # from this clone, its own path


def test_output_is_a_file_for_one_kind_and_a_stem_for_all() -> None:
    from stampede.present.plot import output_paths

    assert output_paths("out.png", ("cdf",)) == {"cdf": Path("out.png")}
    assert output_paths("d/out.png", ("cdf", "timeline")) == {
        "cdf": Path("d/out-cdf.png"), "timeline": Path("d/out-timeline.png")}
    assert output_paths("d/out", ("scaling",)) == {"scaling": Path("d/out")}
