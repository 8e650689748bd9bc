"""The workload a projection is for, named once: the rank count at the target, the ranks
per node there, and the checkpoint at that scale (bytes per rank, a total, or a model
preset). The small runs measure the storage; `stampede assess`, `html`, `project` and
`mttr` apply what they measured to this one workload, so every number they print at the
target answers the same question.

A preset's bytes come from stampede.checkpoint.mlperf (MLPerf Storage's Llama 3 models
with their TP x PP x DP layout); the commands resolve it, this module only holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stampede.errors import UsageError
from stampede.units import format_bytes

if TYPE_CHECKING:
    from stampede.model.projection import Projection


@dataclass(frozen=True)
class Workload:
    """`ranks` at the target; None elsewhere: as the archived runs (the ranks per node of
    the largest run; the job's checkpoint, a per-rank size kept, a total split over the
    ranks)."""

    ranks: int
    ranks_per_node: int | None = None
    bytes_per_rank: float | None = None   # what the slowest (largest) rank restores
    total_bytes: float | None = None      # the whole checkpoint, all ranks
    files_per_rank: int | None = None     # the largest rank's files (a preset's)
    name: str = ""                        # a preset's name ("Llama 3 70B")
    layout: str = ""                      # a preset's parallelism ("TP 8 x PP 1 x DP 2048")

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise UsageError(f"the target's rank count {self.ranks}: must be at least 1")
        if self.ranks_per_node is not None and not 1 <= self.ranks_per_node <= self.ranks:
            raise UsageError(f"ranks per node {self.ranks_per_node}: must be from 1 to the "
                             f"target's ranks ({self.ranks})")
        for what, value in (("bytes per rank", self.bytes_per_rank),
                            ("checkpoint size", self.total_bytes)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UsageError(f"the target's {what} {value}: must be more than 0 bytes")

    @property
    def named(self) -> bool:
        """A checkpoint given for the target (else the job's, as archived)."""
        return self.bytes_per_rank is not None

    def nodes(self, ranks_per_node: int) -> int:
        return -(-self.ranks // max(ranks_per_node, 1))

    def describe_projected(self, projections: list[Projection]) -> str:
        """describe() with the ranks per node and bytes per rank the projections
        (stampede.model.projection.Projection) took (NaN bytes where they differ)."""
        if not projections:   # nothing projected: what was asked, no more
            return self.describe(self.ranks_per_node or 0, self.bytes_per_rank or math.nan)
        first = projections[0].params
        sizes = {round(projection.params.bytes_per_rank) for projection in projections}
        return self.describe(first.ranks_per_node or self.ranks,
                             first.bytes_per_rank if len(sizes) == 1 else math.nan)

    def describe(self, ranks_per_node: int, bytes_per_rank: float) -> str:
        """One line: "Llama 3 70B (TP 8 x PP 1 x DP 2048, ZeRO 3), 918.7 GiB, 16384 ranks on
        2048 node(s) of 8, 57.42 MiB per rank, 2 file(s) per rank": the ranks per node and
        bytes per rank as projected where the workload left them to the runs (NaN bytes:
        they differ by layout)."""
        what = self.name or ("the checkpoint given" if self.named
                             else "the job's checkpoint as archived")
        parts = [what + (f" ({self.layout})" if self.layout else "")]
        known = math.isfinite(bytes_per_rank)
        total = self.total_bytes if self.total_bytes is not None else \
            bytes_per_rank * self.ranks if known else math.nan
        if math.isfinite(total):
            parts.append(format_bytes(total))
        parts.append(f"{self.ranks} ranks on {self.nodes(ranks_per_node)} node(s) of "
                     f"{ranks_per_node}" if ranks_per_node else f"{self.ranks} ranks")
        if known:
            largest = self.total_bytes is not None and bytes_per_rank * self.ranks > \
                self.total_bytes * 1.001
            parts.append(f"{format_bytes(bytes_per_rank)} per rank" + (
                f" (the largest rank's, {format_bytes(self.total_bytes / self.ranks)} on "
                "average: every rank taken as the largest, an upper bound)" if largest
                and self.total_bytes is not None else ""))
        else:
            parts.append("bytes per rank as each layout's runs had them")
        if self.files_per_rank:
            parts.append(f"{self.files_per_rank} file(s) per rank")
        return ", ".join(parts)


def workload_of(ranks: int, ranks_per_node: int | None = None,
                bytes_per_rank: float | None = None, total_bytes: float | None = None,
                preset: tuple[str, str, float, float, int] | None = None) -> Workload:
    """The workload from a command's flags: at most one of bytes per rank, a total and a
    preset ((name, parallelism, largest rank's bytes, total, files per rank))."""
    given = [flag for flag, value in (("bytes per rank", bytes_per_rank),
                                      ("checkpoint size", total_bytes), ("model", preset))
             if value is not None]
    if len(given) > 1:
        raise UsageError(f"the target's checkpoint is given twice ({' and '.join(given)}): "
                         "give one of a model, a checkpoint size or bytes per rank")
    if preset is not None:
        name, layout, largest, total, files = preset
        return Workload(ranks, ranks_per_node, largest, total, files, name, layout)
    if total_bytes is not None:
        return Workload(ranks, ranks_per_node, total_bytes / ranks, total_bytes)
    return Workload(ranks, ranks_per_node, bytes_per_rank)
