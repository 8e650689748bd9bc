"""A run's trace (`run --trace`, `save --trace`, `cycle --trace`): every timed op of every
rank, kept after the phase, and what it says afterwards (`stampede analyze`).

The file: ARCHIVE.runs/RUN_ID.trace.npz beside the sidecar (numpy's own format: `import
numpy; numpy.load(path)` opens it), one int64 array per layout, a row per op of
TRACE_COLUMNS, stamps in ns on each node's axis (since the node's first rank left the
iteration's barrier: stampede.run.clock; the nodes' first exits taken as simultaneous),
the file (an index into the layout's names in meta's "files", paths relative to the
target: stampede.run.where) and offset where the op had them (NOWHERE = -1 otherwise: an
object store's save, an exchange, a stat's offset); and `meta`: a JSON text with the op
names (the op column is an index into them), the hosts by rank, the phase, the run id,
the columns and the files. A row costs ROW_BYTES; what a run
would write is said before it runs (`stampede plan --trace`) and refused above
--trace-limit.

What is read from it, per iteration (default: the slowest, whose restore ended last):
- segments of the phase's span (automatic: SEGMENTS of them): bytes moved (each read or
  write's bytes spread over its duration), ops completed, errors, and how many ranks were
  inside a storage op at once (the storm's shape: most, and on average);
- per rank: time to first byte (its first read's end), to last byte (its last read's end),
  done (the phase's pseudo-op: restore or save); per node the median done (stragglers);
- the trace as Chrome trace-event JSON: a process per node, a thread per rank, an op a
  complete ("X") slice, for Perfetto or chrome://tracing.
Pure: numpy and json only, no MPI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stampede.ops import OPS, PSEUDO_OPS, SAVE_STORAGE_OPS, STORAGE_OPS
from stampede.results.model import LayoutTrace
from stampede.units import BYTES_PER_GB, NS_PER_S, NS_PER_US

TRACE_COLUMNS = ("iteration", "op", "start_ns", "stop_ns", "bytes", "ok", "rank", "file",
                 "offset")
# The first traces (before file and offset): read back with both columns NOWHERE
FIRST_COLUMNS = TRACE_COLUMNS[:7]
ROW_BYTES = 8 * len(TRACE_COLUMNS)
ITERATION, OP, START, STOP, NBYTES, OK, RANK, FILE, OFFSET = range(len(TRACE_COLUMNS))
NOWHERE = -1   # no file (a barrier, an exchange) or no offset (a stat, an open)
SEGMENTS = 20
DATA_OPS = ("read", "write")
ROWS_BESIDE_OPS = 8   # per rank and iteration beyond its storage ops: pseudo-ops, waits, ...


def estimated_rows(storage_ops: int, iterations: int) -> int:
    """About how many rows one rank keeps: its storage ops per iteration and the rest, over
    `iterations` (what `plan --trace` says and run checks against --trace-limit)."""
    return (storage_ops + ROWS_BESIDE_OPS) * iterations


def trace_path(sidecar: Path) -> Path:
    """The trace beside a run's sidecar (RUN_ID.json -> RUN_ID.trace.npz)."""
    return sidecar.with_name(sidecar.stem + ".trace.npz")


def write_trace(path: Path, layouts: dict[str, LayoutTrace], meta: dict[str, object]) -> Path:
    """The layouts' rows and the meta, written whole (a temporary name renamed into place)."""
    temporary = path.with_name(f".{path.name}.tmp.npz")
    document = {**meta, "columns": list(TRACE_COLUMNS), "ops": list(OPS),
                "layouts": list(layouts), "units": "ns",
                "files": {key: traced.files for key, traced in layouts.items()}}
    arrays: dict[str, Any] = {f"layout_{index}": traced.rows.astype(np.int64)
                              for index, traced in enumerate(layouts.values())}
    try:
        np.savez(temporary, meta=np.array(json.dumps(document)), **arrays)
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


@dataclass(frozen=True)
class Trace:
    """A trace as read back (stampede.results.readback.read_trace: whole, in part, or a
    note saying why not)."""
    meta: dict[str, Any]
    layouts: dict[str, np.ndarray]

    @property
    def ops(self) -> list[str]:
        return list(self.meta["ops"])

    def code(self, op: str) -> int:
        return self.ops.index(op) if op in self.ops else -1

    def files(self, layout: str) -> list[str]:
        """The names a layout's file column indexes (paths relative to the target)."""
        return list(self.meta.get("files", {}).get(layout, []))


