"""A loaders run's verdicts, from its archive rows alone (pure): each real loader beside
stampede's own raw restore of the same bytes, in the same run and cache state.

- time to last rank, GB/s: the loader's restore rows (barrier exit -> the rank's last
  tensor in memory; bytes = the rank's assigned bytes, as the ceiling's).
- efficiency = loader restore GB/s / ceiling restore GB/s, the ceiling being stampede's
  restore (tool stampede) of the same policy, cache state and rank count in the run.
- against the raw-read ceiling (run.ceiling = true: the node's share of the checkpoint
  read cold by 1-32 streams of large reads, stampede.results.ceiling): the loader's GB/s
  per node over it, for the ceiling's restore and every loader alike.
- read amplification: the bytes it read over the bytes assigned, for the job, its worst
  node and its worst rank (a loader that reads whole files for 1/N of them says N.0x).
- what dominates: the loader's phase whose median span per rank (lat_p50_s) is the
  largest share of its median restore; "other" when no phase it exposes is as large as
  the time outside all of them (imports already done: Python between calls, the
  barrier's skew, frees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stampede.ops import LOADER_OPS
from stampede.results.cells import Row
from stampede.results.columns import OWN_TOOL


@dataclass(frozen=True)
class LoaderLine:
    """One loader (or the ceiling) on one device, under one policy and cache state."""

    loader: str
    policy: str
    cache: str
    device: str
    nranks: int
    bytes_total: int
    time_to_last_rank_s: float
    gbps: float
    efficiency: float          # NaN for the ceiling, or without one
    dominant: str              # "load 83%", or "" for the ceiling
    phases: tuple[tuple[str, float], ...]   # (op, median seconds per rank)
    valid: bool
    raw_efficiency: float = math.nan   # run.ceiling: GB/s per node over the raw-read ceiling
    # bytes read over bytes assigned: the job's, its worst node's, its worst rank's (NaN in
    # rows from before they were archived)
    amplification: tuple[float, float, float] = (math.nan, math.nan, math.nan)


def loader_lines(rows: Sequence[Row]) -> list[LoaderLine]:
    """The ceiling first, then every loader, per (policy, cache, rank count), in row order."""
    ceilings = {_key(row): row["agg_gbps"] for row in rows
                if row["op"] == "restore" and row["tool"] == OWN_TOOL}
    lines = []
    for row in rows:
        if row["op"] != "restore":
            continue
        ceiling = row["tool"] == OWN_TOOL
        phases = () if ceiling else _phases(rows, row)
        gbps = row["agg_gbps"]
        lines.append(LoaderLine(
            loader=f"{OWN_TOOL} ({row['backend']})" if ceiling else row["tool"],
            policy=row["layout"], cache=row["cache"], device=row["device"],
            nranks=row["nranks"], bytes_total=row["bytes_total"],
            time_to_last_rank_s=row["time_to_last_rank_s"], gbps=gbps,
            efficiency=math.nan if ceiling else gbps / ceilings.get(_key(row), math.nan),
            dominant="" if ceiling else _dominant(phases, row["lat_p50_s"]),
            phases=phases, valid=row["valid"],
            raw_efficiency=_number(row.get("ceiling_efficiency", math.nan)),
            amplification=(_number(row.get("read_amplification", math.nan)),
                           _number(row.get("read_amplification_node_max", math.nan)),
                           _number(row.get("read_amplification_rank_max", math.nan)))))
    lines.sort(key=lambda line: (line.policy, line.cache, line.nranks,
                                 not line.loader.startswith("stampede")))
    return lines


def _number(value: object) -> float:
    return value if isinstance(value, float) else math.nan


def _key(row: Row) -> tuple[str, str, str, str]:
    return row["run_id"], row["layout"], row["cache"], row["nranks"]


def _phases(rows: Sequence[Row], restore: Row) -> tuple[tuple[str, float], ...]:
    same = [row for row in rows if row["op"] in LOADER_OPS and _key(row) == _key(restore)
            and row["tool"] == restore["tool"]
            and row["device"] == restore["device"]]
    return tuple((row["op"], row["lat_p50_s"]) for row in same)


def _dominant(phases: tuple[tuple[str, float], ...], restore_s: float) -> str:
    """'load 83%': the largest phase's share of the restore, or 'other' when the time
    outside the phases is larger than any of them."""
    if not restore_s or not math.isfinite(restore_s):
        return ""
    other = restore_s - sum(seconds for _, seconds in phases if math.isfinite(seconds))
    op, seconds = max(phases, key=lambda phase: phase[1], default=("other", other))
    if other > seconds:
        op, seconds = "other", other
    return f"{op} {100 * seconds / restore_s:.0f}%"
