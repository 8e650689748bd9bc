"""stampede.emulate.service: a slot held to a deadline, and the tally of what was held.

No wall-clock upper bounds: a hold may end late on a busy machine, never early, and the
tally's numbers are checked on values given to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from stampede.emulate.service import (
    MAX_SPIN_FRACTION,
    SPIN_S,
    OpTally,
    ServiceTally,
    hold_until,
    percentile,
    spin_for,
)


@pytest.mark.parametrize("spin_s", [0.0, SPIN_S, 1.0], ids=["sleep only", "sleep + spin", "spin only"])
def test_a_hold_never_ends_before_its_deadline(spin_s: float) -> None:
    for service_s in (0.0, 0.0003, 0.002):
        deadline_s = time.monotonic() + service_s
        hold_until(deadline_s, spin_s)
        assert time.monotonic() >= deadline_s


def test_the_spin_is_bounded_by_a_fraction_of_the_service_time() -> None:
    assert spin_for(1.0) == SPIN_S
    assert spin_for(SPIN_S) == pytest.approx(SPIN_S * MAX_SPIN_FRACTION)
    assert spin_for(0.0) == 0.0


def test_percentiles_of_microsecond_counts() -> None:
    counts = Counter({1000: 98, 1001: 1, 5000: 1})
    assert percentile(counts, 0.5) == pytest.approx(1000e-6)
    assert percentile(counts, 0.99) == pytest.approx(1001e-6)
    assert percentile(counts, 1.0) == pytest.approx(5000e-6)
    assert percentile(Counter(), 0.5) == 0.0


def test_a_tally_reports_held_against_asked() -> None:
    tally = OpTally()
    for held_s in (0.001002, 0.001001, 0.001003, 0.0015):
        tally.add(0.001, held_s, queued_s=0.0001)
    summary = tally.summary()
    assert summary["count"] == 4
    assert summary["asked_mean_s"] == pytest.approx(0.001)
    assert summary["held_mean_s"] == pytest.approx((0.001002 + 0.001001 + 0.001003 + 0.0015) / 4)
    assert summary["held_p50_s"] == pytest.approx(0.001002)
    assert summary["over_p50_s"] == pytest.approx(2e-6)
    assert summary["over_p99_s"] == pytest.approx(500e-6)
    assert summary["queued_mean_s"] == pytest.approx(0.0001)


def test_the_tally_counts_requests_in_service_at_once_and_prints_one_line() -> None:
    tally = ServiceTally(("getattr", "open"))
    tally.started("getattr")
    tally.started("getattr")
    tally.add("getattr", 0.001, 0.00101, 0.0)
    tally.started("open")
    tally.add("open", 0.001, 0.00102, 0.0)
    tally.add("getattr", 0.001, 0.00103, 0.0)
    assert (tally.in_service, tally.peak_in_service) == (0, 2)
    assert set(tally.summaries()) == {"getattr", "open"}
    # per op too: two getattrs were in service at once, never two opens
    assert [tally.summaries()[op]["peak_in_service"] for op in ("getattr", "open")] == [2, 1]
    text = tally.text()
    assert "\n" not in text
    assert text.startswith("3 metadata request(s) served, at most 2 at once: getattr 2 (asked "
                           "1.000 ms, held 1.020 ms mean (+2.0%) / 1.010 ms p50")
    assert "getattr 2 (" in text and "; at most 2 at once), open 1 (" in text
    assert ServiceTally(("getattr",)).text() == "0 metadata request(s) served, at most 0 at once"


def test_real_time_priority_where_allowed_and_normal_where_refused() -> None:
    """A container without CAP_SYS_NICE refuses SCHED_FIFO: the emulator runs on, and says so."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("root and setpriv (util-linux) are needed to drop CAP_SYS_NICE")
    ask = [sys.executable, "-c", "from stampede.emulate.service import realtime_priority; "
           "print(realtime_priority())"]
    refused = subprocess.run([setpriv, "--bounding-set", "-sys_nice", *ask], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.strip() == "normal priority (SCHED_FIFO refused: Operation not permitted)"
    allowed = subprocess.run(ask, capture_output=True, text=True, timeout=60)
    assert allowed.stdout.strip() == "real-time priority (SCHED_FIFO 1)", allowed.stderr