@dataclass(frozen=True)
class Segment:
    start_ns: int
    stop_ns: int
    nbytes: float          # bytes moved inside it (each op's spread over its duration)
    ops: int               # storage ops that ended inside it
    errors: int
    inside_max: int        # most ranks inside a storage op at once
    inside_mean: float     # ranks inside a storage op, averaged over the segment

    @property
    def gbps(self) -> float:
        seconds = (self.stop_ns - self.start_ns) / NS_PER_S
        return self.nbytes / seconds / BYTES_PER_GB if seconds > 0 else 0.0

    @property
    def ops_per_s(self) -> float:
        seconds = (self.stop_ns - self.start_ns) / NS_PER_S
        return self.ops / seconds if seconds > 0 else 0.0


def completion(trace: Trace, rows: np.ndarray) -> str:
    """The phase's pseudo-op in these rows (restore, or save)."""
    present = set(rows[:, OP].tolist())
    return next((op for op in ("restore", "save") if trace.code(op) in present), "restore")


def iterations(rows: np.ndarray) -> list[int]:
    return sorted({int(value) for value in rows[:, ITERATION] if value >= 0})


def slowest_iteration(trace: Trace, rows: np.ndarray) -> int:
    """The measured iteration whose phase ended last."""
    done = rows[rows[:, OP] == trace.code(completion(trace, rows))]
    done = done[done[:, ITERATION] >= 0]
    if not len(done):
        return iterations(rows)[0] if iterations(rows) else 0
    return int(done[np.argmax(done[:, STOP]), ITERATION])


def storage_codes(trace: Trace) -> list[int]:
    return [trace.code(op) for op in dict.fromkeys((*STORAGE_OPS, *SAVE_STORAGE_OPS))
            if trace.code(op) >= 0]


def segments(trace: Trace, rows: np.ndarray, count: int = SEGMENTS) -> list[Segment]:
    """The iteration's span cut in `count` equal segments (rows: one iteration's)."""
    storage = rows[np.isin(rows[:, OP], storage_codes(trace))]
    if not len(storage):
        return []
    span_start, span_stop = 0, int(rows[:, STOP].max())
    edges = np.linspace(span_start, max(span_stop, 1), count + 1)
    data = storage[np.isin(storage[:, OP], [trace.code(op) for op in DATA_OPS])]
    found = []
    for index, (low, high) in enumerate(zip(edges[:-1], edges[1:])):
        last = index == count - 1   # the span's end belongs to the last segment
        overlap = np.clip(np.minimum(data[:, STOP], high) - np.maximum(data[:, START], low), 0, None)
        duration = np.maximum(data[:, STOP] - data[:, START], 1)
        moved = float(np.sum(data[:, NBYTES] * overlap / duration))
        ended = (storage[:, STOP] >= low) & ((storage[:, STOP] < high) | last)
        inside = _ranks_inside(storage, low, high)
        found.append(Segment(int(low), int(high), moved, int(ended.sum()),
                             int((ended & (storage[:, OK] == 0)).sum()), *inside))
    return found


def segment_rates(found: list[Segment]) -> tuple[str, list[float]]:
    """("GB/s", each segment's rate, slowest first) where any moved bytes, else ("ops/s",
    ...): every segment counted, one that moved nothing (a metadata wait, the last rank
    alone) at 0: it is the stampede's slowest moment, not a gap to skip."""
    moved = any(segment.nbytes for segment in found)
    rates = sorted(segment.gbps if moved else segment.ops_per_s for segment in found)
    return ("GB/s" if moved else "ops/s"), rates


def _ranks_inside(storage: np.ndarray, low: float, high: float) -> tuple[int, float]:
    """(most, mean) ranks inside a storage op during [low, high): a sweep over the ops'
    starts and stops, each rank counted once: a rank's ops run one after another, but
    stamps rounded elsewhere (IOR's per-op seconds) can overlap them by a nanosecond, so
    each op starts no earlier than the rank's previous one stopped."""
    live = storage[(storage[:, START] < high) & (storage[:, STOP] > low)]
    if not len(live):
        return 0, 0.0
    live = live[np.lexsort((live[:, START], live[:, RANK]))]
    previous = np.concatenate([[np.iinfo(np.int64).min], live[:-1, STOP]])
    same_rank = np.concatenate([[False], live[1:, RANK] == live[:-1, RANK]])
    begins = np.where(same_rank, np.maximum(live[:, START], previous), live[:, START])
    starts = np.maximum(begins, low)
    stops = np.maximum(np.minimum(live[:, STOP], high), starts)
    events = sorted([(float(t), 1) for t in starts] + [(float(t), -1) for t in stops])
    inside = most = 0
    weighted = 0.0
    last = low
    for moment, change in events:
        weighted += inside * (moment - last)
        last = moment
        inside += change
        most = max(most, inside)
    return most, weighted / (high - low) if high > low else 0.0



