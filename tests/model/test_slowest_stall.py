"""The band holds the drain the model projects although the fit reads the median rank's
stall (lat_p50), which sits below it in a saturated burst: the band adds the fit on each
op's lat_max, the slowest rank's reading (stampede.model.projection). Synthetic points
(virtual numbers, no timing)."""

from __future__ import annotations

import math
from dataclasses import replace

from stampede.model.contention import Params, metadata_stall, predict
from stampede.model.fit import Point
from stampede.model.projection import project

# a 2-thread server of 10 ms per op, no round trip; 2 ops per rank; 1 GB/s per client
SERVER = Params(rtt_s=0.0, service_s=10e-3, threads=2, agg_bps=1e15, client_bps=1e9,
                bytes_per_rank=1e6, ops_per_rank=2)
MEDIAN, SLOWEST = 0.88, 1.05     # the two readings of a saturated run's drain


def point(nranks: int) -> Point:
    drain = metadata_stall(nranks, 2, 0.0, SERVER.service_s, SERVER.threads)
    saturated = nranks * 2 / SERVER.threads > 2
    last = drain + SERVER.bytes_per_rank / SERVER.client_bps
    return Point(nranks=nranks, ops_per_rank=2, meta_s=drain * (MEDIAN if saturated else 1),
                 meta_max_s=drain * (SLOWEST if saturated else 1.02), last_s=last,
                 bytes_per_rank=SERVER.bytes_per_rank, last_min_s=last * 0.99,
                 last_max_s=last * 1.01, op_counts=(("stat", nranks), ("open", nranks)))


def test_the_band_holds_the_drain_that_the_median_reading_misses() -> None:
    points = [point(n) for n in (1, 2, 4, 8)]
    truth = predict(SERVER, 16384, "sharded").total_s
    projected = project(points, "sharded", 16384, locks=math.inf, per_rank_size=True)
    low, high = projected.band
    assert projected.prediction.total_s < truth * 0.95       # the median's reading: low
    assert low <= truth <= high
    assert "the stall read as the slowest rank's" in projected.band_from
    # without the slowest reading (an archive without lat_max) the band misses the drain
    blind = project([replace(p, meta_max_s=math.nan) for p in points], "sharded", 16384,
                    locks=math.inf, per_rank_size=True)
    assert blind.band[1] < truth and "slowest" not in blind.band_from


def test_no_saturated_run_no_slowest_reading() -> None:
    """Below the knee the two readings differ by jitter only: no band from it."""
    quiet = [replace(point(n), meta_s=0.02, meta_max_s=0.03, last_s=0.021, last_min_s=0.0208,
                     last_max_s=0.0212) for n in (1, 2, 3)]
    projected = project(quiet, "sharded", 64, locks=math.inf, per_rank_size=True)
    assert "slowest" not in projected.band_from
