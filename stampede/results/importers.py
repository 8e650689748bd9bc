"""`stampede import`: results of IOR and mdtest into a stampede archive, so the tools
users already trust sit in one comparison with stampede's runs.

- IOR: its JSON summary (`ior -O summaryFormat=JSON -O summaryFile=FILE`): one row per
  operation of each test. bwMeanMIB (MiB/s) becomes agg_gbps (GB/s = 10^9 B/s); bwMin/Max
  the spread; MeanTime elapsed_s; OPs ops_per_s; filePerProc = 1 -> layout sharded, else
  shared; transferSize -> block_bytes. IOR has no per-op latency percentiles: those
  cells stay empty, never invented.
- mdtest: the "SUMMARY rate" table of its standard output (mdtest has no JSON): one row
  per operation with ops_per_s = Mean, _min/_max = Min/Max; "File stat" -> op stat,
  "File read" -> read, other operations keep their name (file_creation, ...).
The cache state is what the user says (--cache): neither tool records it.
"""

from __future__ import annotations

import re
from typing import Any

MIB = 2**20
MDTEST_TASKS = re.compile(r"launched with (\d+) total task\(s\) on (\d+) node\(s\)")
MDTEST_ROW = re.compile(r"^\s*([A-Za-z][A-Za-z ]+?)\s*:\s*([-+0-9.eE]+)\s+([-+0-9.eE]+)\s+"
                        r"([-+0-9.eE]+)\s+([-+0-9.eE]+)\s*$")
MDTEST_OPS = {"File stat": "stat", "File read": "read"}


def _base(tool: str, job: str, cache: str, nranks: int, nnodes: int, source: str) -> dict[str, object]:
    from stampede.results.rows import new_run_id, now_stamp, shared_columns

    return {**shared_columns(new_run_id(tool), now_stamp(), job, tool, "", nranks=nranks,
                             nnodes=nnodes),
            "cache": cache, "target": source,
            "warnings": f"imported from {tool}: no latency percentiles, no per-rank detail"}


def ior_rows(document: dict[str, Any], job: str, cache: str, source: str) -> list[dict[str, object]]:
    """Rows from IOR's JSON summary (one per operation and test)."""
    from stampede.errors import UsageError

    summary = document.get("summary")
    if not isinstance(summary, list) or not summary:
        raise UsageError(f"{source}: no \"summary\" list: not IOR's JSON summary "
                         "(run ior with -O summaryFormat=JSON)")
    rows = []
    for entry in summary:
        try:
            nranks, per_node = int(entry["numTasks"]), int(entry["tasksPerNode"])
            bytes_per_rank = int(entry["blockSize"]) * int(entry.get("segmentCount", 1))
            row = _base("ior", job, cache, nranks, -(-nranks // max(per_node, 1)), source)
            row.update(
                layout="sharded" if int(entry["filePerProc"]) else "shared", format="raw",
                op=str(entry["operation"]), block_bytes=int(entry["transferSize"]),
                bytes_per_rank=bytes_per_rank, bytes_total=bytes_per_rank * nranks,
                iterations=int(entry["repetitions"]), count=int(entry["repetitions"]), errors=0,
                agg_gbps=float(entry["bwMeanMIB"]) * MIB / 1e9,
                agg_gbps_min=float(entry["bwMinMIB"]) * MIB / 1e9,
                agg_gbps_max=float(entry["bwMaxMIB"]) * MIB / 1e9,
                ops_per_s=float(entry["OPsMean"]), ops_per_s_min=float(entry["OPsMin"]),
                ops_per_s_max=float(entry["OPsMax"]), elapsed_s=float(entry["MeanTime"]),
                ranks_per_node=per_node, pattern=f"ior {entry.get('API', '')}".strip())
        except (KeyError, TypeError, ValueError) as error:
            raise UsageError(f"{source}: an IOR summary entry lacks or mangles {error}") from None
        rows.append(row)
    return rows


def mdtest_rows(text: str, job: str, cache: str, source: str) -> list[dict[str, object]]:
    """Rows from mdtest's standard output: its SUMMARY rate table."""
    from stampede.errors import UsageError

    tasks = MDTEST_TASKS.search(text)
    start = text.find("SUMMARY rate")
    if tasks is None or start < 0:
        raise UsageError(f"{source}: not mdtest output (needs the 'launched with N total "
                         "task(s)' line and the 'SUMMARY rate' table)")
    nranks, nnodes = int(tasks.group(1)), int(tasks.group(2))
    table = text[start:].split("SUMMARY time", 1)[0]
    rows = []
    for line in table.splitlines()[1:]:
        match = MDTEST_ROW.match(line)
        if not match:
            continue
        name, maximum, minimum, mean, _ = match.groups()
        row = _base("mdtest", job, cache, nranks, nnodes, source)
        row.update(layout="mdtest", op=MDTEST_OPS.get(name, name.lower().replace(" ", "_")),
                   ops_per_s=float(mean), ops_per_s_min=float(minimum),
                   ops_per_s_max=float(maximum), errors=0, pattern="mdtest")
        rows.append(row)
    if not rows:
        raise UsageError(f"{source}: the SUMMARY rate table has no operation rows")
    return rows