def rank_busy(trace: Trace, rows: np.ndarray, count: int = SEGMENTS,
              bands: int = 64) -> tuple[list[str], np.ndarray]:
    """The heat map's cells: per rank (or band of ranks, when there are more than `bands`:
    their mean) and segment of one iteration's span, the fraction of the segment spent
    inside a storage op; with the rows' labels ("rank 3", or "ranks 0-255")."""
    storage = rows[np.isin(rows[:, OP], storage_codes(trace))]
    ranks = sorted({int(value) for value in rows[:, RANK]})
    span = max(int(rows[:, STOP].max()) if len(rows) else 0, 1)
    edges = np.linspace(0, span, count + 1)
    busy = np.zeros((len(ranks), count))
    for index, rank in enumerate(ranks):
        mine = storage[storage[:, RANK] == rank]
        for start, stop in zip(mine[:, START], mine[:, STOP]):   # a rank's ops never overlap
            busy[index] += np.clip(np.minimum(stop, edges[1:]) - np.maximum(start, edges[:-1]),
                                   0, None)
    busy /= np.diff(edges)
    if len(ranks) <= bands:
        return [f"rank {rank}" for rank in ranks], busy
    groups = np.array_split(np.arange(len(ranks)), bands)
    return ([f"ranks {ranks[g[0]]}-{ranks[g[-1]]}" for g in groups],
            np.array([busy[g].mean(axis=0) for g in groups]))

@dataclass(frozen=True)
class RankTimes:
    rank: int
    host: str
    first_byte_ns: int     # -1: read nothing
    last_byte_ns: int
    done_ns: int


def rank_times(trace: Trace, rows: np.ndarray) -> list[RankTimes]:
    """Per rank of one iteration: first and last byte read (or written), and done."""
    hosts = trace.meta.get("hosts_by_rank") or []
    data = rows[np.isin(rows[:, OP], [trace.code(op) for op in DATA_OPS])]
    done = rows[rows[:, OP] == trace.code(completion(trace, rows))]
    found = []
    for rank in sorted({int(value) for value in rows[:, RANK]}):
        mine = data[data[:, RANK] == rank]
        finished = done[done[:, RANK] == rank]
        found.append(RankTimes(rank, hosts[rank] if rank < len(hosts) else "?",
                               int(mine[:, STOP].min()) if len(mine) else -1,
                               int(mine[:, STOP].max()) if len(mine) else -1,
                               int(finished[:, STOP].max()) if len(finished) else -1))
    return found


def by_node(times: list[RankTimes]) -> list[tuple[str, float, int]]:
    """(host, median done ns, ranks) per node, slowest first."""
    hosts: dict[str, list[int]] = {}
    for each in times:
        hosts.setdefault(each.host, []).append(each.done_ns)
    return sorted(((host, float(np.median(done)), len(done)) for host, done in hosts.items()),
                  key=lambda item: -item[1])


def op_counts(trace: Trace, rows: np.ndarray) -> dict[str, int]:
    """Successful samples per op (all iterations but the warmups): what the archive's
    count column holds."""
    measured = rows[(rows[:, ITERATION] >= 0) & (rows[:, OK] == 1)]
    codes, counts = np.unique(measured[:, OP], return_counts=True)
    return {trace.ops[int(code)]: int(count) for code, count in zip(codes, counts)}


