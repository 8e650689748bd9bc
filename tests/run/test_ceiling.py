"""run.ceiling under a real mpiexec, 4 ranks on one checkpoint of real files on a disk
that evicts: before the first layout, the node's raw-read ceiling is measured at 1, 4,
16 and 32 streams, in REPEATS rounds, each of the node's bytes read once per read from a
cold cache; the ceiling is the best stream count's median; the restore rows' efficiency
is the layout's storage GB/s per node over that ceiling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stampede.checkpoint.plan import SHARED_FILE
from stampede.filesystems import kind_for
from stampede.results.ceiling import REPEATS, STREAM_COUNTS
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi
NRANKS = 4


def _run(stampede, tmp_path: Path, ceiling: bool) -> tuple[list[dict[str, str]], dict]:
    job = small_job(tmp_path, checkpoint={"layout": ["shared", "sharded"]},
                    run={"cache": "cold", "ceiling": ceiling, "iterations": 1})
    for step in ("prepare", "run"):
        result = stampede(step, str(job), np=NRANKS)
        assert result.returncode == 0, result.stdout + result.stderr
    archive = tmp_path / "results" / "job.csv"
    rows = read_archive(archive)
    sidecar = json.loads((archive.parent / "job.runs" / f"{rows[0]['run_id']}.json").read_text())
    return rows, sidecar


def test_the_ceiling_reads_the_node_share_cold_at_every_stream_count(stampede,
                                                                      tmp_path: Path) -> None:
    kind, _ = kind_for(tmp_path)
    if not kind.evictable:   # a memory file system: nothing a cold read could mean
        pytest.skip(f"the test's directory is on {kind.name}: {kind.unevictable}")
    rows, sidecar = _run(stampede, tmp_path, ceiling=True)
    # the first layout's files (shared: one file), as they lie on the disk
    first_layout_bytes = (tmp_path / "ckpt" / SHARED_FILE).stat().st_size
    assert first_layout_bytes == 16 * 2**20
    [node] = sidecar["ceiling"]["nodes"]   # every rank on this one host
    assert sidecar["ceiling"]["messages"] == []
    # rounds of every stream count, in order
    assert [read["streams"] for read in node["reads"]] == list(STREAM_COUNTS) * REPEATS
    for read in node["reads"]:
        # one node owns every byte: each read read all of it, once
        assert read["bytes_asked"] == read["bytes_read"] == first_layout_bytes, read
        assert read["resident_bytes_before"] == 0, read   # evicted, as mincore saw it
        assert read["seconds"] > 0
        assert read["gbps"] == pytest.approx(read["bytes_read"] / read["seconds"] / 1e9)
    # each stream count's median read (REPEATS is odd: the middle one), the best of those
    medians = [sorted((read for read in node["reads"] if read["streams"] == streams),
                      key=lambda read: read["gbps"])[REPEATS // 2] for streams in STREAM_COUNTS]
    best = max(medians, key=lambda read: read["gbps"])
    assert node["gbps"] == best["gbps"] and node["best_streams"] == best["streams"]
    restores = {row["layout"]: row for row in rows if row["op"] == "restore"}
    assert set(restores) == {"shared", "sharded"}
    for layout, row in restores.items():
        assert row["ceiling"] == "true"
        assert float(row["ceiling_gbps"]) == float(row["ceiling_gbps_max"]) == \
            pytest.approx(node["gbps"]), layout
        per_node_gbps = float(row["storage_bytes_per_iteration"]) / int(row["nnodes"]) \
            / float(row["storage_s"]) / 1e9
        assert float(row["ceiling_efficiency"]) == pytest.approx(per_node_gbps / node["gbps"])
    # the other ops' rows carry no efficiency: it is the restore's
    assert {row["ceiling_efficiency"] for row in rows if row["op"] != "restore"} == {""}
    # the terminal's restore table and the HTML summary say each layout's, as archived
    said = {layout: f"{float(row['ceiling_efficiency']):.2f}x" for layout, row in restores.items()}
    page = tmp_path / "report.html"
    report = stampede("report", str(tmp_path / "results" / "job.csv"), "--html", str(page))
    assert report.returncode == 0, report.stdout + report.stderr
    assert all(f"{layout} {text}" in report.stdout.replace("\n", " ")
               for layout, text in said.items()), report.stdout
    summary = page.read_text().split('id="summary"')[1].split("</table>")[0]
    assert "of the raw-read ceiling" in summary
    assert all(f"<td>{text}</td>" in summary for text in said.values()), summary
    # and the verdict's ranking, terminal and HTML, each layout's beside its amplification
    terminal, html = " ".join(report.stdout.split()), " ".join(page.read_text().split())
    for layout, text in said.items():
        beside = f"the needed bytes, {text} the raw-read ceiling"
        assert f"{layout} " in terminal and beside in terminal, terminal
        assert beside in html, layout


def test_without_run_ceiling_nothing_is_measured(stampede, tmp_path: Path) -> None:
    rows, sidecar = _run(stampede, tmp_path, ceiling=False)
    assert "ceiling" not in sidecar
    assert {(row["ceiling"], row["ceiling_gbps"], row["ceiling_efficiency"]) for row in rows} \
        == {("false", "", "")}
    page = tmp_path / "report.html"
    report = stampede("report", str(tmp_path / "results" / "job.csv"), "--html", str(page))
    assert report.returncode == 0, report.stdout + report.stderr
    assert "raw-read ceiling" not in report.stdout + page.read_text()


def test_an_object_store_target_is_refused_before_any_io(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, target={"path": "s3://bucket/ckpt"}, run={"ceiling": True})
    result = stampede("plan", str(job))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "run.ceiling = true" in result.stderr and "POSIX" in result.stderr
    assert not (tmp_path / "results").exists()
