"""Sizing, the projection inverted (stampede.model.sizing): the value it names for each
resource, put back into the model, fits the allowed time; a little less does not; a
resource that cannot make it fit alone says so."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from stampede.model.contention import Params, effective_threads, predict
from stampede.model.sizing import size

# a shared file read by 16,384 ranks, 8 per node: 3 metadata ops each through one inode
PARAMS = Params(rtt_s=200e-6, service_s=20e-6, threads=8, agg_bps=2e9, client_bps=1e9,
                node_bps=12.5e9, ops_per_rank=3, bytes_per_rank=64 * 2**20, ranks_per_node=8)
CHANGED = {"B_agg": "agg_bps", "B_client": "client_bps", "B_node": "node_bps"}


@pytest.mark.parametrize("layout", ["sharded", "shared", "broadcast"])
def test_each_needed_value_fits_exactly_and_less_does_not(layout: str) -> None:
    nranks, allowed_s = 16384, 30.0
    sizing = size(PARAMS, nranks, layout, allowed_s)
    assert sizing.projected_s == predict(PARAMS, nranks, layout).total_s
    assert not sizing.fits                     # 1 TiB through 2 GB/s: about nine minutes
    threads = effective_threads(layout, PARAMS.threads)
    checked = 0
    for need in sizing.needs:
        if not need.reachable or need.needed == 0:
            continue
        if need.resource == "metadata drain":
            def at(value: float) -> Params:
                return replace(PARAMS, service_s=threads / value)
        else:
            def at(value: float, field: str = CHANGED[need.resource]) -> Params:
                return replace(PARAMS, **{field: value})
        assert predict(at(need.needed), nranks, layout).total_s <= allowed_s
        assert predict(at(need.needed * 0.999), nranks, layout).total_s > allowed_s
        checked += 1
    assert checked >= 1
    agg = next(need for need in sizing.needs if need.resource == "B_agg")
    if layout == "sharded":                    # every rank reads its own 64 MiB from storage
        data_s = allowed_s - predict(PARAMS, nranks, layout).meta_s
        assert agg.needed == pytest.approx(nranks * PARAMS.bytes_per_rank / data_s, rel=1e-6)
        assert agg.ratio == pytest.approx(agg.needed / PARAMS.agg_bps)


def test_the_drain_shortens_the_reads_requests_too() -> None:
    """With the reads' q requests at the same server, the drain the sizing names puts the
    whole time to last rank (the reads' share with it) at the allowed time, and asks for
    less than if the reads' server time had to be met by the stall alone."""
    nranks, allowed_s = 16384, 3.0
    params = replace(PARAMS, rtt_s=0.0, service_s=1e-3, threads=8, bytes_per_rank=0,
                     ops_per_rank=2, read_ops_per_rank=1)
    drain = next(need for need in size(params, nranks, "sharded", allowed_s).needs
                 if need.resource == "metadata drain")
    # every one of the N (k + q) ops drained at the named rate: the allowed time
    assert nranks * 3 / drain.needed == pytest.approx(allowed_s, rel=1e-6)
    assert drain.ratio == pytest.approx(nranks * 3 * 1e-3 / 8 / allowed_s, rel=1e-6)


def test_a_resource_that_cannot_make_it_fit_alone_says_so() -> None:
    nranks = 16384
    # the data alone at 2 GB/s takes minutes: no metadata server makes 30 s
    sizing = size(PARAMS, nranks, "sharded", 30.0)
    drain = next(need for need in sizing.needs if need.resource == "metadata drain")
    assert not drain.reachable and drain.ratio == math.inf
    # where the time is not a resource's at all (no bytes), any value of it does
    relaxed = size(replace(PARAMS, bytes_per_rank=0), nranks, "sharded", 60.0)
    assert relaxed.fits
    needed = {need.resource: need.needed for need in relaxed.needs}
    assert needed["B_agg"] == needed["B_client"] == needed["B_node"] == 0.0
    assert size(PARAMS, nranks, "sharded", -5.0).needs == ()   # nothing left for the restore
