"""The terminal report: readable at 80 columns (the layouts' names whole, no line wider),
ties said in compare's words, warnings said once, progress on rank 0 under mpiexec."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stampede.present.report import make_console, render_archive
from stampede.results.archive import append_rows
from stampede.results.archived import Archive
from tests.helpers.jobs import small_job


def restore(layout: str, median: float, low: float, high: float, warnings: str) -> dict[str, object]:
    return {"run_id": "r1", "job": "j", "layout": layout, "op": "restore", "valid": "true",
            "nranks": 4, "nnodes": 1, "ranks_per_node": 4, "backend": "posix",
            "cache": "warm", "iterations": 5, "timestamp": "2026-12-01T00:00:00+00:00",
            "time_to_last_rank_s": median, "time_to_last_rank_min_s": low,
            "time_to_last_rank_max_s": high, "first_done_s": low, "straggler_ratio": 1.1,
            "agg_gbps": 10.0, "slowest_rank_gbps": 2.5, "bytes_per_rank": 2**20,
            "block_bytes": 2**20, "warnings": warnings, "count": 20, "errors": 0}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    common = "cache=warm: reads may come from the page cache, not the storage"
    path = tmp_path / "a.csv"
    append_rows(path, [
        restore("shared", 0.231, 0.225, 0.240, common),
        restore("metadata-first", 0.142, 0.140, 0.146, common),
        restore("broadcast", 0.145, 0.139, 0.151, f"{common} | only here"),
        restore("list-bcast", 0.200, 0.190, 0.210, common)])
    return path


def rendered(path: Path, width: int) -> str:
    stream = io.StringIO()
    render_archive(Archive.open(path).rows, make_console(stream, width=width))
    return stream.getvalue()


def test_at_80_columns_every_line_fits_and_every_layout_is_whole(archive: Path) -> None:
    text = rendered(archive, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    table = text.split("Restore: time until every rank holds its bytes")[1]
    for layout in ("shared", "metadata-first", "broadcast", "list-bcast"):
        assert any(line.lstrip().startswith(layout + " ") for line in table.splitlines()), layout
    assert "142 (140-146) ms" in table   # the median and its spread, in one unit


def test_a_layout_name_never_folds_however_wide_the_numbers(tmp_path: Path) -> None:
    """On a narrow terminal (64 columns: at 66 the name folded before), numbers as wide
    as a loaded machine makes them: the layout column keeps its names whole (a test and a
    reader find 'metadata-first' on one line); the standing folds instead."""
    path = tmp_path / "a.csv"
    append_rows(path, [restore("metadata-first", 0.0129, 0.0128, 0.1129, ""),
                       restore("list-bcast", 0.1163, 0.0160, 0.1167, "")])
    table = rendered(path, 64).split("Restore: time until every rank holds its bytes")[1]
    assert max(len(line) for line in table.splitlines()) <= 64
    for layout in ("metadata-first", "list-bcast"):
        assert any(line.lstrip().startswith(layout + " ") for line in table.splitlines()), table


def test_overlapping_spreads_tie_and_the_others_say_how_much_slower(archive: Path) -> None:
    lines = {line.split()[0]: line for line in rendered(archive, 120).splitlines()
             if line.lstrip().startswith(("shared ", "metadata-first ", "broadcast ",
                                          "list-bcast "))}
    assert "best" in lines["metadata-first"]
    assert "tie (within spread)" in lines["broadcast"]
    assert "+63%" in lines["shared"] and "+41%" in lines["list-bcast"]


def test_a_warning_every_layout_has_is_said_once(archive: Path) -> None:
    text = rendered(archive, 120)
    assert text.count("reads may come from the page cache") == 1
    assert "broadcast: warning: only here" in text


def test_the_same_warning_of_several_layouts_is_one_line(tmp_path: Path) -> None:
    """A warning two layouts have with their own figures is said once, naming both and
    whose figures it shows; one that only one layout has keeps its layout's name."""
    varies = "time to last rank varies {}% across iterations ({}-{} s): run more iterations"
    path = tmp_path / "a.csv"
    append_rows(path, [
        restore("shared", 0.2, 0.1, 0.3, varies.format(111, 0.1, 0.3)),
        restore("sharded", 0.2, 0.1, 0.4, f"{varies.format(160, 0.1, 0.4)} | only sharded"),
        restore("broadcast", 0.2, 0.2, 0.2, "")])
    lines = [line for line in rendered(path, 200).splitlines() if "warning:" in line]
    assert lines == [f"shared, sharded: warning: {varies.format(111, 0.1, 0.3)} (figures: "
                     "shared's; each layout's in its table)", "sharded: warning: only sharded"]


