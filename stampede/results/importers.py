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

import argparse
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MIB = 2**20
MDTEST_TASKS = re.compile(r"launched with (\d+) total task\(s\) on (\d+) node\(s\)")
MDTEST_ROW = re.compile(r"^\s*([A-Za-z][A-Za-z ]+?)\s*:\s*([-+0-9.eE]+)\s+([-+0-9.eE]+)\s+"
                        r"([-+0-9.eE]+)\s+([-+0-9.eE]+)\s*$")
MDTEST_OPS = {"File stat": "stat", "File read": "read"}


def _base(tool: str, job: str, cache: str, nranks: int, nnodes: int, source: str) -> dict[str, object]:
    from stampede import __version__
    from stampede.results.archive import ARCHIVE_SCHEMA, new_run_id

    stamp = datetime.now(UTC)
    return {"schema": ARCHIVE_SCHEMA, "run_id": new_run_id(tool),
            "timestamp": stamp.isoformat(timespec="seconds"), "job": job, "backend": tool,
            "cache": cache, "nranks": nranks, "nnodes": nnodes,
            "ranks_per_node": -(-nranks // max(nnodes, 1)), "valid": True,
            "stampede_version": __version__, "target": source,
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


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "import", formatter_class=formatter,
        help="Append IOR (JSON summary) or mdtest (standard output) results to an archive, "
             "to compare them with stampede runs.",
        description="Import IOR or mdtest results into a stampede archive.", epilog=__doc__)
    sub.add_argument("tool", choices=("ior", "mdtest"))
    sub.add_argument("result", help="IOR JSON summary file, or mdtest's saved output")
    sub.add_argument("--archive", required=True, help="CSV archive to append to")
    sub.add_argument("--cache", default="unknown", choices=("warm", "cold", "direct", "unknown"),
                     help="the cache state the tool ran in (it does not record it)")
    sub.add_argument("--job", default="", help="job name for the rows (default: the tool's)")
    sub.set_defaults(func=cmd_import)


def cmd_import(args: argparse.Namespace) -> int:
    from stampede.errors import UsageError
    from stampede.results.archive import append_rows, cell, check_appendable

    path = Path(args.result)
    try:
        text = path.read_text()
    except OSError as error:
        raise UsageError(f"{path}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file: not {args.tool}'s output") from None
    check_appendable(args.archive)
    job = args.job or args.tool
    if args.tool == "ior":
        start = text.find("{")  # IOR may print its banner before the JSON
        try:
            document = json.loads(text[start:]) if start >= 0 else None
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(document, dict):
            raise UsageError(f"{path}: no JSON object: not IOR's JSON summary")
        rows = ior_rows(document, job, args.cache, str(path))
    else:
        rows = mdtest_rows(text, job, args.cache, str(path))
    run_id = str(rows[0]["run_id"])  # one import is one run, whatever its row count
    append_rows(args.archive, [{k: cell(v) for k, v in {**row, "run_id": run_id}.items()}
                               for row in rows])
    print(f"imported {len(rows)} {args.tool} row(s) into {args.archive}")
    return 0
