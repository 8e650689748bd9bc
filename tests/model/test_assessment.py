"""The verdict says what to read it with before any number (stampede.model.assessment): a
measurement of the page cache, a band too wide for one answer, the T_MTTR terms assumed;
and no ratio a person reads is in e-notation. Archives built in memory from the model's
own synthetic runs (tests/model/test_project.py)."""

from __future__ import annotations

import re

from stampede.model.assessment import assess
from stampede.model.projection import WIDE_BAND
from stampede.results.archived import Archive
from tests.model.test_project import RANKS, TRUE, synthetic_rows

E_NOTATION = re.compile(r"\d[eE][-+]?\d")


def verdict_of(**changed: object) -> list[str]:
    """The terminal verdict of the synthetic sweep (shared and sharded at 1-128 ranks) with
    `changed` cells in every row."""
    rows = [{**row, **changed} for row in synthetic_rows(TRUE, RANKS)]
    return assess(Archive(rows), 16384).summary()


def test_a_cold_sweep_says_only_what_it_assumed() -> None:
    lines = verdict_of()
    cautions = [line for line in lines if line.startswith("read with care:")]
    # no startup run: the worked example's terms but the load, projected, and said so
    assert cautions == ["read with care: T_MTTR terms assumed, not measured: T_detect, "
                        "T_cordon_swap, T_pod_init, T_barrier_sync"]
    assert not any("page cache" in line or "band spans" in line for line in lines)
    assert lines[1] == cautions[0]   # under the workload, before any number
    assert not any(E_NOTATION.search(line) for line in lines), lines


def test_a_warm_sweep_says_it_measured_the_page_cache() -> None:
    lines = verdict_of(cache="warm")
    assert "read with care: restore measured with cache warm: the page cache answered, not " \
           "the storage (run.cache = cold measures it)" in lines


def test_a_band_too_wide_gives_its_ends_never_one_time() -> None:
    """Every run's slowest iteration 40x its median: the refit on the max iteration puts
    the band's high end far above its low end, and the verdict says between what."""
    rows = synthetic_rows(TRUE, RANKS)
    for row in rows:
        if row["op"] == "restore":
            row["time_to_last_rank_max_s"] = 40 * float(str(row["time_to_last_rank_s"]))
    assessment = assess(Archive(rows), 16384)
    verdict = assessment.phases["restore"]
    assert verdict.band_spread > WIDE_BAND and verdict.too_wide
    lines = assessment.summary()
    assert any("the band spans" in line and "no single time is the answer" in line
               for line in lines if line.startswith("read with care:")), lines
    (restore,) = [line for line in lines if line.startswith("restore: use")]
    assert "time to last rank between " in restore, restore


def test_the_ranking_says_each_layouts_read_amplification_beside_its_time() -> None:
    rows = [{**row, "read_amplification": "4.0" if row["layout"] == "sharded" else "1.0"}
            if row["op"] == "restore" else row for row in synthetic_rows(TRUE, RANKS)]
    assessment = assess(Archive(rows), 16384)
    lines = assessment.summary()
    (measured,) = [line for line in lines if line.startswith("    measured, best first: ")]
    said = dict(part.split(" ", 1) for part in measured.split(": ", 1)[1].split("; "))
    assert set(said) == {"shared", "sharded"}
    assert said["sharded"].endswith(", 4.0x the needed bytes"), said
    assert said["shared"].endswith(", 1.0x the needed bytes"), said
    # rows from before the column (schema < 7) say the time alone
    plain = assess(Archive(synthetic_rows(TRUE, RANKS)), 16384).phases["restore"]
    assert "the needed bytes" not in plain.measured_line() and "shared " in plain.measured_line()
    assert "ceiling" not in plain.measured_line()   # no run.ceiling: nothing said of it


def test_the_ranking_says_each_layouts_efficiency_against_the_raw_ceiling() -> None:
    """run.ceiling's efficiency (schema 8) after the amplification, in the verdict's
    line as in the restore table's note; a layout without one (its run did not measure
    it) says the rest alone."""
    efficiency = {"sharded": "0.934", "shared": ""}
    rows = [{**row, "read_amplification": "1.0", "ceiling_efficiency": efficiency[row["layout"]]}
            if row["op"] == "restore" else row for row in synthetic_rows(TRUE, RANKS)]
    verdict = assess(Archive(rows), 16384).phases["restore"]
    said = dict(part.split(" ", 1) for part in verdict.measured_line().split("; "))
    assert said["sharded"].endswith(", 1.0x the needed bytes, 0.93x the raw-read ceiling"), said
    assert said["shared"].endswith(", 1.0x the needed bytes"), said


def test_the_dominant_part_counts_the_reads_requests_as_the_metadata_servers() -> None:
    """The reads' own requests at the metadata server (read_meta_s, part of data_s) are its
    time: the verdict's "dominant" agrees with Prediction.bound_by."""
    from types import SimpleNamespace

    from stampede.model.assessment import dominant_part
    from stampede.model.contention import Prediction

    queued = Prediction("shared", 16384, meta_s=4.0, data_s=7.0, limit="B_agg",
                        saturated=True, rate_bps=1e9, read_meta_s=3.5)
    streamed = Prediction("shared", 16384, meta_s=4.0, data_s=7.0, limit="B_agg",
                          saturated=True, rate_bps=1e9)
    assert queued.bound_by == "the metadata server"
    assert dominant_part(SimpleNamespace(prediction=queued)).startswith("metadata stall")  # type: ignore[arg-type]
    assert dominant_part(SimpleNamespace(prediction=streamed)) == "data (limited by B_agg)"  # type: ignore[arg-type]
