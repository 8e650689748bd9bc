"""`stampede import`: results of IOR and mdtest into a stampede archive, so the tools
users already trust sit in one comparison with stampede's runs. Each column keeps
stampede's meaning; where a tool cannot give it, the cell stays empty and the row's
`warnings` say what the imported numbers are.

- IOR: its JSON summary (`ior -O summaryFormat=JSON -O summaryFile=FILE`): one row per
  operation of each test. filePerProc = 1 -> layout sharded, else shared; transferSize ->
  block_bytes; iterations = repetitions. count = the transfers (one read or write of
  transferSize each, stampede's per-op sample) the test asked for: blockSize /
  transferSize x segmentCount x numTasks x repetitions, and op_bytes = count x
  transferSize. agg_gbps (GB/s = 10^9 B/s, from IOR's MiB/s), ops_per_s and elapsed_s are
  the median over the repetitions, as stampede's are over iterations, from the per-
  repetition "Results" (IOR's summary means where a file has none); _min/_max their
  spread. IOR times each repetition from open to close, so its GB/s includes open and
  close. IOR has no per-op latency percentiles: those cells stay empty, never invented.
- mdtest: the "SUMMARY rate" table of its standard output (mdtest has no JSON): mdtest 4
  (`File stat   1355844.189 ...`), mdtest 3 (`File stat   :   ...`) and -P (per-rank
  columns first; the per-iteration ones are kept). One row per operation that ran:
  ops_per_s = Mean over iterations (mdtest prints no per-iteration values, so no median),
  _min/_max = Min/Max; iterations = "(of N iterations)"; count = the items of its "N tasks,
  M files" line x iterations (file and directory ops; tree ops: empty). mdtest prints a
  row of zeros for a phase it did not run (File read without -E): no row. "File stat" ->
  op stat, "File read" -> read (so `compare --match op,nranks,cache` sets them against
  stampede's); other operations keep their name (file_creation, tree_removal, ...).
The cache state is what the user says (--cache): neither tool records it.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stampede.units import BYTES_PER_GB, BYTES_PER_MIB

NO_DETAIL = "no latency percentiles, no per-rank detail"
MDTEST_LAUNCHED = re.compile(r"launched with (\d+) total task\(s\) on (\d+) node\(s\)")
# Before each rank count's results: "2 tasks, 2000 files" (items per iteration, all tasks).
MDTEST_ITEMS = re.compile(r"^(\d+) tasks, (\d+) (files/directories|files|directories)\s*$",
                          re.MULTILINE)
MDTEST_RATES = re.compile(r"^SUMMARY rate\b.*\(of (\d+) iterations?\)", re.MULTILINE)
# A row of the rate table: a name, mdtest 3's colon, then 4 numbers (max min mean sd) or,
# with -P, 7 (per-rank max min mean first).
NUMBER = r"[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?"
MDTEST_ROW = re.compile(rf"^\s+([A-Za-z][A-Za-z ]*?)\s*(?::\s*|\s+)"
                        rf"({NUMBER}(?:\s+{NUMBER}){{6}}|{NUMBER}(?:\s+{NUMBER}){{3}})\s*$")
MDTEST_OPS = {"File stat": "stat", "File read": "read"}
# Which ops the items of the "N tasks, M <kind>" line are: tree ops are neither.
MDTEST_COUNTED = {"files": ("file",), "directories": ("directory",),
                  "files/directories": ("file", "directory")}
# In an IOR row's warnings when a file lacks its repetitions' results: what a reader that
# needs the per-repetition median (bench/nfs_vs_ior.py) must refuse.
IOR_MEANS = "IOR's mean over repetitions, not a median"


@dataclass(frozen=True)
class Origin:
    """Where imported rows come from: one import is one run (one run_id for its rows)."""
    tool: str
    job: str
    cache: str
    source: str
    run_id: str

    @classmethod
    def new(cls, tool: str, job: str, cache: str, source: str) -> Origin:
        from stampede.results.rows import new_run_id

        return cls(tool, job, cache, source, new_run_id(tool))

    def row(self, nranks: int, nnodes: int, notes: Sequence[str]) -> dict[str, object]:
        """The columns every row shares, the cache the user named and the warnings."""
        from stampede.results.rows import now_stamp, shared_columns

        return {**shared_columns(self.run_id, now_stamp(), self.job, self.tool, "",
                                 nranks=nranks, nnodes=nnodes, tool=self.tool),
                "cache": self.cache, "target": self.source,
                "warnings": " | ".join((f"imported from {self.tool}", *notes, NO_DETAIL))}


class Refused(Exception):
    """What an importer cannot take, said as `where: field = value: what is allowed`."""


def _integer(table: dict[str, object], field: str, where: str, least: int = 1) -> int:
    value = table.get(field, "missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise Refused(f"{where}.{field} = {value!r}: must be a whole number >= {least}")
    return value


def _number(table: dict[str, object], field: str, where: str) -> float:
    value = table.get(field, "missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise Refused(f"{where}.{field} = {value!r}: must be a finite number >= 0")
    return float(value)


def ior_rows(document: dict[str, object], job: str, cache: str, source: str) -> list[dict[str, object]]:
    """Rows from IOR's JSON summary (one per operation and test). Every field a row takes
    is checked (a negative transferSize once made a count of -6,442,450,944): a file that
    does not hold what IOR writes is refused, naming the entry and the field."""
    from stampede.errors import UsageError

    summary = document.get("summary")
    if not isinstance(summary, list) or not summary:
        raise UsageError(f"{source}: no \"summary\" list: not IOR's JSON summary "
                         "(run ior with -O summaryFormat=JSON)")
    repetitions = _ior_repetitions(document)
    origin = Origin.new("ior", job, cache, source)
    rows = []
    for index, entry in enumerate(summary):
        where = f"summary[{index}]"
        try:
            if not isinstance(entry, dict):
                raise Refused(f"{where} = {entry!r}: must be an object of IOR's fields")
            key = (str(entry.get("TestID", 0)), str(entry.get("operation")))
            rows.append(_ior_row(entry, repetitions.get(key, []), origin, where))
        except Refused as refused:
            raise UsageError(f"{source}: {refused}") from None
    return rows


def _ior_repetitions(document: dict[str, object]) -> dict[tuple[str, str], list[dict[str, object]]]:
    """Each test's per-repetition results by (TestID, access). IOR 4 lists them flat,
    IOR 3 one list per repetition."""
    found: dict[tuple[str, str], list[dict[str, object]]] = {}
    tests = document.get("tests")
    for test in tests if isinstance(tests, list) else ():
        if not isinstance(test, dict) or not isinstance(test.get("Results"), list):
            continue
        for item in test["Results"]:
            for result in item if isinstance(item, list) else [item]:
                if isinstance(result, dict) and "access" in result:
                    key = (str(test.get("TestID", 0)), str(result["access"]))
                    found.setdefault(key, []).append(result)
    return found


def _ior_row(entry: dict[str, Any], repetitions: list[dict[str, object]], origin: Origin,
             where: str) -> dict[str, object]:
    nranks, per_node = _integer(entry, "numTasks", where), _integer(entry, "tasksPerNode", where)
    block, transfer = _integer(entry, "blockSize", where), _integer(entry, "transferSize", where)
    segments = _integer({"segmentCount": 1, **entry}, "segmentCount", where)
    reps = _integer(entry, "repetitions", where)
    if per_node > nranks:
        raise Refused(f"{where}.tasksPerNode = {per_node}: more than numTasks ({nranks})")
    if block % transfer:
        raise Refused(f"{where}.blockSize = {block}: not a multiple of transferSize ({transfer})")
    if entry.get("filePerProc") not in (0, 1) or isinstance(entry.get("filePerProc"), bool):
        raise Refused(f"{where}.filePerProc = {entry.get('filePerProc', 'missing')!r}: must be 0 or 1")
    if entry.get("operation") not in ("read", "write"):
        raise Refused(f"{where}.operation = {entry.get('operation', 'missing')!r}: must be "
                      "\"read\" or \"write\"")
    # stampede's count is its samples: one per read of block_bytes; IOR's are transfers
    transfers = block // transfer * segments * nranks * reps
    if len(repetitions) == reps:
        results = [(f"{where}'s Results[{number}]", result)
                   for number, result in enumerate(repetitions)]
        bw_mib = [_number(result, "bwMiB", name) for name, result in results]
        ops = [_number(result, "iops", name) for name, result in results]
        rates = {"agg_gbps": [value * BYTES_PER_MIB / BYTES_PER_GB for value in bw_mib], "ops_per_s": ops}
        elapsed_s = statistics.median(_number(result, "totalTime", name)
                                      for name, result in results)
        how = f"median of IOR's {len(repetitions)} repetitions"
        values = {f"{column}{tail}": pick(series) for column, series in rates.items()
                  for tail, pick in (("", statistics.median), ("_min", min), ("_max", max))}
    else:  # no (or not every) repetition's results: IOR's means stand in for medians
        values = {"agg_gbps": _number(entry, "bwMeanMIB", where) * BYTES_PER_MIB / BYTES_PER_GB,
                  "agg_gbps_min": _number(entry, "bwMinMIB", where) * BYTES_PER_MIB / BYTES_PER_GB,
                  "agg_gbps_max": _number(entry, "bwMaxMIB", where) * BYTES_PER_MIB / BYTES_PER_GB,
                  "ops_per_s": _number(entry, "OPsMean", where),
                  "ops_per_s_min": _number(entry, "OPsMin", where),
                  "ops_per_s_max": _number(entry, "OPsMax", where)}
        elapsed_s = _number(entry, "MeanTime", where)
        how = IOR_MEANS
    notes = (f"count = transfers asked for (blockSize/transferSize x segmentCount x numTasks "
             f"x repetitions = {block // transfer} x {segments} x {nranks} x {reps})",
             f"agg_gbps, ops_per_s, elapsed_s: {how}; IOR's time spans open to close")
    row = origin.row(nranks, -(-nranks // max(per_node, 1)), notes)
    row.update(values)
    row.update(layout="sharded" if int(entry["filePerProc"]) else "shared", format="raw",
               op=str(entry["operation"]), block_bytes=transfer, bytes_per_rank=block * segments,
               phase="save" if entry["operation"] == "write" else "restore",
               bytes_total=block * segments * nranks, iterations=reps, count=transfers,
               op_bytes=transfers * transfer, errors=0, elapsed_s=elapsed_s,
               ranks_per_node=per_node, pattern=f"ior {entry.get('API', '')}".strip())
    return row


def mdtest_rows(text: str, job: str, cache: str, source: str) -> list[dict[str, object]]:
    """Rows from mdtest's standard output: its SUMMARY rate table(s), one per rank count;
    what cannot be fully parsed is refused, naming the line."""
    from stampede.errors import UsageError

    launched = MDTEST_LAUNCHED.search(text)
    tables = list(MDTEST_RATES.finditer(text))
    if launched is None or not tables:
        raise UsageError(f"{source}: not mdtest output (needs the 'launched with N total "
                         "task(s)' line and a 'SUMMARY rate' table; mdtest -Z prints times only)")
    origin = Origin.new("mdtest", job, cache, source)
    rows = []
    try:
        for table in tables:
            before = list(MDTEST_ITEMS.finditer(text, 0, table.start()))
            items = before[-1] if before else None  # this rank count's items, when printed
            nranks = int(items.group(1)) if items else int(launched.group(1))
            nnodes = min(int(launched.group(2)), nranks)
            for match, what in ((launched, "tasks"), (items, "tasks"), (items, "items"),
                                (table, "iterations")):
                group = 2 if what == "items" else 1
                if match is not None and int(match.group(group)) < 1:
                    raise Refused(f"line {_line_of(text, match.start())}: {match.group(0).strip()!r}"
                                  f": the {what} must be at least 1")
            rows += _mdtest_table(text, table.end(), int(table.group(1)), nranks, nnodes, items,
                                  origin)
    except Refused as refused:
        raise UsageError(f"{source}: {refused}") from None
    if not rows:
        raise UsageError(f"{source}: the SUMMARY rate table has no operation that ran "
                         "(mdtest prints zeros for a phase it skipped)")
    return rows


def _line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _mdtest_table(text: str, start: int, iterations: int, nranks: int, nnodes: int,
                  items: re.Match[str] | None, origin: Origin) -> list[dict[str, object]]:
    """The rows of one rate table: the indented lines under its title (after `start`), to
    the line that ends it. Refused: a line in it that is not a row, rates that cannot be
    (min > mean > max, negative), a table the file ends in (output cut short)."""
    rows = []
    first = _line_of(text, start) + 1
    lines = text[start:].splitlines()[1:]
    for number, line in enumerate(lines, first):
        if line[:1].strip():  # the next title, "-- finished", or the next rank count
            break
        if not line.strip() or set(line.split()) <= {"Operation", "Max", "Min", "Mean", "Std",
                                                     "Dev", "---", "---------", "----",
                                                     "-------"} or "Rank" in line:
            continue          # the column titles and their underlines
        match = MDTEST_ROW.match(line)
        try:
            if not match:
                raise ValueError
            name, numbers = match.group(1), [float(value) for value in match.group(2).split()[-4:]]
        except ValueError:
            raise Refused(f"line {number}: {line.strip()!r}: not a row of mdtest's rate table "
                          "(an operation, then max, min, mean and std dev)") from None
        maximum, minimum, mean = numbers[:3]
        if not maximum >= mean >= minimum >= 0 or any(not math.isfinite(v) for v in numbers):
            raise Refused(f"line {number}: {name}: max {maximum:g}, min {minimum:g}, mean "
                          f"{mean:g}: must be max >= mean >= min >= 0")
        if maximum == minimum == mean == 0:
            continue  # a phase mdtest did not run
        kind = name.split()[0].lower()  # file, directory, tree
        count = None
        counted = "count: not in mdtest's output"
        if items is not None and kind in MDTEST_COUNTED[items.group(3)]:
            count = int(items.group(2)) * iterations
            counted = f"count = {items.group(2)} {items.group(3)} x {iterations} iterations"
        row = origin.row(nranks, nnodes,
                         (f"ops_per_s = mdtest's mean over {iterations} iteration(s), not a median",
                          counted))
        op = MDTEST_OPS.get(name, name.lower().replace(" ", "_"))
        # what a restore does (stat, read) against what a save does (create, remove)
        row.update(layout="mdtest", op=op, phase="restore" if op in ("stat", "read") else "save",
                   ops_per_s=mean, ops_per_s_min=minimum, ops_per_s_max=maximum,
                   iterations=iterations, count=count, errors=0, pattern="mdtest")
        rows.append(row)
    else:
        raise Refused(f"line {first + len(lines) - 1}: the file ends inside a SUMMARY rate "
                      "table: mdtest's output is cut short")
    return rows
