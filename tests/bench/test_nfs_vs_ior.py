"""bench/nfs_vs_ior.py's reading of IOR: on IOR 4.1's real JSON summary (tests/data), its
read GB/s is the median of the repetitions' own results, never the summary of all tests
(its max once entered the median as a fourth "read" line of IOR's text output)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

# The benches import their helpers as `common`, from bench/ on sys.path as when run.
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from nfs_vs_ior import ior_read_gbps  # noqa: E402

IOR = Path(__file__).parents[1] / "data" / "ior-4.1-read-F-n2-warm.json"   # -r -i 3, 2 tasks
MIB_GB = 2**20 / 1e9
REPETITIONS_MIB = (12908.9254, 11907.3116, 9092.9666)   # each repetition's bwMiB, in order
SUMMARY_MIB = {"bwMaxMIB": 12908.9254, "bwMinMIB": 9092.9666, "bwMeanMIB": 11303.0679}


def written(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(document))
    return path


def test_the_real_files_repetitions_and_summary_are_what_the_test_assumes() -> None:
    document = json.loads(IOR.read_text())
    (test,) = document["tests"]
    assert [(r["access"], r["bwMiB"]) for r in test["Results"]] == \
        [("read", mib) for mib in REPETITIONS_MIB]
    (summary,) = document["summary"]
    assert {field: summary[field] for field in SUMMARY_MIB} == SUMMARY_MIB


def test_ior_read_is_the_median_of_its_repetitions_not_its_summary() -> None:
    gbps = ior_read_gbps(IOR)
    assert gbps == pytest.approx(11907.3116 * MIB_GB, rel=1e-12)
    # the summary's max entering the median (the old text parser) would have given
    assert gbps != pytest.approx((12908.9254 + 11907.3116) / 2 * MIB_GB)


def test_the_summary_entry_changes_nothing_and_each_repetition_counts(tmp_path: Path) -> None:
    document = json.loads(IOR.read_text())
    document["summary"][0].update(bwMaxMIB=1e6, bwMinMIB=1e6, bwMeanMIB=1e6)
    assert ior_read_gbps(written(tmp_path, document)) == pytest.approx(11907.3116 * MIB_GB)
    document["tests"][0]["Results"][1]["bwMiB"] = 1.0   # the median repetition, now the lowest
    assert ior_read_gbps(written(tmp_path, document)) == pytest.approx(9092.9666 * MIB_GB)


def test_a_summary_without_its_repetitions_is_refused_not_read_as_its_mean(tmp_path: Path) -> None:
    document = json.loads(IOR.read_text())
    del document["tests"][0]["Results"]
    with pytest.raises(SystemExit, match="no per-repetition results"):
        ior_read_gbps(written(tmp_path, document))


def test_a_summary_without_a_read_is_refused(tmp_path: Path) -> None:
    document = json.loads(IOR.read_text())
    document["summary"][0]["operation"] = "write"
    with pytest.raises(SystemExit, match="0 read results"):
        ior_read_gbps(written(tmp_path, document))
