"""Samples at scale: each rank reduces its own samples, MPI reduces the ranks.

In exact mode every sample reaches rank 0 (Gatherv of int64 nanoseconds). At 16,384 ranks
x 10 iterations x hundreds of reads each that is gigabytes on one rank, so in histogram
mode (run.samples = "histogram", or "auto" past AUTO_SAMPLES) each rank turns its samples
into fixed-size arrays that MPI then reduces, with a cost on rank 0 that does not grow
with the number of ops:
  - per op, a latency histogram over stats.HISTOGRAM_EDGES_S (SUM), and the exact
    minimum and maximum latency (MIN, MAX);
  - per op and iteration, the count of successful and failed ops and their bytes (SUM),
    the first start and the last stop (MIN, MAX): elapsed, ops/s and GB/s stay exact.
The restore samples (one per rank and iteration) and each rank's timeline still reach
rank 0 whole. Percentiles other than min and max are then interpolated inside one log
bucket: their error is at most one bucket's width (BUCKET_ERROR, 12.2%), and every row
they appear in says `samples = histogram`.

Stamps are put on the node's axis on each rank (the node's first barrier exit comes from
a MIN over the node), as stampede.run.clock does on rank 0 in exact mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stampede import mpi
from stampede.results.samples import ITER, NBYTES, OK, OP, OPS, START, STOP
from stampede.results.stats import BUCKETS_PER_DECADE, HISTOGRAM_EDGES_S

AUTO_SAMPLES = 4_000_000          # above this many samples in a layout, auto -> histogram
BUCKET_ERROR = 10 ** (1 / BUCKETS_PER_DECADE) - 1
EDGES_NS = np.array(HISTOGRAM_EDGES_S) * 1e9
BIG = np.iinfo(np.int64).max


@dataclass(frozen=True)
class Reduced:
    """The ranks' samples of one layout, reduced (complete on rank 0)."""

    histograms: np.ndarray        # [op, bucket] counts of successful samples
    latency_min_ns: np.ndarray    # [op]
    latency_max_ns: np.ndarray    # [op]
    ok: np.ndarray                # [op, iteration] successful samples
    failed: np.ndarray            # [op, iteration]
    nbytes: np.ndarray            # [op, iteration] bytes of successful samples
    first_start_ns: np.ndarray    # [op, iteration] on the phase's axis
    last_stop_ns: np.ndarray      # [op, iteration]
    iterations: tuple[int, ...]   # the iteration number of each column


def to_node_axis(comm: Any, rows: np.ndarray, origins: dict[int, int], restore_code: int) -> np.ndarray:
    """This rank's absolute stamps -> ns since its node's first barrier exit, per phase."""
    phases = sorted(origins)
    mine = np.array([origins[phase] for phase in phases], dtype=np.int64)
    first = mpi.node_min(comm, mine)
    rows = rows.copy()
    if rows.size:
        zero = first[np.searchsorted(np.array(phases), rows[:, ITER])]
        rows[:, START] -= zero
        rows[:, STOP] -= zero
        rows[rows[:, OP] == restore_code, START] = 0
    return rows


def summarize(rows: np.ndarray, iterations: tuple[int, ...]) -> dict[str, np.ndarray]:
    """One rank's fixed-size arrays (whatever its sample count)."""
    nops, nits = len(OPS), len(iterations)
    column = {iteration: index for index, iteration in enumerate(iterations)}
    out = {
        "histograms": np.zeros((nops, len(EDGES_NS) - 1), dtype=np.int64),
        "latency_min_ns": np.full(nops, BIG, dtype=np.int64),
        "latency_max_ns": np.zeros(nops, dtype=np.int64),
        "ok": np.zeros((nops, nits), dtype=np.int64),
        "failed": np.zeros((nops, nits), dtype=np.int64),
        "nbytes": np.zeros((nops, nits), dtype=np.int64),
        "first_start_ns": np.full((nops, nits), BIG, dtype=np.int64),
        "last_stop_ns": np.full((nops, nits), -BIG, dtype=np.int64),
    }
    if not rows.size:
        return out
    ops, cols = rows[:, OP], np.array([column[int(i)] for i in rows[:, ITER]]) if nits else None
    good = rows[:, OK] == 1
    durations = rows[:, STOP] - rows[:, START]
    for code in np.unique(ops):
        mine = good & (ops == code)
        if mine.any():
            out["histograms"][code] = np.histogram(durations[mine], bins=EDGES_NS)[0]
            out["latency_min_ns"][code] = durations[mine].min()
            out["latency_max_ns"][code] = durations[mine].max()
    assert cols is not None
    np.add.at(out["ok"], (ops[good], cols[good]), 1)
    np.add.at(out["failed"], (ops[~good], cols[~good]), 1)
    np.add.at(out["nbytes"], (ops[good], cols[good]), rows[good, NBYTES])
    np.minimum.at(out["first_start_ns"], (ops[good], cols[good]), rows[good, START])
    np.maximum.at(out["last_stop_ns"], (ops[good], cols[good]), rows[good, STOP])
    return out


REDUCTIONS = {"histograms": "sum", "latency_min_ns": "min", "latency_max_ns": "max", "ok": "sum",
              "failed": "sum", "nbytes": "sum", "first_start_ns": "min", "last_stop_ns": "max"}


def reduce(comm: Any, summary: dict[str, np.ndarray], iterations: tuple[int, ...]) -> Reduced | None:
    """MPI-reduce every rank's arrays to rank 0 (None elsewhere)."""
    reduced = {name: mpi.reduce_to_root(comm, summary[name], how) for name, how in REDUCTIONS.items()}
    if comm.Get_rank() != 0:
        return None
    return Reduced(iterations=iterations, **reduced)  # type: ignore[arg-type]
