"""Histogram mode's percentiles (stampede.results.histogram) within 1% of the exact ones,
on samples whose exact percentiles numpy gives, and beside DDSketch's own (the `ddsketch`
package, the mapping's reference implementation) as an oracle."""

from __future__ import annotations

import ddsketch  # the test extra's: the mapping's reference implementation
import numpy as np
import pytest

from stampede.results.definitions import BUCKET_ERROR, GAMMA, PERCENTILES
from stampede.results.histogram import EDGES_NS, HISTOGRAM_EDGES_S, latency_from_histogram


def counts_of(durations_ns: np.ndarray) -> np.ndarray:
    return np.histogram(durations_ns, bins=EDGES_NS)[0]


@pytest.mark.parametrize(("name", "seed"), [("lognormal", 1), ("bimodal", 2), ("tail", 3),
                                            ("few", 4)])
def test_percentiles_from_the_buckets_are_within_one_percent(name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if name == "lognormal":   # a stat: ~100 µs, spread over a decade
        samples = rng.lognormal(np.log(100e3), 0.6, 200_000)
    elif name == "bimodal":   # cache hits at 3 µs, misses at 2 ms
        samples = np.concatenate([rng.normal(3e3, 200, 150_000), rng.normal(2e6, 1e5, 50_000)])
    elif name == "tail":      # a read with a heavy tail up to seconds
        samples = rng.pareto(1.5, 100_000) * 1e6 + 5e5
    else:
        samples = rng.uniform(1e3, 1e9, 7)
    durations = np.maximum(samples, 200).astype(np.int64)
    latency = latency_from_histogram(counts_of(durations), int(durations.min()),
                                     int(durations.max()))
    exact = np.percentile(durations / 1e9, PERCENTILES)
    got = np.array([latency.p50_s, latency.p90_s, latency.p99_s, latency.p999_s])
    assert np.all(np.abs(got - exact) <= BUCKET_ERROR * exact * (1 + 1e-9)), (got, exact)
    assert latency.min_s == durations.min() / 1e9 and latency.max_s == durations.max() / 1e9
    assert latency.count == len(durations) and latency.approximate


def test_the_mapping_is_ddsketchs_and_so_are_its_estimates() -> None:
    """The edges grow by gamma = 1.01 / 0.99 over 100 ns to 10^4 s; DDSketch (relative
    accuracy 1%) on the same samples gives quantiles our estimates agree with to within
    the two bounds together."""
    ratios = np.array(HISTOGRAM_EDGES_S[1:]) / np.array(HISTOGRAM_EDGES_S[:-1])
    assert np.allclose(ratios, GAMMA) and HISTOGRAM_EDGES_S[0] <= 1e-7 <= HISTOGRAM_EDGES_S[1]
    assert HISTOGRAM_EDGES_S[-2] <= 1e4 <= HISTOGRAM_EDGES_S[-1] and len(ratios) < 1300
    rng = np.random.default_rng(7)
    durations = rng.lognormal(np.log(2e6), 1.0, 100_000).astype(np.int64)
    sketch = ddsketch.DDSketch(relative_accuracy=BUCKET_ERROR)
    for value in durations:
        sketch.add(float(value))
    latency = latency_from_histogram(counts_of(durations), int(durations.min()),
                                     int(durations.max()))
    ours = [latency.p50_s, latency.p90_s, latency.p99_s, latency.p999_s]
    for percent, mine in zip(PERCENTILES, ours):
        theirs = sketch.get_quantile_value(percent / 100) / 1e9
        assert abs(mine - theirs) <= 2 * BUCKET_ERROR * theirs, (percent, mine, theirs)
