"""`--trace` and `stampede analyze`: real ranks keep every op, the trace's counts are the
archive's, the storm is read back over time, exported as Chrome trace JSON; a trace that
would pass its limit is refused before any I/O."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from stampede.ops import OP_CODE
from stampede.results import trace as traces
from stampede.results.model import LayoutTrace
from stampede.results.readback import read_trace
from tests.helpers.jobs import read_archive, small_job


def whole(path: Path) -> traces.Trace:
    """A trace that reads back whole: no note."""
    found = read_trace(path)
    assert found.value is not None and found.notes == (), found.notes
    return found.value


@pytest.mark.mpi
def test_a_traced_run_and_save_are_read_back_with_the_archives_counts(
        stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"iterations": 3, "warmup": 1, "verify": "none"},
                    save={"keep": 1})
    assert stampede("prepare", str(job), np=2).returncode == 0
    ran = stampede("run", str(job), "--trace", np=2)
    assert ran.returncode == 0, ran.stderr
    saved = stampede("save", str(job), "--trace", np=2)
    assert saved.returncode == 0, saved.stderr
    archive = tmp_path / "results" / "job.csv"
    found = sorted((tmp_path / "results" / "job.runs").glob("*.trace.npz"))
    assert len(found) == 2 and "trace " in " ".join(ran.stdout.split())
    rows = read_archive(archive)
    for path in found:
        trace = whole(path)
        run_id = trace.meta["run_id"]
        assert path.name == f"{run_id}.trace.npz"
        for key, layout_rows in trace.layouts.items():
            phase, layout = key.split("/")
            archived = {row["op"]: int(row["count"]) for row in rows
                        if row["run_id"] == run_id and row["layout"] == layout
                        and row["count"] and int(row["count"])}
            counted = traces.op_counts(trace, layout_rows)
            assert counted == {op: archived[op] for op in counted}, (key, counted, archived)
            assert set(layout_rows[:, traces.RANK].tolist()) == {0, 1}
            assert traces.iterations(layout_rows) == [0, 1, 2]
            assert_located(trace, key, layout_rows)
        assert {key.split("/")[0] for key in trace.layouts} == {
            "restore" if "restore/shared" in trace.layouts else "save"}
    # the run's trace: two runs in one second sort by their random suffix, not their order
    found.sort(key=lambda path: "restore/shared" not in whole(path).layouts)
    chrome, dxt = tmp_path / "run.json", tmp_path / "run.dxt"
    analyzed = stampede("analyze", str(found[0]), "--chrome", str(chrome), "--dxt", str(dxt))
    assert analyzed.returncode == 0, analyzed.stderr
    said = " ".join(analyzed.stdout.split())
    assert "files: 2; most bytes: " in said and "files: 1; most bytes: " in said  # sharded, shared
    assert_dxt(whole(found[0]), dxt.read_text())
    assert "restore/shared: iteration" in said and "restore/sharded: iteration" in said
    trace = whole(found[0])
    for key, layout_rows in trace.layouts.items():   # what it prints is the trace's reading
        slowest = layout_rows[layout_rows[:, traces.ITERATION]
                              == traces.slowest_iteration(trace, layout_rows)]
        most = max(s.inside_max for s in traces.segments(trace, slowest))
        assert 1 <= most <= 2
        assert f"{key}: iteration {traces.slowest_iteration(trace, layout_rows)} " in said
    assert "most ranks inside a storage op at once: " in said
    document = json.loads(chrome.read_text())
    slices = [event for event in document["traceEvents"] if event["ph"] == "X"]
    assert len(slices) == sum(len(rows) for rows in trace.layouts.values())
    latest = stampede("analyze", str(archive), "--layout", "save/sharded", "--iteration", "1")
    assert latest.returncode == 0 and "save/sharded: iteration 1" in latest.stdout
    report = tmp_path / "report.html"          # the HTML report draws the shown run's trace
    assert stampede("html", str(archive), "-o", str(report)).returncode == 0
    page = report.read_text()
    assert "save over time: throughput" in page and "save over time: ranks inside" in page
    assert "save/sharded: ranks inside a storage op over time" in page   # the heat map
    rendered_in_a_browser(report)


def rendered_in_a_browser(report: Path) -> None:
    """Chromium, headless, parses the traced report's figures (the trace's, the heat maps'
    cells among them) and draws the page, offline, with nothing on its console."""
    from tests.helpers import browser

    browser.chromium()
    dom = browser.headless(report, "--dump-dom")
    figures = report.read_text().count('<svg class="figure"')
    assert dom.stdout.count('<svg class="figure"') == figures
    assert dom.stdout.count("over time: ranks inside") >= 2 and 'fill-opacity="' in dom.stdout
    shot = report.with_suffix(".png")
    drawn = browser.headless(report, f"--screenshot={shot}", "--window-size=1280,4000")
    assert shot.stat().st_size > 20_000, drawn.stderr
    assert browser.console_lines(dom.stderr + drawn.stderr) == []


@pytest.mark.mpi
def test_a_trace_past_its_limit_and_bad_choices_are_refused(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"iterations": 2, "warmup": 0, "verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    planned = stampede("plan", str(job), "--np", "2", "--trace", "--trace-limit", "1KiB")
    assert planned.returncode == 0 and "(past the limit: refused)" in planned.stdout
    refused = stampede("run", str(job), "--trace", "--trace-limit", "1KiB", np=2)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "more than --trace-limit 1 KiB" in " ".join(refused.stderr.split())
    assert not (tmp_path / "results" / "job.csv").exists()   # nothing ran, nothing archived
    assert stampede("run", str(job), "--trace", np=2).returncode == 0
    for args, said in ((["--layout", "restore/shraded"], 'did you mean "restore/sharded"'),
                       (["--iteration", "7"], "the measured iterations are 0, 1"),
                       (["--segments", "0"], "--segments 0: must be at least 1")):
        bad = stampede("analyze", str(tmp_path / "results" / "job.csv"), *args)
        assert bad.returncode == 2 and said in bad.stderr, (args, bad.stderr)
    none = stampede("analyze", str(job))
    assert none.returncode == 2 and "no trace" in none.stderr


def assert_located(trace: traces.Trace, key: str, rows: np.ndarray) -> None:
    """Each read or write names its file and offset: in each iteration the shared layout's
    two ranks one file (a save: its version's), the sharded layout's one each, and a rank's
    blocks tile its bytes; stat, open, fsync and close name a file and no offset; the
    phase's pseudo-op neither."""
    names = trace.files(key)
    data = rows[np.isin(rows[:, traces.OP], [trace.code("read"), trace.code("write")])]
    assert len(data) and (data[:, traces.FILE] >= 0).all() and (data[:, traces.OFFSET] >= 0).all()
    for iteration in traces.iterations(rows):
        files = {}
        for rank in (0, 1):
            mine = data[(data[:, traces.RANK] == rank) & (data[:, traces.ITERATION] == iteration)]
            files[rank] = {names[i] for i in mine[:, traces.FILE]}
            assert len(files[rank]) == 1, (key, iteration, files)
            order = np.argsort(mine[:, traces.OFFSET])
            offsets, sizes = mine[order, traces.OFFSET], mine[order, traces.NBYTES]
            assert (offsets[1:] == offsets[:-1] + sizes[:-1]).all()   # contiguous blocks
        assert (files[0] == files[1]) == key.endswith("/shared"), (key, files)
    named = rows[np.isin(rows[:, traces.OP], [trace.code(op) for op in ("stat", "open", "fsync")])]
    assert len(named) and (named[:, traces.FILE] >= 0).all()
    assert (named[:, traces.OFFSET] == traces.NOWHERE).all()
    done = rows[np.isin(rows[:, traces.OP], [trace.code("restore"), trace.code("save")])]
    assert len(done) and (done[:, traces.FILE] == traces.NOWHERE).all()


def assert_dxt(trace: traces.Trace, text: str) -> None:
    """A DXT block per (file, rank) with its counts; a line per read, its offset and
    length the trace's."""
    lines = [line.split() for line in text.splitlines() if line.startswith(" X_STAMPEDE")]
    reads = [rows[rows[:, traces.OP] == trace.code("read")] for rows in trace.layouts.values()]
    assert len(lines) == sum(len(part) for part in reads)
    assert {(int(line[4]), int(line[5])) for line in lines} == {
        (int(row[traces.OFFSET]), int(row[traces.NBYTES])) for part in reads for row in part}
    heads = [line for line in text.splitlines() if line.startswith("# DXT, read_count")
             or line.startswith("# DXT, write_count")]
    assert sum(int(head.rsplit(" ", 1)[1]) for head in heads) == len(lines)
    assert all(float(line[6]) <= float(line[7]) for line in lines)


MS = 1_000_000
RUN_ID = "20260101T000000Z-0000abcd"


def a_traced_archive(tmp_path: Path) -> Path:
    """A.csv with its run's sidecar and trace (written as a run writes them, no ranks): rank
    0 reads 10 MB over 0-10 ms, rank 1 10 MB over 30-40 ms, so the span's middle moves
    nothing."""
    def row(op: str, start_ms: int, stop_ms: int, nbytes: int, rank: int) -> list[int]:
        return [0, OP_CODE[op], start_ms * MS, stop_ms * MS, nbytes, 1, rank, rank, 0]

    rows = np.array([row("read", 0, 10, 10_000_000, 0), row("restore", 0, 10, 10_000_000, 0),
                     row("read", 30, 40, 10_000_000, 1), row("restore", 0, 40, 10_000_000, 1)],
                    dtype=np.int64)
    archive = tmp_path / "A.csv"
    archive.write_text("schema,run_id\n")
    (tmp_path / "A.runs").mkdir()
    (tmp_path / "A.runs" / f"{RUN_ID}.json").write_text("{}")
    traces.write_trace(tmp_path / "A.runs" / f"{RUN_ID}.trace.npz",
                       {"restore/sharded": LayoutTrace(rows, ["shards/0", "shards/1"])},
                       {"run_id": RUN_ID, "phase": "restore", "hosts_by_rank": ["a", "a"]})
    return archive


def contents(root: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_an_export_never_lands_on_an_input_or_where_it_cannot_be_written(
        stampede, tmp_path: Path) -> None:
    """E1: --chrome/--dxt onto the archive, a link to it, its sidecar or ./ once wrote over
    them (exit 0); E14: onto /proc, /dev/full, a missing directory, five tracebacks after
    the analysis. Now each is one line and exit 2 before the analysis, nothing written."""
    archive = a_traced_archive(tmp_path)
    (tmp_path / "link.csv").symlink_to(archive)
    before = contents(tmp_path)
    sidecar = f"A.runs/{RUN_ID}.json"
    for flag in ("--chrome", "--dxt"):
        for bad, said in (("A.csv", f"{flag} A.csv: is the archive"),
                          ("link.csv", f"{flag} link.csv: is the archive"),
                          (sidecar, f"{flag} {sidecar}: lies inside {tmp_path / 'A.runs'}"),
                          ("./", f"{flag} './': names a directory"),
                          (".", f"{flag} .: is a directory"),
                          ("/proc/x.json", f"{flag} /proc/x.json: cannot write in /proc"),
                          ("/dev/full", f"{flag} /dev/full: is a character device"),
                          ("gone/x.json", f"{flag} gone/x.json: its directory {tmp_path / 'gone'}"
                                          " does not exist")):
            for given in ("A.csv", f"A.runs/{RUN_ID}.trace.npz"):   # an archive, or its trace
                refused = stampede("analyze", given, flag, bad)
                assert refused.returncode == 2, (flag, bad, refused.stderr)
                lines = refused.stderr.splitlines()
                assert len(lines) == 1 and lines[0].startswith(
                    f"stampede analyze: error: {said}"), (given, lines)
                assert refused.stdout == ""   # before the analysis
                assert contents(tmp_path) == before
    done = stampede("analyze", "A.csv", "--chrome", "run.json", "--dxt", "run.txt")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert "shards/1" in (tmp_path / "run.txt").read_text()


def test_the_summary_counts_the_segments_that_moved_nothing(stampede, tmp_path: Path) -> None:
    """E19: the slowest segment once skipped those that moved nothing (the slowest is 0)."""
    a_traced_archive(tmp_path)
    trace = whole(tmp_path / "A.runs" / f"{RUN_ID}.trace.npz")
    rows = trace.layouts["restore/sharded"]
    found = traces.segments(trace, rows, 4)   # 0-10, 10-20, 20-30, 30-40 ms
    assert [round(segment.nbytes) for segment in found] == [10_000_000, 0, 0, 10_000_000]
    assert traces.segment_rates(found) == ("GB/s", [0.0, 0.0, 1.0, 1.0])
    analyzed = stampede("analyze", "A.csv", "--segments", "4")
    assert analyzed.returncode == 0, analyzed.stderr
    said = " ".join(analyzed.stdout.split())
    assert "segments by GB/s: slowest 0, median 1, fastest 1 (2 of 4 at 0);" in said, said


def test_a_fifo_or_a_directory_given_as_the_trace_is_named_for_what_it_is(
        stampede, tmp_path: Path) -> None:
    """E21: `analyze FIFO` said "no such trace" (and an IOR-like name would have blocked
    opening it); now what it is, exit 2, at once."""
    for name in ("fifo", "x.trace.npz", "ops.csv-0-00001.csv"):
        os.mkfifo(tmp_path / name)
        started = time.monotonic()
        refused = stampede("analyze", name, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith(f"stampede analyze: error: {name}: is a FIFO, not a "
                                         "trace file"), refused.stderr
        assert time.monotonic() - started < 60
    (tmp_path / "d").mkdir()
    refused = stampede("analyze", "d")
    assert refused.returncode == 2 and "d: is a directory, not a trace file" in refused.stderr


def test_an_archive_s_latest_trace_is_its_last_traced_run_not_the_last_name(tmp_path: Path
                                                                           ) -> None:
    """Run ids begun in one second sort by their random suffix: the latest trace is the
    archive's last traced run (a save's, after a run's, was once missed)."""
    from stampede.commands.analyze import find_trace
    from stampede.results.archive import sidecar_dir

    archive = tmp_path / "A.csv"
    first, second, untraced = ("20261204T103705Z-f0000000", "20261204T103705Z-a0000000",
                               "20261204T103706Z-00000000")
    archive.write_text("run_id,op\n" + "".join(f"{run},{op}\n" for run in (first, second, untraced)
                                               for op in ("read", "restore")))
    runs = sidecar_dir(archive)
    runs.mkdir()
    for run in (first, second):
        (runs / f"{run}.trace.npz").write_bytes(b"")
    assert find_trace(str(archive)).name == f"{second}.trace.npz"
