"""Read amplification: the bytes a restore fetched from storage over the unique bytes the
job needed (stampede.checkpoint.plan's `needed_bytes`: the union of what the ranks must end
up holding, whatever a layout reads to get there). 1.0 when every needed byte was read once;
N for N ranks that each read the whole file and keep 1/N of it; below 1 only where a rank
reads part of what it holds and the others' reads bring the rest (broadcast members read
nothing, striped replicas 1/R).

Per iteration over the whole job (the `read_amplification` column, from
storage_bytes_per_iteration), and at its worst node and rank: a node's reads over the
bytes its ranks need (those two ranks of one node that hold one shard need once), a
rank's reads over its own. Pure: rank 0 computes it from what each rank gathered.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from stampede.ops import OP_CODE
from stampede.results.samples import ITER, NBYTES, OK, OP

NAN = float("nan")


@dataclass(frozen=True)
class RankNeed:
    """What one rank read and needed (gathered to rank 0)."""

    read_bytes: float       # from storage per measured iteration (median)
    needed_bytes: int       # of the checkpoint, what it must end up holding
    key: Hashable           # equal for ranks that need the same bytes (plan's needed_key)


@dataclass(frozen=True)
class Amplification:
    needed_bytes: int       # the unique bytes the job needed
    node_max: float         # max over nodes of the node's reads / the node's needed bytes
    rank_max: float         # max over ranks of the rank's reads / its needed bytes

    def of(self, storage_bytes: float) -> float:
        """The job's amplification for the bytes all ranks read in one iteration."""
        return storage_bytes / self.needed_bytes if self.needed_bytes > 0 else NAN


def rank_read_bytes(rows: np.ndarray, op: str = "read") -> float:
    """A rank's bytes read from storage per iteration, the median over the iterations of
    its sample rows (ITER, OP, ..., NBYTES, OK): 0 in one where it read nothing. `op`: the
    op that reads (a loader's `load`)."""
    if not rows.size:
        return 0.0
    reads = rows[(rows[:, OP] == OP_CODE[op]) & (rows[:, OK] == 1)]
    per_iteration = [float(reads[reads[:, ITER] == iteration][:, NBYTES].sum())
                     for iteration in np.unique(rows[:, ITER])]
    return float(np.median(per_iteration))


def _needed(needs: Sequence[RankNeed]) -> int:
    """Bytes needed by these ranks: ranks with one key need the same bytes, once."""
    return sum({need.key: need.needed_bytes for need in needs}.values())


def amplification(needs: Sequence[RankNeed], hosts: Sequence[str]) -> Amplification:
    """The job's needed bytes and the worst node's and rank's amplification; `hosts` is
    the host of each rank (a node is a host)."""
    by_node: dict[str, list[RankNeed]] = {}
    for need, host in zip(needs, hosts, strict=True):
        by_node.setdefault(host, []).append(need)
    nodes = [sum(need.read_bytes for need in node) / needed for node in by_node.values()
             if (needed := _needed(node)) > 0]
    ranks = [need.read_bytes / need.needed_bytes for need in needs if need.needed_bytes > 0]
    return Amplification(needed_bytes=_needed(needs), node_max=max(nodes, default=NAN),
                         rank_max=max(ranks, default=NAN))
