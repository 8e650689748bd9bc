"""`project`'s request-rate table: each archived layout's restore (or, --phase save, its
save: its uploads' writes, its validation's reads, rank 0's publish and the releases'
DELETEs) at the target's rank count against an object store's rates per partition
(fitted to the archive's 503s, given with --prefix-rate, or a vendor's preset), with its
keys as archived, under one prefix, hashed where the layout can be; and the partitions K
it needs to meet a target time.

Pure: archived runs (stampede.model.prefix_rate.RunLoad) in, numbers out. Each request's
round trip is the median of the runs' (the client's and the store's, the same for every
layout); each layout's requests per rank are its run's at the most ranks. A save writes
one copy: its keys are one prefix or hashed (K needed then: its ranks' keys spread
round-robin over K prefixes).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stampede.layouts import layout_of
from stampede.model.prefix_rate import (
    Limit,
    Load,
    Outcome,
    PolicyFactory,
    RunLoad,
    fit_read_rate,
    predict,
    spread_needed,
)
from stampede.targets import PRESET_BURST_S, RatePreset


@dataclass(frozen=True)
class Rates:
    """One set of rates the table predicts against."""

    name: str          # "S3 Standard", "fitted", "--prefix-rate"
    limit: Limit
    partition: str     # what the rates are per: "prefix" (K copies spread), "bucket"
    source: str = ""

    @property
    def by_prefix(self) -> bool:
        """K copies under K prefixes meet K partitions (else K buckets are needed)."""
        return self.partition == "prefix"


def preset_rates(preset: RatePreset) -> Rates:
    return Rates(preset.title, Limit(preset.read_per_s, preset.list_per_s,
                                     max(1.0, preset.read_per_s * PRESET_BURST_S),
                                     preset.doubling_s, preset.lists_are_reads,
                                     preset.write_per_s,
                                     max(1.0, preset.write_per_s * PRESET_BURST_S)),
                 preset.partition, preset.source)


def fitted_rates(runs: Sequence[RunLoad], burst: float,
                 policy_of: Callable[[RunLoad], PolicyFactory]) -> Rates | None:
    """The read (and LIST, and write: a save's 503s are its writes') rate per partition
    the throttled runs' 503s say, each run's clients retrying as `policy_of` it says; None
    when no run met a 503."""
    throttled = [run.observed(policy_of(run)) for run in runs if run.throttles]
    if not throttled:
        return None
    rate = fit_read_rate(throttled, burst, throttled[0].policy or policy_of(runs[0]))
    counted = ", ".join(f"{run.layout} {run.nranks}: {run.throttles}"
                        for run in runs if run.throttles)
    return Rates("fitted", Limit(rate, rate, burst), "prefix", f"the archive's 503s ({counted})")


@dataclass(frozen=True)
class PrefixProjection:
    """One layout, keyed one way, against one set of rates, at the target."""

    rates: Rates
    layout: str
    keys: str                  # "1 prefix", "4 copies", "hashed"
    per_partition: int         # ranks whose requests meet the busiest partition
    load: Load
    outcome: Outcome
    needed: int | None         # partitions (prefixes or buckets) for the target; None: none do
    shows_needed: bool = True  # the layout's first line says it (the same for its others)


def _largest(runs: Sequence[RunLoad]) -> list[RunLoad]:
    """Each layout's run at the most ranks (the later of two), in the archive's order."""
    chosen: dict[str, RunLoad] = {}
    for run in runs:
        if run.layout not in chosen or run.nranks >= chosen[run.layout].nranks:
            chosen[run.layout] = run
    return list(chosen.values())


def _load(run: RunLoad, ranks: int, bytes_per_rank: float | None, latency_s: float,
          hashed: bool = False) -> Load:
    storm = run.listers >= run.nranks   # every rank listed (else rank 0 alone)
    return Load(ranks, run.reads_for(bytes_per_rank), latency_s,
                ranks if storm else min(ranks, run.listers),
                writes_per_rank=run.writes_for(bytes_per_rank),
                lone_writes=run.lone_for(ranks, hashed))


def _keys(run: RunLoad, rates: Rates) -> list[tuple[str, int]]:
    """(keys, partitions the ranks' requests spread over): one prefix, the archived
    copies, hashed (a partition per rank's shard) where the layout has shards to hash."""
    if not rates.by_prefix:
        return [("1 bucket", 1)]
    found = [("1 prefix", 1)]
    if run.copies > 1:
        found.append((f"{run.copies} copies", run.copies))
    spec = layout_of(run.layout)
    if not (spec.one_file or spec.listing):
        found.append(("hashed", 0))
    return found


def _spread(run: RunLoad, nranks: int, bytes_per_rank: float | None,
            latency_s: float) -> Callable[[int], Load]:
    """The busiest partition's load with `nranks` spread over K partitions round-robin."""
    return lambda partitions: _load(run, math.ceil(nranks / partitions), bytes_per_rank,
                                    latency_s)


def round_trip_s(runs: Sequence[RunLoad]) -> float:
    """One admitted request's round trip for every layout: the median of the runs' (the
    store's and the client's, not a layout's: one noisy run must not rank the layouts)."""
    return statistics.median(run.latency_s for run in runs)


def project_prefixes(runs: Sequence[RunLoad], rates: Sequence[Rates], nranks: int,
                     target_s: float, policy: PolicyFactory,
                     bytes_per_rank: float | None = None) -> list[PrefixProjection]:
    """Every (rates, layout, keys) at `nranks` (each rank restoring `bytes_per_rank`, in
    the run's blocks; None: as the run did): what its busiest partition meets, and the
    partitions the layout needs (copies round-robin) to restore within target_s."""
    found = []
    latency_s = round_trip_s(runs)
    for chosen in rates:
        for run in _largest(runs):
            needed = spread_needed(_spread(run, nranks, bytes_per_rank, latency_s),
                                   chosen.limit, policy, target_s, nranks)
            for number, (keys, spread) in enumerate(_keys(run, chosen)):
                ranks = 1 if spread == 0 else math.ceil(nranks / spread)
                load = _load(run, ranks, bytes_per_rank, latency_s, hashed=spread == 0)
                found.append(PrefixProjection(chosen, run.layout, keys, ranks, load,
                                              predict(load, chosen.limit, policy),
                                              needed, shows_needed=not number))
    return found
