"""The samples of one layout to rank 0, and the statistics made of them there.

exact: every rank's sample rows reach rank 0 with one Gatherv, and rank 0 puts them on one
time axis per node (stampede.run.clock). histogram (stampede.results.histogram): each rank
puts its own stamps on its node's axis (a MIN over the node), reduces its samples to
fixed-size arrays, and MPI reduces those; only the restore samples and the timelines reach
rank 0 whole. These are the collectives; the arithmetic is stampede.results'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from stampede import mpi
from stampede.ops import RETRY_OPS
from stampede.results.model import ClientCounts, LayoutTrace
from stampede.results.samples import ITER, OP, START, STOP
from stampede.run.clock import PSEUDO_CODES, on_one_axis, origins_array
from stampede.run.where import gathered
from stampede.units import NS_PER_S

# imported where used: histogram mode alone needs it, not every rank's start; rank 0
# alone makes a LayoutStats (stampede.results.stats)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from stampede.backends.base import Backend
    from stampede.checkpoint.plan import RankPlan
    from stampede.checkpoint.save_plan import SavePlan
    from stampede.results import histogram
    from stampede.results.summaries import LayoutStats
    from stampede.spec import JobSpec

AUTO_SAMPLES = 4_000_000          # above this many samples in a layout, auto -> histogram


def layout_stats(comm: mpi.Comm, spec: JobSpec, plan: RankPlan | SavePlan, layout: str,
                 rows: np.ndarray,
                 origins: dict[int, int], hosts: tuple[str, ...],
                 failed_iteration: int | None, completion_op: str = "restore") -> LayoutStats | None:
    """The layout's statistics, complete on rank 0 (None elsewhere), in the mode
    run.samples chose; `completion_op` is the pseudo-op whose time to last rank heads
    them (restore, or save)."""
    return gathered_stats(comm, spec, plan, layout, rows, origins, hosts, failed_iteration,
                          completion_op)[0]


def gathered_stats(comm: mpi.Comm, spec: JobSpec, plan: RankPlan | SavePlan, layout: str, rows: np.ndarray,
                   origins: dict[int, int], hosts: tuple[str, ...],
                   failed_iteration: int | None, completion_op: str = "restore",
                   where: tuple[np.ndarray, list[str]] | None = None,
                   ) -> tuple[LayoutStats | None, LayoutTrace | None]:
    """layout_stats, and with `where` (--trace: each sample's file and offset, and the
    rank's file names) every rank's rows on rank 0: in exact mode the very rows the
    statistics were made of (one Gatherv for both), in histogram mode gathered for the
    trace alone."""
    if histogram_mode(comm, spec, plan):
        stats = _reduced_stats(comm, layout, rows, origins, failed_iteration, completion_op)
        ranked = all_rows(comm, rows, origins, hosts) if where is not None else None
    else:
        ranked = all_rows(comm, rows, origins, hosts)
        stats = _exact(layout, ranked, comm.Get_size(), completion_op)
    if where is None:
        return stats, None
    located = gathered(comm, *where)
    if ranked is None or located is None:
        return stats, None
    return stats, LayoutTrace(np.column_stack([ranked, located[0]]), located[1])


def histogram_mode(comm: mpi.Comm, spec: JobSpec, plan: RankPlan | SavePlan) -> bool:
    """run.samples, with auto deciding from the samples this layout will produce on all
    ranks together: collectively, since ranks can plan very different work (an existing
    checkpoint's files) and the two modes gather with different collectives."""
    if spec.samples != "auto":
        return spec.samples == "histogram"
    mine = (sum(plan.op_counts().values()) + 4) * spec.iterations  # + restore, verify, ...
    total = mpi.allreduce_sum(comm, np.array([mine]))
    return total is not None and int(total[0]) > AUTO_SAMPLES


def exact_stats(comm: mpi.Comm, layout: str, rows: np.ndarray, origins: dict[int, int],
                hosts: tuple[str, ...], completion_op: str = "restore") -> LayoutStats | None:
    """Every sample to rank 0 (one Gatherv), put on one axis there."""
    return _exact(layout, all_rows(comm, rows, origins, hosts), comm.Get_size(), completion_op)


def _exact(layout: str, ranked: np.ndarray | None, nranks: int,
           completion_op: str) -> LayoutStats | None:
    """The statistics of every rank's rows (rank 0; None elsewhere)."""
    if ranked is None:
        return None
    from stampede.results.stats import layout_stats  # rank 0 only: workers never import it
    return layout_stats(layout, ranked, nranks, completion_op)


def all_rows(comm: mpi.Comm, rows: np.ndarray, origins: dict[int, int],
             hosts: tuple[str, ...]) -> np.ndarray | None:
    """Every rank's sample rows on rank 0 (one Gatherv), each node's on its axis, the rank
    as the last column (stampede.results.trace's columns); None elsewhere."""
    gathered = mpi.gather_rows(comm, rows)
    gathered_origins = mpi.gather_rows(comm, origins_array(origins))
    if gathered is None or gathered_origins is None:
        return None
    on_axis = on_one_axis(gathered, gathered_origins, hosts)
    return np.concatenate([np.column_stack([part, np.full(len(part), r, dtype=np.int64)])
                           for r, part in enumerate(on_axis)])


def check_trace(comm: mpi.Comm, spec: JobSpec, plan: RankPlan | SavePlan) -> None:
    """--trace: the rows this layout will keep, all ranks together, within its limit;
    collectively, before the first phase (UsageError on every rank, exit 2)."""
    if not spec.trace_limit:
        return
    from stampede.errors import UsageError
    from stampede.results.trace import ROW_BYTES, estimated_rows

    mine = estimated_rows(sum(plan.op_counts().values()), spec.iterations + spec.warmup)
    total = mpi.allreduce_sum(comm, np.array([mine]))
    rows = int(total[0]) if total is not None else 0
    if rows * ROW_BYTES > spec.trace_limit:
        from stampede.units import format_bytes
        raise UsageError(f"--trace: layout {plan.layout} would keep about {rows:,} ops "
                         f"({format_bytes(rows * ROW_BYTES)}), more than --trace-limit "
                         f"{format_bytes(spec.trace_limit)}",
                         hint="fewer iterations, a larger --trace-limit, or no --trace")


def _reduced_stats(comm: mpi.Comm, layout: str, rows: np.ndarray, origins: dict[int, int],
                   failed_iteration: int | None, completion_op: str) -> LayoutStats | None:
    """Histogram mode (stampede.results.histogram): fixed-size reductions; the pseudo-op
    samples (restores, saves) and the timelines whole."""
    from stampede.results import histogram
    from stampede.results.stats import layout_stats_reduced, timeline

    on_axis = _to_node_axis(comm, rows, origins)
    iterations = tuple(i for i in sorted(origins) if i >= 0 or i == failed_iteration)
    reduced = reduce_summaries(comm, histogram.summarize(on_axis, iterations), iterations)
    ranked = np.column_stack([on_axis, np.full(len(on_axis), comm.Get_rank(), dtype=np.int64)])
    pseudo = mpi.gather_rows(comm, ranked[np.isin(ranked[:, OP], PSEUDO_CODES)])
    timelines = mpi.gather(comm, timeline(ranked, completion_op))
    if reduced is None or pseudo is None or timelines is None:
        return None
    return layout_stats_reduced(layout, reduced, np.concatenate(pseudo),
                                tuple(row for part in timelines for row in part), comm.Get_size(),
                                completion_op)


def _to_node_axis(comm: mpi.Comm, rows: np.ndarray, origins: dict[int, int]) -> np.ndarray:
    """This rank's absolute stamps -> ns since its node's first barrier exit, per phase."""
    phases = sorted(origins)
    mine = np.array([origins[phase] for phase in phases], dtype=np.int64)
    first = mpi.node_min(comm, mine)
    rows = rows.copy()
    if rows.size:
        zero = first[np.searchsorted(np.array(phases), rows[:, ITER])]
        rows[:, START] -= zero
        rows[:, STOP] -= zero
        rows[np.isin(rows[:, OP], PSEUDO_CODES), START] = 0
    return rows


def reduce_summaries(comm: mpi.Comm, summary: dict[str, np.ndarray],
            iterations: tuple[int, ...]) -> histogram.Reduced | None:
    """MPI-reduce every rank's arrays to rank 0 (None elsewhere)."""
    from stampede.results import histogram

    reduced = {name: mpi.reduce_to_root(comm, summary[name], how)
               for name, how in histogram.REDUCTIONS.items()}
    if comm.Get_rank() != 0:
        return None
    return histogram.Reduced(iterations=iterations, **reduced)  # type: ignore[arg-type]


def client_before(backend: Backend) -> tuple[dict[str, int], dict[str, int], dict[str, float]]:
    """The backend's cumulative client counters (retries, throttles, backoff_s) now: what
    `client_counts` subtracts at the layout's end."""
    return dict(backend.retries), dict(backend.throttles), dict(backend.backoff_s)


def client_counts(comm: mpi.Comm, backend: Backend,
                  before: tuple[dict[str, int], dict[str, int], dict[str, float]]) -> ClientCounts:
    """What the backend's client did on its own in this layout, per op retried (a save's
    validation re-reads count under open and read), summed over ranks: requests retried,
    throttling answers, seconds backing off (object stores: throttling and timeouts show
    up here before they become errors)."""
    now: tuple[Mapping[str, float], ...] = (backend.retries, backend.throttles, backend.backoff_s)
    then: tuple[Mapping[str, float], ...] = before
    scale = (1, 1, NS_PER_S)   # the reduction sums int64: seconds as nanoseconds
    mine = np.array([[round((counts.get(op, 0) - earlier.get(op, 0)) * factor)
                      for op in RETRY_OPS]
                     for counts, earlier, factor in zip(now, then, scale, strict=True)])
    total = mpi.allreduce_sum(comm, mine)
    if total is None:
        return ClientCounts()
    retried, throttled, waited_ns = ({op: int(value) for op, value in zip(RETRY_OPS, row, strict=True)
                                      if value} for row in total)
    return ClientCounts(retries=retried, throttles=throttled,
                        backoff_s={op: ns / NS_PER_S for op, ns in waited_ns.items()})
