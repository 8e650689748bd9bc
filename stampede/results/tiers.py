"""`stampede rejoin`'s layouts and tiers as its archive names them, once: written by
stampede.run.tiers and stampede.run.rejoin, read by stampede.model.rejoin (the verdict,
`mttr`). A rejoin run archives one save in three layouts (the tiers of that one save, not
alternatives to rank) and two restores that are alternatives: the rejoin from the tiers
and the full restart from storage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

TIER_SAVES = ("tier-local", "tier-peer", "tier-storage")   # one save, tier by tier
REJOIN, RESTART = "rejoin", "restart"
TIER_RESTORES = (REJOIN, RESTART)
TIERS = ("local", "peer", "storage")   # where a rank's shard came from, nearest first


def tier_column(tier: str) -> str:
    """The completion row's column of the bytes restored from one tier."""
    return f"tier_{tier}_bytes"


def rejoin_run_ids(rows: Sequence[Mapping[str, str]]) -> list[str]:   # op, run_id, layout
    """The runs of `stampede rejoin` among the rows (those holding both restores), in order."""
    restores: dict[str, set[str]] = {}
    for row in rows:
        if row.get("op") == "restore":
            restores.setdefault(row["run_id"], set()).add(row["layout"])
    return [run_id for run_id, layouts in restores.items() if set(TIER_RESTORES) <= layouts]
