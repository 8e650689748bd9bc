"""`stampede rejoin`'s layouts and tiers as its archive names them, once: written by
stampede.run.tiers and stampede.run.rejoin, read by stampede.model.rejoin (the verdict,
`mttr`) from the runs stampede.results.archived finds. A rejoin run archives one save in
three layouts (the tiers of that one save, not alternatives to rank) and two restores that
are alternatives: the rejoin from the tiers and the full restart from storage; and the
spare ranks' start-up after the loss (layout spare-start, the ops of `stampede startup`).
"""

from __future__ import annotations

TIER_SAVES = ("tier-local", "tier-peer", "tier-storage")   # one save, tier by tier
REJOIN, RESTART = "rejoin", "restart"
TIER_RESTORES = (REJOIN, RESTART)
SPARE_START = "spare-start"   # the spares' own start-up after the loss (phase startup)
TIERS = ("local", "peer", "storage")   # where a rank's shard came from, nearest first


def tier_column(tier: str) -> str:
    """The completion row's column of the bytes restored from one tier."""
    return f"tier_{tier}_bytes"

