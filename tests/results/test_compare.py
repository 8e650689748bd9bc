"""`stampede compare` and `stampede sweep` on real runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.results.compare import Comparison, compare_rows
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi


def row(**values: str) -> dict[str, str]:
    base = {"layout": "shared", "op": "restore", "nranks": "2", "cache": "warm",
            "agg_gbps": "10", "agg_gbps_min": "9", "agg_gbps_max": "11",
            "time_to_last_rank_s": "0.5", "time_to_last_rank_min_s": "0.45",
            "time_to_last_rank_max_s": "0.55"}
    return {**base, **values}


def test_ratios_and_spread_marks() -> None:
    same = compare_rows([row()], [row(agg_gbps="10.5", agg_gbps_min="10", agg_gbps_max="12")])
    assert {c.metric: c.verdict for c in same} == {"agg_gbps": "within spread",
                                                   "time_to_last_rank_s": "within spread"}
    faster = compare_rows([row()], [row(agg_gbps="20", agg_gbps_min="19", agg_gbps_max="21",
                                        time_to_last_rank_s="0.25",
                                        time_to_last_rank_min_s="0.24",
                                        time_to_last_rank_max_s="0.26")])
    by_metric = {c.metric: c for c in faster}
    assert by_metric["agg_gbps"].ratio == pytest.approx(2.0)
    assert by_metric["agg_gbps"].verdict == "better"
    assert by_metric["time_to_last_rank_s"].verdict == "better"  # lower is better
    assert compare_rows([row()], [row(nranks="4")]) == []        # not the same configuration
    p99 = Comparison((), "lat_p99_s", 1e-3, 1.3e-3, None, False)
    assert p99.verdict == "worse?"


def test_sweep_then_compare_two_real_archives(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, run={"verify": "none"})
    first = stampede("sweep", str(job), "--ranks", "1,2", "--clean")
    assert first.returncode == 0, first.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["nranks"] for row in rows} == {"1", "2"}
    assert len({row["run_id"] for row in rows}) == 2
    assert not (tmp_path / "ckpt" / "stampede-manifest.json").exists()
    other = tmp_path / "other.csv"
    second = stampede("sweep", str(job), "--ranks", "2", "--set", f"archive.path={other}")
    assert second.returncode == 0, second.stderr
    compared = stampede("compare", str(tmp_path / "results" / "job.csv"), str(other))
    assert compared.returncode == 0, compared.stderr
    assert "time_to_last_rank_s" in compared.stdout and "B / A" in compared.stdout
    grouped = stampede("compare", str(other), "--by", "layout")
    assert grouped.returncode == 0 and "A = layout shared, B = layout sharded" in grouped.stdout


def test_bad_compare_and_sweep_input_exit_2(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path)
    for args, message in [
        (("sweep", str(job), "--ranks", "1,x"), "--ranks '1,x': must be distinct rank counts"),
        (("sweep", str(job), "--ranks", "2", "--set", "checkpoint.replicas=4"),
         "checkpoint.replicas = 4 does not divide 2 ranks"),
        (("compare", str(job)), "compare takes two archives"),
        (("compare", str(tmp_path / "none.csv"), "--by", "layout"), "cannot read the archive"),
    ]:
        result = stampede(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr
    assert not (tmp_path / "ckpt").exists()


DATA = Path(__file__).parents[1] / "data"


def test_ior_and_mdtest_results_sit_beside_stampede_runs(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "mixed.csv"
    job = small_job(tmp_path, checkpoint={"layout": "sharded", "block_size": "4MiB"},
                    run={"verify": "none"}, archive={"path": str(archive)})
    assert stampede("prepare", str(job), np=2).returncode == 0
    assert stampede("run", str(job), np=2).returncode == 0
    for tool, result in (("ior", "ior-summary.json"), ("mdtest", "mdtest-output.txt")):
        imported = stampede("import", tool, str(DATA / result), "--archive", str(archive),
                            "--cache", "warm")
        assert imported.returncode == 0, imported.stderr
    rows = read_archive(archive)
    ior = next(row for row in rows if row["backend"] == "ior")
    # 17,556.1 MiB/s is 18.41 GB/s: IOR's binary units become stampede's decimal GB/s
    assert float(ior["agg_gbps"]) == pytest.approx(17556.1 * 2**20 / 1e9)
    assert (ior["layout"], ior["op"], ior["nranks"], ior["block_bytes"]) == \
        ("sharded", "read", "2", "4194304")
    assert ior["lat_p50_s"] == ""  # IOR has no percentiles: none invented
    mdtest = {row["op"]: row for row in rows if row["backend"] == "mdtest"}
    assert float(mdtest["stat"]["ops_per_s"]) == pytest.approx(456789.012)
    assert "file_creation" in mdtest and "tree_removal" in mdtest
    assert len({row["run_id"] for row in mdtest.values()}) == 1
    compared = stampede("compare", str(archive), "--by", "job", "--match", "op,layout,nranks,cache")
    assert compared.returncode == 0, compared.stderr
    assert "A = job job, B = job ior" in compared.stdout and "agg_gbps" in compared.stdout
    assert stampede("report", str(archive)).returncode == 0


def test_import_refuses_what_is_not_the_tools_output(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "a.csv"
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"tests": []}')
    result = stampede("import", "ior", str(wrong), "--archive", str(archive))
    assert result.returncode == 2 and "not IOR's JSON summary" in result.stderr
    result = stampede("import", "mdtest", str(DATA / "ior-summary.json"), "--archive", str(archive))
    assert result.returncode == 2 and "not mdtest output" in result.stderr
    assert not archive.exists()