def chrome_events(trace: Trace) -> dict[str, object]:
    """The trace as Chrome trace-event JSON: a process per node (its host), a thread per
    rank, each op a complete slice (microseconds), iterations one after another on the
    timeline (each iteration's axis shifted past the previous one's end)."""
    hosts = trace.meta.get("hosts_by_rank") or []
    nodes = list(dict.fromkeys(hosts)) or ["node"]
    events: list[dict[str, object]] = []
    for index, host in enumerate(nodes):
        events.append({"name": "process_name", "ph": "M", "pid": index, "args": {"name": host}})
    for rank, host in enumerate(hosts):
        events.append({"name": "thread_name", "ph": "M", "pid": nodes.index(host), "tid": rank,
                       "args": {"name": f"rank {rank}"}})
    for layout, iteration, mine, shift_ns in one_after_another(trace):
        names = trace.files(layout)
        for row in mine:
            op = trace.ops[int(row[OP])]
            rank = int(row[RANK])
            events.append({
                "name": op, "cat": f"{layout}{' pseudo' if op in PSEUDO_OPS else ''}",
                "ph": "X", "ts": (shift_ns + row[START]) / NS_PER_US,
                "dur": max((row[STOP] - row[START]) / NS_PER_US, 0.0),
                "pid": nodes.index(hosts[rank]) if rank < len(hosts) else 0, "tid": rank,
                "args": {"layout": layout, "iteration": iteration, "bytes": int(row[NBYTES]),
                         "ok": bool(row[OK]), **_located(names, row)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_id": trace.meta.get("run_id", ""), "source": "stampede"}}


def _located(names: list[str], row: np.ndarray) -> dict[str, object]:
    """A slice's file and offset, where the op had them."""
    found: dict[str, object] = {}
    if 0 <= row[FILE] < len(names):
        found["file"] = names[int(row[FILE])]
    if row[OFFSET] != NOWHERE:
        found["offset"] = int(row[OFFSET])
    return found


GAP_NS = 1_000_000   # between iterations laid one after another


def one_after_another(trace: Trace) -> list[tuple[str, int, np.ndarray, int]]:
    """(layout, iteration, its rows, shift ns) with each iteration's axis shifted past the
    previous one's end (GAP_NS between them): every iteration's stamps start at its own
    barrier, so exports that show one timeline lay them end to end."""
    found, shift_ns = [], 0
    for layout, rows in trace.layouts.items():
        for iteration in sorted({int(value) for value in rows[:, ITERATION]}):
            mine = rows[rows[:, ITERATION] == iteration]
            found.append((layout, iteration, mine, shift_ns))
            shift_ns += int(mine[:, STOP].max()) + GAP_NS if len(mine) else 0
    return found


def dxt_text(trace: Trace) -> str:
    """The reads and writes as Darshan DXT-like text (darshan-dxt-parser's shape: a block
    per file and rank, then a line per op: module, rank, read or write, segment, offset,
    length, start and end in seconds), iterations laid one after another."""
    hosts = trace.meta.get("hosts_by_rank") or []
    data_codes = {trace.code(op): "read" if op == "read" else "write" for op in DATA_OPS}
    blocks: dict[tuple[str, int], list[str]] = {}
    for layout, _iteration, mine, shift_ns in one_after_another(trace):
        names = trace.files(layout)
        for row in mine[np.isin(mine[:, OP], list(data_codes)) & (mine[:, FILE] >= 0)]:
            key = (names[int(row[FILE])], int(row[RANK]))
            lines = blocks.setdefault(key, [])
            lines.append(f" X_STAMPEDE {int(row[RANK]):>5} {data_codes[int(row[OP])]:>5} "
                         f"{len(lines):>8} {int(row[OFFSET]):>14} {int(row[NBYTES]):>12} "
                         f"{(shift_ns + row[START]) / NS_PER_S:>12.6f} "
                         f"{(shift_ns + row[STOP]) / NS_PER_S:>12.6f}")
    out = [f"# stampede trace of run {trace.meta.get('run_id', '?')} as DXT-like text: "
           "offsets and lengths in bytes, times in seconds"]
    ids = {name: index for index, name in enumerate(dict.fromkeys(n for n, _ in blocks))}
    for (name, rank), lines in blocks.items():
        writes = sum(" write " in line for line in lines)
        out += [f"# DXT, file_id: {ids[name]}, file_name: {name}",
                f"# DXT, rank: {rank}, hostname: {hosts[rank] if rank < len(hosts) else '?'}",
                f"# DXT, write_count: {writes}, read_count: {len(lines) - writes}",
                "# Module    Rank  Wt/Rd  Segment          Offset       Length    Start(s)"
                "      End(s)", *lines]
    return "\n".join(out) + "\n"


def files_read(trace: Trace, layout: str, rows: np.ndarray) -> list[tuple[str, int, int, int]]:
    """(file, ranks, data ops, bytes) per file the rows read or wrote, most bytes first."""
    names = trace.files(layout)
    data = rows[np.isin(rows[:, OP], [trace.code(op) for op in DATA_OPS]) & (rows[:, FILE] >= 0)]
    found = []
    for file in np.unique(data[:, FILE]):
        mine = data[data[:, FILE] == file]
        found.append((names[int(file)], len(np.unique(mine[:, RANK])), len(mine),
                      int(mine[:, NBYTES].sum())))
    return sorted(found, key=lambda item: -item[3])
