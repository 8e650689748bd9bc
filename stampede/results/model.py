"""The model of results, at the bottom of the stack: what a run produced, as frozen
records. The timed code (stampede.run) builds them on every rank, the statistics
(stampede.results.stats) fill them on rank 0 with stampede.results.summaries' records,
the archive and the report read them; none of them does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np

    from stampede.results.amplification import Amplification
    from stampede.results.ceiling import Ceiling
    from stampede.results.summaries import LayoutStats

from stampede.ops import TIMELINE_PHASES


def node_counts(hosts: tuple[str, ...] | list[str]) -> tuple[int, int]:
    """(nodes, most ranks on one node) from the host of each rank."""
    return len(set(hosts)), max((list(hosts).count(host) for host in set(hosts)), default=0)


# Per rank and measured iteration (0-based, warmup dropped): its first op's start (the
# jitter delay included), the end of its first read (a whole block has arrived: "first
# byte"), the end of its last read, and when it was done; seconds on the phase's axis
# (stampede.run.clock), NaN where the layout has no such moment (a broadcast member reads none).
# Then the seconds the rank spent in each of stampede.ops.TIMELINE_PHASES (the sum of its
# samples' durations, so a broadcast's storage and network parts are told apart); older
# sidecars hold the six moments only.
TIMELINE_MOMENTS = ("rank", "iteration", "start_s", "first_byte_s", "last_read_s", "done_s")
TIMELINE_COLUMNS = TIMELINE_MOMENTS + tuple(
    f"{name.replace(' ', '_')}_s" for name in TIMELINE_PHASES)


@dataclass(frozen=True)
class RunContext:
    """Facts about one run, the same for all its layouts (complete on rank 0)."""

    run_id: str
    timestamp: str
    nranks: int
    hosts: tuple[str, ...]       # host of each rank
    backend: str
    fs_type: str
    mpi_library: str
    device: str = ""             # run.h2d: the devices the bytes went on to
    storage: dict[str, object] = field(default_factory=dict)   # backend settings, stripes
    checkpoint_format: str = ""  # an existing checkpoint's format, as found
    ceiling: Ceiling | None = None   # run.ceiling: every node's raw-read ceiling (rank 0)

    @property
    def nnodes(self) -> int:
        return node_counts(self.hosts)[0]

    @property
    def ranks_per_node(self) -> int:
        return node_counts(self.hosts)[1]


class LayoutTrace(NamedTuple):
    """--trace: one layout's rows on rank 0 (stampede.results.trace's TRACE_COLUMNS) and
    the names its file column indexes."""

    rows: np.ndarray
    files: list[str]


@dataclass(frozen=True)
class ClientCounts:
    """What the storage client did on its own in one layout's timed ops, summed over
    ranks, per op (stampede.ops.RETRY_OPS; only the ops where any is not zero)."""

    retries: dict[str, int] = field(default_factory=dict)     # requests retried
    throttles: dict[str, int] = field(default_factory=dict)   # throttling answers met
                                 # (429, 503 SlowDown): retried or, the last, an error
    backoff_s: dict[str, float] = field(default_factory=dict)   # seconds waited before
                                 # retries and for the adaptive mode's limiter


@dataclass(frozen=True)
class LayoutRun:
    """One layout's outcome on rank 0."""

    layout: str
    bytes_per_rank: int
    stats: LayoutStats | None    # None on ranks other than 0
    messages: tuple[str, ...]
    invalid_reason: str          # empty when valid
    client: ClientCounts = field(default_factory=ClientCounts)   # retries, throttles, waits
    resident_fraction: tuple[float, ...] = ()   # per measured iteration, cache residency
    bytes_total: int = 0         # all ranks' bytes, when they differ by rank (existing)
    digests: tuple[dict[str, object], ...] = ()   # existing checkpoints: what each rank read
    notes: tuple[str, ...] = ()  # warnings from the ranks (a drop_caches refused, ...)
    interrupted: bool = False    # stopped by a signal: not measured to the end
    iterations_done: int = 0     # when interrupted: the measured iterations it completed
                                 # (archived as incomplete; none: stopped in a warmup)
    phase: str = "restore"       # or "save" (stampede.run.save)
    restored_from: str = ""      # a saved version's directory (stampede.checkpoint.versions)
    cache_drops: tuple[int, ...] = ()   # per rank: page-cache drops it made (run.drop_caches)
    file_system: dict[str, object] = field(default_factory=dict)   # what the target's file-
                                 # system client said around the layout, by sidecar key: its
                                 # counters' deltas, its files' layouts (stampede.run.file_system)
    trace: LayoutTrace | None = None   # --trace: every op's row on rank 0
    said: tuple[str, ...] = ()   # what the run says beside its numbers, not a warning
    tier_bytes: dict[str, int] = field(default_factory=dict)   # a rejoin's restores: tier ->
                                 # bytes all ranks restored from it (stampede.results.tiers)
    amplification: Amplification | None = None   # a restore's bytes needed, and what its
                                 # worst node and rank read of theirs (results.amplification)


