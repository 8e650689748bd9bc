"""IOR's per-op record (`-O savePerOpDataCSV=FILE`) read as a trace, so that `stampede
analyze` says of an IOR run what it says of its own: throughput and ranks inside an op
over time, first and last byte per rank.

What IOR 4.1 writes (checked on its output here): one file per test and rank,
FILE-TEST-RANK.csv (rank in five digits), a header `time,runtime,tp` and a row per
transfer: its start (s, on the rank's clock from the phase's start), its duration (s) and
its throughput (bytes/s). Nothing says which phase: when IOR writes and reads in one
test, the file holds the last phase's transfers; the op is given (--ior-op). Bytes are
tp x runtime, rounded: IOR prints both to 7 significant digits, so a transfer's bytes are
within 1e-6 of its size. No file or offset: -1, as an op of no file.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np

from stampede.ops import OP_CODE, OPS
from stampede.results.trace import TRACE_COLUMNS, Trace
from stampede.units import NS_PER_S

HEADER = ["time", "runtime", "tp"]
RANK_IN_NAME = re.compile(r"-(\d+)-(\d{5})\.csv$")   # FILE-TEST-RANK.csv
COMPLETION = {"read": "restore", "write": "save"}


def is_ior_ops(path: Path) -> bool:
    """An IOR per-op CSV: its name and its first line say so."""
    if not RANK_IN_NAME.search(path.name):
        return False
    try:
        with open(path, newline="") as stream:
            return next(csv.reader(stream), []) == HEADER
    except (OSError, UnicodeDecodeError):
        return False


def ior_trace(paths: list[Path], op: str) -> Trace:
    """The files' transfers as one trace of one layout ("ior"), op `op` (read or write),
    each rank's phase ending at its last transfer (the completion op: restore or save).
    ValueError naming the file, line and what is wrong."""
    rows: list[list[int]] = []
    ranks: set[int] = set()
    for path in sorted(paths):
        found = RANK_IN_NAME.search(path.name)
        if found is None:
            raise ValueError(f"{path}: not an IOR per-op file name (FILE-TEST-RANK.csv)")
        rank = int(found.group(2))
        if rank in ranks:
            raise ValueError(f"{path}: rank {rank} given twice (one test's files at a time)")
        ranks.add(rank)
        mine = _transfers(path, op, rank)
        last = max((row[3] for row in mine), default=0)
        rows += mine + [[0, OP_CODE[COMPLETION[op]], 0, last, sum(r[4] for r in mine), 1, rank,
                         -1, -1]]
    array = np.array(rows, dtype=np.int64).reshape(-1, len(TRACE_COLUMNS))
    hosts = ["?"] * (max(ranks) + 1 if ranks else 0)
    meta = {"run_id": f"ior {paths[0].name if paths else ''}", "columns": list(TRACE_COLUMNS),
            "ops": list(OPS), "layouts": ["ior"], "units": "ns", "hosts_by_rank": hosts,
            "files": {"ior": []}, "source": "IOR savePerOpDataCSV"}
    return Trace(meta, {"ior": array})


def _transfers(path: Path, op: str, rank: int) -> list[list[int]]:
    with open(path, newline="") as stream:
        reader = csv.reader(stream)
        if next(reader, []) != HEADER:
            raise ValueError(f"{path}: line 1 is not IOR's per-op header {','.join(HEADER)}")
        found = []
        for number, fields in enumerate(reader, start=2):
            try:
                start_s, runtime_s, rate = (float(field) for field in fields)
            except ValueError:
                raise ValueError(f"{path}: line {number}: {','.join(fields)!r} is not three "
                                 "numbers (time, runtime, tp)") from None
            if min(start_s, runtime_s, rate) < 0:
                raise ValueError(f"{path}: line {number}: a negative time, runtime or tp")
            start = round(start_s * NS_PER_S)
            found.append([0, OP_CODE[op], start, start + round(runtime_s * NS_PER_S),
                          round(rate * runtime_s), 1, rank, -1, -1])
    return found
