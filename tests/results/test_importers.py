"""The importers on real peer output: IOR 4.1's JSON summary and mdtest 4.1's standard
output, both run at 2 ranks on one node of this kind of machine (tests/data). Where an
older layout is tested, it is the real file rewritten the way that version prints it
(mdtest 3's colons, IOR 3's nested repetitions: hpc/ior's source at those tags)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from stampede.errors import UsageError
from stampede.results.importers import ior_rows, mdtest_rows

DATA = Path(__file__).parents[1] / "data"
IOR = DATA / "ior-4.1-read-F-n2-warm.json"      # ior -r -F -t 4m -b 1g -i 3, 2 tasks
MDTEST = DATA / "mdtest-4.1-n2-CTr.txt"          # mdtest -F -C -T -r -n 1000 -i 3, 2 tasks
MIB_GB = 2**20 / 1e9


def ior_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(IOR.read_text())
    return document


def test_ior_columns_mean_what_stampedes_mean() -> None:
    (row,) = ior_rows(ior_document(), "ior", "warm", str(IOR))
    assert (row["layout"], row["op"], row["nranks"], row["nnodes"], row["ranks_per_node"]) == \
        ("sharded", "read", 2, 1, 2)
    assert (row["block_bytes"], row["bytes_per_rank"], row["bytes_total"]) == (4 * 2**20, 2**30, 2**31)
    # count is stampede's samples, one per read of block_bytes: IOR's transfers, not its
    # repetition count (blockSize / transferSize x segmentCount x numTasks x repetitions)
    assert row["count"] == 256 * 1 * 2 * 3 and row["iterations"] == 3
    assert row["op_bytes"] == row["count"] * 4 * 2**20
    # the median of the three repetitions (12908.9254, 11907.3116, 9092.9666 MiB/s), as
    # stampede's is over iterations: not IOR's mean (11303.0679)
    assert row["agg_gbps"] == pytest.approx(11907.3116 * MIB_GB)
    assert (row["agg_gbps_min"], row["agg_gbps_max"]) == \
        pytest.approx((9092.9666 * MIB_GB, 12908.9254 * MIB_GB))
    assert row["ops_per_s"] == pytest.approx(2977.0920)
    assert row["elapsed_s"] == pytest.approx(0.1720)
    assert "lat_p50_s" not in row and "lat_p99_s" not in row  # IOR has none: none invented
    warnings = str(row["warnings"])
    assert "count = transfers" in warnings and "256 x 1 x 2 x 3" in warnings
    assert "median of IOR's 3 repetitions" in warnings
    assert row["cache"] == "warm" and row["pattern"] == "ior POSIX"


def test_ior_3_nests_each_repetition_in_a_list() -> None:
    document = ior_document()
    nested = copy.deepcopy(document)
    nested["tests"][0]["Results"] = [[result] for result in document["tests"][0]["Results"]]
    (flat,), (older,) = (ior_rows(doc, "ior", "warm", str(IOR)) for doc in (document, nested))
    assert {k: v for k, v in older.items() if k not in ("run_id", "timestamp")} == \
        {k: v for k, v in flat.items() if k not in ("run_id", "timestamp")}


def test_ior_without_every_repetition_falls_back_to_its_means_and_says_so() -> None:
    document = ior_document()
    document["tests"][0]["Results"] = document["tests"][0]["Results"][:1]
    (row,) = ior_rows(document, "ior", "warm", str(IOR))
    assert row["agg_gbps"] == pytest.approx(11303.0679 * MIB_GB)
    assert row["ops_per_s"] == pytest.approx(2825.7670) and row["elapsed_s"] == 0.1853
    assert "IOR's mean over repetitions, not a median" in str(row["warnings"])


def test_ior_entries_that_are_not_iors_are_one_error() -> None:
    document = ior_document()
    del document["summary"][0]["numTasks"]
    with pytest.raises(UsageError, match=r"ior-4\.1.*: summary\[0\]\.numTasks = 'missing': must "
                                         r"be a whole number >= 1"):
        ior_rows(document, "ior", "warm", str(IOR))
    with pytest.raises(UsageError, match="not IOR's JSON summary"):
        ior_rows({"tests": []}, "ior", "warm", "x.json")


def test_mdtest_4_rows_are_the_phases_that_ran() -> None:
    rows = {row["op"]: row for row in mdtest_rows(MDTEST.read_text(), "mdtest", "warm", str(MDTEST))}
    # -F: no directory rows printed; File read did not run (no -E): a row of zeros, no row
    assert set(rows) == {"file_creation", "stat", "file_removal", "tree_creation", "tree_removal"}
    stat = rows["stat"]
    assert (stat["ops_per_s"], stat["ops_per_s_min"], stat["ops_per_s_max"]) == \
        (1295013.314, 1242204.650, 1355844.189)
    assert (stat["nranks"], stat["nnodes"], stat["iterations"], stat["layout"]) == (2, 1, 3, "mdtest")
    assert stat["count"] == 2000 * 3  # "2 tasks, 2000 files", 3 iterations
    assert "count = 2000 files x 3 iterations" in str(stat["warnings"])
    assert "mean over 3 iteration(s), not a median" in str(stat["warnings"])
    assert rows["tree_creation"]["count"] is None  # mdtest does not say how many
    assert len({row["run_id"] for row in rows.values()}) == 1  # one import is one run


def test_mdtest_3_colons_and_per_rank_columns_read_the_same() -> None:
    text = MDTEST.read_text()
    expected = [(row["op"], row["ops_per_s"], row["count"])
                for row in mdtest_rows(text, "m", "warm", "4.1")]
    row_line = re.compile(r"^(   [A-Z][a-z]+ [a-z]+)( +)", re.MULTILINE)
    mdtest_3 = row_line.sub(r"\1 :\2", text.replace("SUMMARY rate (in ops/sec):", "SUMMARY rate:"))
    assert "   File stat :                 1355844.189" in mdtest_3
    per_rank = row_line.sub(r"\1\2 1.000 2.000 3.000    ", text)  # -P: per-rank max min mean first
    for variant in (mdtest_3, per_rank):
        assert [(row["op"], row["ops_per_s"], row["count"])
                for row in mdtest_rows(variant, "m", "warm", "variant")] == expected


def test_mdtest_with_several_rank_counts_gives_each_its_rows() -> None:
    text = MDTEST.read_text()
    start, end = text.index("2 tasks, 2000 files"), text.index("-- finished")
    one_task = text[start:end].replace("2 tasks, 2000 files", "1 tasks, 1000 files")
    rows = mdtest_rows(text[:start] + one_task + text[start:], "m", "warm", "mdtest -f 1 -l 2")
    stats = [(row["nranks"], row["count"]) for row in rows if row["op"] == "stat"]
    assert stats == [(1, 3000), (2, 6000)]


def test_what_is_not_mdtest_output_is_one_error() -> None:
    with pytest.raises(UsageError, match="not mdtest output"):
        mdtest_rows(IOR.read_text(), "m", "warm", str(IOR))
    text = MDTEST.read_text()
    zeros = re.sub(r"\d+\.\d{3}", "0.000", text[text.index("SUMMARY rate"):])
    with pytest.raises(UsageError, match="no operation that ran"):
        mdtest_rows(text[:text.index("SUMMARY rate")] + zeros, "m", "warm", "zeros.txt")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("transferSize", -1, "summary[0].transferSize = -1: must be a whole number >= 1"),
    ("transferSize", 0, "summary[0].transferSize = 0: must be a whole number >= 1"),
    ("blockSize", 1000, "summary[0].blockSize = 1000: not a multiple of transferSize (4194304)"),
    ("numTasks", "2", "summary[0].numTasks = '2': must be a whole number >= 1"),
    ("tasksPerNode", 3, "summary[0].tasksPerNode = 3: more than numTasks (2)"),
    ("filePerProc", 2, "summary[0].filePerProc = 2: must be 0 or 1"),
    ("operation", "stat", "summary[0].operation = 'stat': must be \"read\" or \"write\""),
    ("repetitions", True, "summary[0].repetitions = True: must be a whole number >= 1")])
def test_ior_fields_that_cannot_be_are_refused_naming_the_field(field: str, value: object,
                                                                says: str) -> None:
    """Once imported, exit 0: transferSize -1 gave count = -6,442,450,944."""
    document = ior_document()
    document["summary"][0][field] = value
    with pytest.raises(UsageError) as refused:
        ior_rows(document, "ior", "warm", "ior.json")
    assert str(refused.value) == f"ior.json: {says}"


def test_an_ior_repetition_with_a_negative_rate_is_refused() -> None:
    document = ior_document()
    document["tests"][0]["Results"][0]["bwMiB"] = -5.0
    with pytest.raises(UsageError, match=r"Results\[0\]\.bwMiB = -5\.0: must be a finite number"):
        ior_rows(document, "ior", "warm", "ior.json")


@pytest.mark.parametrize(("change", "says"), [
    (lambda text: text[:text.index("   File removal")], "the file ends inside a SUMMARY rate table"),
    (lambda text: text.replace("(of 3 iterations)", "(of 0 iterations)"),
     "the iterations must be at least 1"),
    (lambda text: text.replace("2 tasks, 2000 files", "2 tasks, 0 files"),
     "the items must be at least 1"),
    (lambda text: text.replace("1242204.650", "n/a"), "not a row of mdtest's rate table"),
    (lambda text: text.replace("1242204.650", "1.2.3"), "not a row of mdtest's rate table"),
    (lambda text: text.replace("1355844.189", "1.189"), "must be max >= mean >= min >= 0")])
def test_mdtest_output_that_cannot_be_fully_parsed_is_refused_naming_the_line(change: Any,
                                                                            says: str) -> None:
    """Once imported, exit 0: a file cut inside its summary gave 1 row; "of 0 iterations"
    rows of count 0."""
    with pytest.raises(UsageError) as refused:
        mdtest_rows(change(MDTEST.read_text()), "mdtest", "warm", "md.txt")
    assert str(refused.value).startswith("md.txt: line ") and says in str(refused.value)

