"""`stampede analyze`: a run's trace (--trace, stampede.results.trace) read afterwards:
how the stampede unfolded over time, rank by rank, node by node; and the trace as Chrome
trace-event JSON for Perfetto or chrome://tracing."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import add_output
from stampede.units import NS_PER_S

if TYPE_CHECKING:
    import numpy as np

    from stampede.commands import Subparsers
    from stampede.present.report import Console
    from stampede.results.trace import Trace

SHOWN_RANKS = 8


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "analyze", formatter_class=formatter,
        help="Read a run's trace (run --trace): throughput, ops and ranks inside a "
             "storage op over time, time to first and last byte per rank, stragglers by "
             "node, errors over time; --chrome writes it for Perfetto.",
        description="A run's trace, over time.")
    sub.add_argument("trace", metavar="TRACE", nargs="+",
                     help="a trace (ARCHIVE.runs/RUN_ID.trace.npz), or an archive: its latest "
                          "run that has one; or IOR's per-op files of one test "
                          "(-O savePerOpDataCSV=FILE writes FILE-TEST-RANK.csv per rank)")
    sub.add_argument("--ior-op", choices=("read", "write"), default="",
                     help="IOR's per-op files: the phase they hold (IOR does not say: with "
                          "-w -r, the last one, read)")
    sub.add_argument("--layout", default="", help="one layout (default: each)")
    sub.add_argument("--iteration", default="slowest", metavar="N|slowest",
                     help="which measured iteration (0-based; default the slowest)")
    sub.add_argument("--segments", type=int, default=20, help="segments of the span (default 20)")
    add_output(sub, "--chrome", default="", metavar="FILE.json",
               help="also write the whole trace as Chrome trace-event JSON")
    add_output(sub, "--dxt", default="", metavar="FILE.txt",
               help="also write its reads and writes as Darshan DXT-like text (a block "
                    "per file and rank, a line per op: offset, length, start, end)")
    sub.set_defaults(func=cmd_analyze)


def find_trace(given: str) -> Path:
    """The trace file: given, or that of the archive's last traced run (in the archive's
    order: run ids sort by the second they began, then a random suffix, so two runs begun
    in one second do not sort in their order)."""
    from stampede.errors import UsageError
    from stampede.results.archive import sidecar_dir

    path = Path(given)
    if path.name.endswith(".trace.npz"):
        if not path.is_file():
            raise UsageError(f"{given}: no such trace")
        return path
    traces = sorted(sidecar_dir(path).glob("*.trace.npz")) if path.is_file() else []
    if not traces:
        raise UsageError(f"{given}: no trace (`run --trace`, `save --trace` or `cycle --trace` "
                         "writes ARCHIVE.runs/RUN_ID.trace.npz)", hint="stampede run JOB --trace")
    order = _run_order(path)
    return max(traces, key=lambda trace: (order.get(trace.name.removesuffix(".trace.npz"), -1),
                                          trace.name))


def _run_order(archive: Path) -> dict[str, int]:
    """run id -> its last row's place in the archive (empty where the file has no run_id
    column: the traces then go by name)."""
    import csv

    with open(archive, newline="", errors="replace") as stream:
        reader = csv.reader(stream)
        header = next(reader, [])
        if "run_id" not in header:
            return {}
        column = header.index("run_id")
        return {row[column]: place for place, row in enumerate(reader) if len(row) > column}


def cmd_analyze(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.present.report import make_console
    from stampede.results import trace as traces
    from stampede.values import did_you_mean

    if args.segments < 1:
        raise UsageError(f"--segments {args.segments}: must be at least 1")
    path, trace = _read(args)   # --chrome and --dxt were checked before (commands.outputs)
    layouts = list(trace.layouts)
    if args.layout and args.layout not in layouts:
        raise UsageError(f"--layout {args.layout}: not in {path} (it holds "
                         f"{', '.join(layouts)}){did_you_mean(args.layout, layouts)}")
    console = make_console()
    hosts = trace.meta.get("hosts_by_rank") or []
    console.print(f"stampede analyze {path}: run {trace.meta.get('run_id', '?')}, "
                  f"{len(hosts)} ranks on {len(set(hosts))} node(s); {', '.join(layouts)}",
                  markup=False)
    for layout in [args.layout] if args.layout else layouts:
        rows = trace.layouts[layout]
        choice = _iteration(args.iteration, trace, rows)
        render_layout(trace, layout, rows, choice, args.segments, console)
    if args.chrome:
        _write("--chrome", args.chrome, json.dumps(traces.chrome_events(trace)))
        print(f"wrote {args.chrome} (Chrome trace-event JSON: open it in Perfetto or "
              "chrome://tracing)", file=sys.stderr)
    if args.dxt:
        _write("--dxt", args.dxt, traces.dxt_text(trace))
        print(f"wrote {args.dxt} (Darshan DXT-like text)", file=sys.stderr)
    return 0


def _write(flag: str, path: str, text: str) -> None:
    """An export written (checked writable before the analysis; a disk that fills since is
    still one line)."""
    from stampede.errors import RunFailed

    try:
        Path(path).write_text(text)
    except OSError as error:
        raise RunFailed(f"{flag} {path}: writing it failed ({error.strerror or error})"
                        ) from None


def _read(args: argparse.Namespace) -> tuple[Path, Trace]:
    """(the first path given, its trace): stampede's own, or IOR's per-op files."""
    from stampede.errors import UsageError
    from stampede.results.ior_ops import ior_trace, is_ior_ops
    from stampede.results.readback import read_trace

    given = [Path(name) for name in args.trace]
    for path in given:   # looked at, never opened: a FIFO's open would wait for a writer
        _regular_or_missing(path)
    ior = [path for path in given if is_ior_ops(path)]
    if ior:
        if len(ior) != len(given):
            raise UsageError(f"{', '.join(str(p) for p in given if p not in ior)}: not IOR "
                             "per-op files (a stampede trace is analyzed alone)")
        if not args.ior_op:
            raise UsageError("IOR's per-op files do not say their phase: --ior-op read or "
                             "--ior-op write")
        try:
            return given[0], ior_trace(ior, args.ior_op)
        except (OSError, ValueError) as error:
            raise UsageError(str(error)) from None
    if len(given) > 1:
        raise UsageError(f"{len(given)} paths: one trace at a time (or IOR's per-op files)")
    path = find_trace(args.trace[0])
    found = read_trace(path)
    if found.value is None:   # the command's one input: nothing of it to analyze
        raise UsageError(found.notes[0], hint="`stampede report` shows the run from its "
                                              "archive; run again with --trace for a new trace")
    for note in found.notes:   # read in part: analyzed without what is damaged
        print(f"stampede: note: {note}", file=sys.stderr)
    return path, found.value


def _regular_or_missing(path: Path) -> None:
    """A path given as a trace that exists and is not a regular file: one line saying what
    it is (a FIFO, a directory, a device), not "no such trace"."""
    import os
    import stat

    from stampede.errors import UsageError
    from stampede.values import file_kind

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return   # missing: find_trace says so
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: is {file_kind(mode)}, not a trace file (a trace is "
                         "ARCHIVE.runs/RUN_ID.trace.npz; or give its archive)")


def _iteration(text: str, trace: Trace, rows: np.ndarray) -> int:
    from stampede.errors import UsageError
    from stampede.results import trace as traces

    measured = traces.iterations(rows)
    if text == "slowest":
        return traces.slowest_iteration(trace, rows)
    if not text.isdigit() or int(text) not in measured:
        raise UsageError(f"--iteration {text}: the measured iterations are "
                         f"{', '.join(map(str, measured)) or 'none'} (or slowest)")
    return int(text)


def render_layout(trace: Trace, layout: str, rows: np.ndarray, iteration: int, count: int,
                  console: Console) -> None:
    from stampede.present.tables import new_table
    from stampede.results import trace as traces
    from stampede.units import format_bytes, format_number, format_seconds

    mine = rows[rows[:, traces.ITERATION] == iteration]
    console.print(f"\n{layout}: iteration {iteration} (of {len(traces.iterations(rows))} "
                  f"measured), {len(mine)} ops on record", markup=False)
    found = traces.segments(trace, mine, count)
    table = new_table("Over time: each segment of the iteration's span",
                      ("from", "to", "GB/s", "ops/s", "ops", "errors", "ranks in op (max)",
                       "(mean)"))
    for segment in found:
        table.add_row(format_seconds(segment.start_ns / NS_PER_S), format_seconds(segment.stop_ns / NS_PER_S),
                      format_number(segment.gbps), format_number(segment.ops_per_s),
                      str(segment.ops), str(segment.errors), str(segment.inside_max),
                      f"{segment.inside_mean:.2f}")
    console.print(table)
    if found:   # every segment, those that moved nothing too (at 0)
        what, rates = traces.segment_rates(found)
        idle = sum(rate == 0 for rate in rates)
        console.print(f"segments by {what}: slowest {format_number(rates[0])}, median "
                      f"{format_number(rates[len(rates) // 2])}, fastest "
                      f"{format_number(rates[-1])}"
                      + (f" ({idle} of {len(rates)} at 0)" if idle else "")
                      + f"; most ranks inside a storage op at once: "
                        f"{max(s.inside_max for s in found)}", markup=False)
    files = traces.files_read(trace, layout, mine)
    if files:
        console.print(f"files: {len(files)}; most bytes: " + ", ".join(
            f"{name} ({format_bytes(nbytes)} in {ops} ops by {ranks} rank"
            f"{'s' if ranks > 1 else ''})" for name, ranks, ops, nbytes in files[:3]),
            markup=False)
    times = traces.rank_times(trace, mine)
    slowest = sorted(times, key=lambda each: -each.done_ns)[:SHOWN_RANKS]
    ranks = new_table(f"Ranks, slowest first ({len(slowest)} of {len(times)})",
                      ("rank", "host", "first byte", "last byte", "done"))
    for each in slowest:
        ranks.add_row(str(each.rank), each.host, _at(each.first_byte_ns), _at(each.last_byte_ns),
                      _at(each.done_ns))
    console.print(ranks)
    nodes = traces.by_node(times)
    if len(nodes) > 1:
        console.print("by node (median done, slowest first): " + ", ".join(
            f"{host} {format_seconds(done / NS_PER_S)} ({n} ranks)"
            for host, done, n in nodes[:SHOWN_RANKS]), markup=False)


def _at(ns: int) -> str:
    from stampede.units import format_seconds
    return "-" if ns < 0 else format_seconds(ns / NS_PER_S)
