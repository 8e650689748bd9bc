"""The save in tiers' unprotected windows (stampede.run.tiers.unprotected_by_tier), pure:
publishing at a tier means the version is durable on it and on every tier below it, so
their window is 0 by definition, whatever the ranks' stamps say (they come from clocks
started as each rank left a barrier, a few ms apart on a busy machine); only a tier above
the publish level has a window, from the publish to its last rank."""

from __future__ import annotations

import numpy as np
import pytest

from stampede.results.model import LayoutRun
from stampede.results.stats import layout_stats
from stampede.results.tiers import TIER_SAVES
from stampede.run.tiers import unprotected_by_tier

MS = 1_000_000   # ns


def runs() -> list[LayoutRun]:
    empty = np.zeros((0, 7), dtype=np.int64)
    return [LayoutRun(layout, 4096, layout_stats(layout, empty, 2, "save"), (), "",
                      phase="save") for layout in TIER_SAVES]


# per rank, per version: when its shard was on local, peer, storage, and (rank 0) the
# publish, in ns from that rank's own origin; -1: not on this rank. Rank 1 left the
# version's barrier 5 ms before rank 0, so its peer copy, done before the publish, reads
# 3 ms after it: the stamps that made the gate fail under load.
SKEWED = [[(1 * MS, 4 * MS, 10 * MS, 12 * MS)], [(1 * MS, 15 * MS, 9 * MS, -1)]]


def windows(publish: str, reached: list[list[tuple[int, ...]]]) -> dict[str, float]:
    return {run.layout: run.stats.unprotected_s for run in unprotected_by_tier(
        runs(), reached, publish) if run.stats is not None}


def test_every_tier_at_or_below_the_publish_level_has_no_window_whatever_the_stamps() -> None:
    assert windows("storage", SKEWED) == dict.fromkeys(TIER_SAVES, 0.0)
    assert windows("peer", SKEWED) == {"tier-local": 0.0, "tier-peer": 0.0,
                                       "tier-storage": 0.0}   # storage: 10 ms < 12 ms


@pytest.mark.parametrize(("publish", "expected"), [
    ("local", {"tier-local": 0.0, "tier-peer": 0.004, "tier-storage": 0.009}),
    ("peer", {"tier-local": 0.0, "tier-peer": 0.0, "tier-storage": 0.006})])
def test_a_tier_above_the_publish_level_has_its_window_from_the_publish(
        publish: str, expected: dict[str, float]) -> None:
    """Published at 2 ms (local) or 5 ms (peer); the longest over the versions."""
    published = 2 * MS if publish == "local" else 5 * MS
    reached = [[(1 * MS, 4 * MS, 1 * MS, published), (1 * MS, 3 * MS, 11 * MS, published)],
               [(1 * MS, 6 * MS, 2 * MS, -1), (1 * MS, 1 * MS, 1 * MS, -1)]]
    assert windows(publish, reached) == pytest.approx(expected)