@pytest.mark.mpi
def test_rank_0_says_how_far_a_run_is_in_a_batch_log(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"iterations": 2})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("stampede: ")]
    assert any(line.startswith("stampede: shared (1/2): iteration 2 of 2 took") for line in progress)
    assert any(line.startswith("stampede: sharded (2/2): iteration 2 of 2 took") for line in progress)
    assert all("elapsed" in line and "ETA" in line for line in progress)


def test_a_run_is_reported_as_recorded_with_the_sidecars_facts(tmp_path: Path) -> None:
    """RunReport (a Recorder's show): the header once, each layout, the NFS target's RPCs
    per op and a kernel NFS mount's RPCs from the sidecar beside the rows; then the
    summary and where it was archived."""
    from stampede.present.report import RunReport
    from stampede.results.cells import cell, typed

    stream = io.StringIO()
    report = RunReport(make_console(stream, width=120))
    # as the Recorder shows them: archived cells, typed as a reader gets them
    rows = [typed({key: cell(value) for key, value in {**restore(layout, 0.1, 0.09, 0.11, ""),
                                                       "phase": "restore",
                                                       "slowest_ranks": ""}.items()})
            for layout in ("shared", "sharded")]
    counted = {"mount": "/mnt", "scope": "rank 0's node",
               "ops": {"READ": {"ops": 10, "transmissions": 10, "timeouts": 0, "rtt_ms": 100,
                                "execute_ms": 120}}}
    sidecar = {"storage": {"rpcs_per_op": {"how": "counted", "ops": {"read": [[2, "READ"]]}}},
               "layouts": {"shared": {"kernel_nfs_rpcs": "not counted: not NFS"},
                           "sharded": {"kernel_nfs_rpcs": counted}}}
    report.show(rows[:1], sidecar)
    report.show(rows[1:], sidecar)
    report.finish(rows, ["rank 1: boom"], "archived: a.csv (+ a.runs/r1.json)")
    text = stream.getvalue()
    assert text.count("NFS RPCs per op (counted):") == 1 and "read    2: 2 x READ" in text
    assert text.index("shared: latency per op") < text.index("sharded: latency per op") \
        < text.index("sharded: kernel NFS RPCs on /mnt (rank 0's node): READ 10") \
        < text.index("Restore: time until every rank holds its bytes") \
        < text.index("error: rank 1: boom") < text.index("archived: a.csv (+ a.runs/r1.json)")
    assert "shared: kernel NFS" not in text


def test_a_layouts_file_system_lines_on_real_lustre_text() -> None:
    """A Lustre client's llite counters around a layout and a file's layout read back, as
    the sidecar keeps them (parsed from real clients' text), one line each."""
    from pathlib import Path

    from stampede.lustre import llite_delta, parse_getstripe, parse_llite_stats
    from stampede.present.report import render_file_system

    data = Path(__file__).parents[1] / "data" / "lustre"
    before = parse_llite_stats((data / "llite-stats-ffff88105db50000.txt").read_text())
    after = parse_llite_stats((data / "llite-stats-ffff88082d691000.txt").read_text())
    got = parse_getstripe((data / "getstripe-file-expanse.txt").read_text())
    entry = {"lustre_llite": {"mount": "/lustre", "scope": "rank 0's node",
                              "ops": llite_delta(before, after)},
             "file_layouts": {"how": "lfs setstripe", "files": {"/lustre/ck/a": got}}}
    stream = io.StringIO()
    render_file_system("shared", entry, make_console(stream, width=400))
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("shared: Lustre llite on /lustre (rank 0's node): getxattr "
                               "102494915, write_bytes 13016805 (12.41 TiB), statfs 57491, ")
    assert "read_bytes 46317 (" in lines[0] and lines[0].endswith("unlink 20, readdir 18")
    assert lines[1] == ("shared: /lustre/ck/a: stripe_count=4 stripe_size=1048576 "
                        "pattern=raid0 layout_gen=0 stripe_offset=52 osts=52,15,5,53 "
                        "(lfs setstripe)")
