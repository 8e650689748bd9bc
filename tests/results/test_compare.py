"""`stampede compare` and `stampede sweep` on real runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from stampede.results.archived import Archive
from stampede.results.cells import Row, typed
from stampede.results.compare import Comparison, Side, compare_rows, within_spread
from tests.helpers.jobs import read_archive, small_job

DATA = Path(__file__).parents[1] / "data"
IOR = DATA / "ior-4.1-read-F-n2-warm.json"      # real IOR 4.1: ior -r -F -t 4m -b 1g -i 3, 2 tasks
MDTEST = DATA / "mdtest-4.1-n2-CTr.txt"          # real mdtest 4.1: -F -C -T -r -n 1000 -i 3, 2 tasks


def row(run: str = "r1", **values: str) -> Row:
    base = {"run_id": run, "layout": "shared", "op": "restore", "nranks": "2", "cache": "warm",
            "valid": "true",
            "agg_gbps": "10", "agg_gbps_min": "9", "agg_gbps_max": "11",
            "time_to_last_rank_s": "0.5", "time_to_last_rank_min_s": "0.45",
            "time_to_last_rank_max_s": "0.55"}
    return typed({**base, **values})


def test_within_spread_is_overlap_of_the_two_ranges() -> None:
    """The rule compare's verdicts and the report's ranking share: ranges that overlap or
    touch tie, in either order; disjoint ones do not; a missing bound (NaN) ties nothing."""
    assert within_spread(1.0, 3.0, 2.0, 4.0) and within_spread(2.0, 4.0, 1.0, 3.0)
    assert within_spread(1.0, 2.0, 2.0, 3.0)                # touching
    assert within_spread(1.0, 4.0, 2.0, 3.0)                # one inside the other
    assert not within_spread(1.0, 2.0, 2.5, 3.0) and not within_spread(2.5, 3.0, 1.0, 2.0)
    assert not within_spread(math.nan, 3.0, 2.0, 4.0) and not within_spread(1.0, 3.0, 2.0, math.nan)


def test_one_run_a_side_is_judged_on_its_iterations_and_says_n1() -> None:
    same = compare_rows([row()], [row(agg_gbps="10.5", agg_gbps_min="10", agg_gbps_max="12")])
    assert {c.metric: c.verdict for c in same} == {"agg_gbps": "within spread (n=1)",
                                                   "time_to_last_rank_s": "within spread (n=1)"}
    faster = compare_rows([row()], [row(agg_gbps="20", agg_gbps_min="19", agg_gbps_max="21",
                                        time_to_last_rank_s="0.25",
                                        time_to_last_rank_min_s="0.24",
                                        time_to_last_rank_max_s="0.26")])
    by_metric = {c.metric: c for c in faster}
    assert by_metric["agg_gbps"].ratio == pytest.approx(2.0)
    assert by_metric["agg_gbps"].verdict == "better (n=1)"
    assert by_metric["time_to_last_rank_s"].verdict == "better (n=1)"  # lower is better
    assert compare_rows([row()], [row(nranks="4")]) == []               # not the same configuration
    one = Side((1e-3,), math.nan, math.nan)
    p99 = Comparison((), "lat_p99_s", one, Side((1.3e-3,), math.nan, math.nan), False)
    assert (p99.judged_by, p99.verdict) == ("direction", "worse? (n=1)")


def test_every_run_counts_not_the_latest_alone() -> None:
    # Seven runs a side whose medians agree within 5%; B's last run is noisy (18.6 GB/s,
    # a narrow spread of its own): the latest alone said B / A = 1.86, "better".
    a = [10.0, 10.2, 9.9, 10.1, 10.3, 9.8, 10.0]
    b = [10.1, 9.9, 10.2, 10.0, 10.4, 9.7, 18.6]
    base = [row(f"a{i}", agg_gbps=str(v), agg_gbps_min=str(v - 0.1), agg_gbps_max=str(v + 0.1))
            for i, v in enumerate(a)]
    other = [row(f"b{i}", agg_gbps=str(v), agg_gbps_min=str(v - 0.1), agg_gbps_max=str(v + 0.1))
             for i, v in enumerate(b)]
    gbps = next(c for c in compare_rows(base, other) if c.metric == "agg_gbps")
    assert (gbps.base.n, gbps.other.n) == (7, 7)
    assert (gbps.base.median, gbps.other.median) == (10.0, 10.1)
    assert gbps.ratio == pytest.approx(1.01)
    assert (gbps.other.low, gbps.other.high) == (9.7, 18.6)
    assert (gbps.other.iteration_low, gbps.other.iteration_high) == pytest.approx((9.6, 18.7))
    assert (gbps.judged_by, gbps.verdict) == ("runs", "within spread")
    # runs that do not overlap are a verdict, without "(n=1)"; p99 is judged by runs too
    slower = [row(f"c{i}", agg_gbps=str(v / 2), lat_p99_s=str(v)) for i, v in enumerate(a)]
    base_p99 = [typed({**r, "lat_p99_s": "1", "op": "read"}) for r in base]
    verdicts = {c.metric: c.verdict for c in compare_rows(
        base_p99, [{**r, "op": "read"} for r in slower])}
    assert verdicts == {"agg_gbps": "worse", "lat_p99_s": "worse", "time_to_last_rank_s": "within spread"}
    # invalid runs do not count
    invalid = [*other, row("bad", agg_gbps="99", valid="false")]
    assert next(c for c in compare_rows(base, invalid) if c.metric == "agg_gbps").other.n == 7


@pytest.mark.mpi
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
    again = stampede("run", str(job), "--set", f"archive.path={other}", np=2)
    assert again.returncode == 0, again.stderr
    compared = stampede("compare", str(tmp_path / "results" / "job.csv"), str(other))
    assert compared.returncode == 0, compared.stderr
    assert "time_to_last_rank_s" in compared.stdout and "B / A" in compared.stdout
    assert "n=1" in compared.stdout and "n=2" in compared.stdout and "(n=1)" in compared.stdout
    # B's two runs both count: its value is their median, its range theirs
    base, theirs = (Archive.open(path).rows for path in (tmp_path / "results" / "job.csv", other))
    restores = [row for row in theirs if row["op"] == "restore" and row["layout"] == "shared"]
    ttlr = next(c for c in compare_rows(base, theirs)
                if c.metric == "time_to_last_rank_s" and dict(c.key)["layout"] == "shared")
    values = sorted(float(row["time_to_last_rank_s"]) for row in restores)
    assert (ttlr.base.n, ttlr.other.n) == (1, 2) and ttlr.verdict.endswith("(n=1)")
    assert ttlr.other.median == pytest.approx(sum(values) / 2)
    assert (ttlr.other.low, ttlr.other.high) == (values[0], values[1])
    grouped = stampede("compare", str(other), "--by", "layout")
    assert grouped.returncode == 0 and "A = layout shared, B = layout sharded" in grouped.stdout
    table = grouped.stdout.split("\nA, B: ")[0]  # above the footnote
    assert "n=2" in table and "n=1" not in table  # two runs a side: judged by their runs


@pytest.mark.mpi
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


@pytest.mark.mpi
def test_ior_and_mdtest_results_sit_beside_stampede_runs(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "mixed.csv"
    job = small_job(tmp_path, checkpoint={"layout": "sharded", "block_size": "4MiB"},
                    run={"verify": "none"}, archive={"path": str(archive)})
    assert stampede("prepare", str(job), np=2).returncode == 0
    assert stampede("run", str(job), np=2).returncode == 0
    for tool, result in (("ior", IOR), ("mdtest", MDTEST)):
        imported = stampede("import", tool, str(result), "--archive", str(archive),
                            "--cache", "warm")
        assert imported.returncode == 0, imported.stderr
    rows = read_archive(archive)
    ior = next(row for row in rows if row["backend"] == "ior")
    # the median repetition, 11,907.3116 MiB/s, is 12.49 GB/s: IOR's binary units become
    # stampede's decimal GB/s
    assert float(ior["agg_gbps"]) == pytest.approx(11907.3116 * 2**20 / 1e9)
    assert (ior["layout"], ior["op"], ior["nranks"], ior["block_bytes"], ior["count"]) == \
        ("sharded", "read", "2", "4194304", "1536")
    assert ior["lat_p50_s"] == ""  # IOR has no percentiles: none invented
    mdtest = {row["op"]: row for row in rows if row["backend"] == "mdtest"}
    assert float(mdtest["stat"]["ops_per_s"]) == pytest.approx(1295013.314)
    assert set(mdtest) == {"file_creation", "stat", "file_removal", "tree_creation", "tree_removal"}
    assert len({row["run_id"] for row in mdtest.values()}) == 1
    compared = stampede("compare", str(archive), "--by", "job", "--match", "op,layout,nranks,cache")
    assert compared.returncode == 0, compared.stderr
    assert "A = job job, B = job ior" in compared.stdout and "agg_gbps" in compared.stdout
    assert stampede("report", str(archive)).returncode == 0


@pytest.mark.mpi
def test_mdtest_stat_rows_pair_with_a_stat_storm(stampede, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "stampede.csv", tmp_path / "mdtest.csv"
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, pattern={"ops": ["stat"],
                    "stat_count": 100}, run={"verify": "none", "iterations": 3, "cache": "warm"},
                    archive={"path": str(ours)})
    assert stampede("prepare", str(job), np=2).returncode == 0
    for _ in range(2):
        result = stampede("run", str(job), np=2)
        assert result.returncode == 0, result.stderr
    imported = stampede("import", "mdtest", str(MDTEST), "--archive", str(theirs), "--cache", "warm")
    assert imported.returncode == 0, imported.stderr
    compared = stampede("compare", str(ours), str(theirs), "--match", "op,nranks,cache")
    assert compared.returncode == 0, compared.stderr
    assert "stat" in compared.stdout and "ops_per_s" in compared.stdout
    (stat,) = compare_rows(Archive.open(ours).rows, Archive.open(theirs).rows,
                           match=("op", "nranks", "cache"))
    assert (dict(stat.key), stat.metric) == ({"op": "stat", "nranks": "2", "cache": "warm"},
                                             "ops_per_s")
    assert (stat.base.n, stat.other.n, stat.other.median) == (2, 1, 1295013.314)
    assert (stat.other.iteration_low, stat.other.iteration_high) == (1242204.650, 1355844.189)
    assert stat.verdict.endswith("(n=1)")
    # one archive holding both, grouped by the tool that measured
    both = tmp_path / "both.csv"
    both.write_text(ours.read_text() + "".join(theirs.read_text().splitlines(True)[1:]))
    grouped = stampede("compare", str(both), "--by", "backend", "--match", "op,nranks,cache")
    assert grouped.returncode == 0 and "A = backend posix, B = backend mdtest" in grouped.stdout


def test_a_garbage_cell_is_one_line_naming_it(stampede, tmp_path: Path) -> None:
    archive, garbled = tmp_path / "mdtest.csv", tmp_path / "garbled.csv"
    for _ in range(2):  # two runs: the garbage is in the earlier one, which counts too
        assert stampede("import", "mdtest", str(MDTEST), "--archive", str(archive)).returncode == 0
    lines = archive.read_text().splitlines(True)
    assert "1295013.314" in lines[2]  # line 3: the first run's stat row
    garbled.write_text("".join([*lines[:2], lines[2].replace("1295013.314", "fast"), *lines[3:]]))
    result = stampede("compare", str(garbled), str(archive), "--match", "op,nranks")
    assert result.returncode == 2, result.stderr
    first, *rest = result.stderr.splitlines()
    assert first == (f"stampede compare: error: {garbled}, line 3: column ops_per_s = 'fast': "
                     "not a number; allowed: a number (in ops/s), or empty")
    assert [line for line in rest if not line.startswith("  hint:")] == []  # no traceback


def test_import_refuses_what_is_not_the_tools_output(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "a.csv"
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"tests": []}')
    result = stampede("import", "ior", str(wrong), "--archive", str(archive))
    assert result.returncode == 2 and "not IOR's JSON summary" in result.stderr
    result = stampede("import", "mdtest", str(IOR), "--archive", str(archive))
    assert result.returncode == 2 and "not mdtest output" in result.stderr
    assert not archive.exists()


def test_the_baseline_group_is_one_that_matches_another(stampede, tmp_path: Path) -> None:
    """A demo's archive starts with startup runs (layout "startup", matching no restore) and
    may hold rows without a layout: --by layout compares shared with sharded, not the
    first value seen with each (that once found no configuration on both sides)."""
    from stampede.results.archive import append_rows

    def row(run_id: str, op: str, layout: str, seconds: float) -> dict[str, object]:
        return {"run_id": run_id, "job": "demo", "op": op, "layout": layout, "nranks": 2,
                "cache": "warm", "backend": "posix", "valid": "true", "count": 2,
                "time_to_last_rank_s": seconds, "agg_gbps": 1.0 / seconds}

    archive = tmp_path / "demo.csv"
    append_rows(archive, [row("s1", "startup", "startup", 0.5), row("s2", "startup", "", 0.5),
                          row("r1", "restore", "shared", 0.2),
                          row("r1", "restore", "sharded", 0.1)])
    grouped = stampede("compare", str(archive), "--by", "layout")
    assert grouped.returncode == 0, grouped.stderr
    assert "A = layout shared, B = layout sharded" in grouped.stdout
    assert "layout  " not in grouped.stdout.split("A = layout shared")[0]
