"""Sizing, the projection inverted: what the storage (or the network) would have to
deliver for the workload's recovery to fit a target time (default the seed's 60 s).

The time to last rank may take what T_MTTR leaves: T_target - (T_detect + T_cordon_swap
+ T_pod_init + T_barrier_sync). For each resource of the contention model in turn (the
storage's aggregate bandwidth B_agg, the metadata server's drain c_eff / s, one client's
B_client, one node's NIC B_node) the others held at what the fit found, the least value
at which the projected time to last rank fits: found by bisection on the same predict()
the projection uses, so running the model at the value it names meets the target. A
faster metadata drain shortens the reads' own requests too (the model's q: they queue at
the same server), not only the stall before the data.
A resource that cannot make it fit alone (the rest already takes longer) is said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from stampede.model.contention import Params, effective_threads, predict

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_TARGET_MTTR_S = 60.0   # the seed's sub-minute recovery
_STEPS = 200                   # bisection steps in log space: far below a part per million


@dataclass(frozen=True)
class Need:
    """One resource: what the target needs and what the fit found (inf: no run reached a
    limit of it). `needed` is inf where this resource alone cannot make it fit."""

    resource: str                # B_agg, metadata drain, B_client, B_node
    unit: str                    # "B/s" or "ops/s"
    needed: float
    fitted: float

    @property
    def reachable(self) -> bool:
        return math.isfinite(self.needed)

    @property
    def ratio(self) -> float:
        """needed / fitted: above 1, that many times what the storage showed."""
        if not self.reachable or self.fitted <= 0:
            return math.inf
        return self.needed / self.fitted if math.isfinite(self.fitted) else 0.0


@dataclass(frozen=True)
class Sizing:
    layout: str
    allowed_s: float             # the time to last rank the target leaves (<= 0: none)
    projected_s: float
    needs: tuple[Need, ...]

    @property
    def fits(self) -> bool:
        return self.projected_s <= self.allowed_s


def _least(total_at: Callable[[float], float], allowed_s: float) -> float:
    """The least x > 0 with total_at(x) <= allowed_s (total_at falls as x grows); inf where
    no x makes it fit, 0 where any does (the time is not this resource's)."""
    if total_at(math.inf) > allowed_s:
        return math.inf
    if total_at(1e-30) <= allowed_s:
        return 0.0
    high = 1.0
    while total_at(high) > allowed_s:
        high *= 1e3
    low = high / 1e3 if high > 1.0 else 1e-30
    while total_at(low) <= allowed_s and low > 1e-30:
        low /= 1e3
    for _ in range(_STEPS):
        middle = math.sqrt(low * high)
        if total_at(middle) <= allowed_s:
            high = middle
        else:
            low = middle
    return high


def size(params: Params, nranks: int, layout: str, allowed_s: float) -> Sizing:
    """What `layout` at `nranks` (the projection's parameters `params`) needs for its time
    to last rank to fit `allowed_s`."""
    projected = predict(params, nranks, layout)
    if allowed_s <= 0:
        return Sizing(layout, allowed_s, projected.total_s, ())
    threads = effective_threads(layout, params.threads, params.locks)

    def total(**changed: Any) -> float:
        return predict(replace(params, **changed), nranks, layout).total_s

    needs = [Need("B_agg", "B/s", _least(lambda x: total(agg_bps=x), allowed_s), params.agg_bps),
             Need("metadata drain", "ops/s",
                  _least(lambda x: total(service_s=threads / x), allowed_s),
                  threads / params.service_s if params.service_s > 0 else math.inf),
             Need("B_client", "B/s", _least(lambda x: total(client_bps=x), allowed_s),
                  params.client_bps)]
    if projected.nnodes > 1:
        needs.append(Need("B_node", "B/s", _least(lambda x: total(node_bps=x), allowed_s),
                          params.node_bps))
    return Sizing(layout, allowed_s, projected.total_s, tuple(needs))
