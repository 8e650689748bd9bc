"""The archive's columns, defined once: name, type, unit, meaning, the schema since which
it exists, and whether it is part of a row's identity (two rows equal in every identity
column measured the same thing: `compare` matches on them, `project` fits across rank
counts on those that are not what a run is of).

Each `Column` drives the CSV header (stampede.results.archive), the typed reads of every
reader (stampede.results.cells) and the column section of results/README.md (`render`,
checked current by tests/results/test_columns.py). The job options' columns come from
spec.OPTIONS, as their TOML keys do. Regenerate the README's section after a change:

    python -m stampede.results.columns --write results/README.md
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stampede.results.tiers import TIERS, tier_column
from stampede.spec import FOLDED, OPTIONS, Option

ARCHIVE_SCHEMA = 9
OWN_TOOL = "stampede"   # the tool of rows stampede's own code measured
GPU_PHASE = "h2d"       # the phase of `stampede gpu`'s rows: host -> device copies
KINDS = {"text": "text", "number": "a number", "whole": "a whole number",
         "flag": "true or false"}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str            # a key of KINDS: what a cell holds
    unit: str            # s, B, GB/s, ops/s, %; "" when none
    meaning: str
    since: int           # the archive schema that added it
    identity: bool = False   # equal in two rows when they measured the same thing
    before: str = ""     # what a row of an older schema (without the column) reads as
    option: str = ""     # the job option it repeats (spec.OPTIONS), if one


def _column(name: str, kind: str, unit: str, since: int, meaning: str, *,
            identity: bool = False, before: str = "") -> Column:
    return Column(name, kind, unit, meaning, since, identity, before)


_S, _B = "s", "B"
_RESTORE_ROW = "the completion row (restore, save or startup): "
# The columns written by stampede itself, in the CSV's order (DESIGN.md's required ones
# first). The meanings are results/README.md's.
OWN: tuple[Column, ...] = (
    _column("schema", "whole", "", 1, "archive schema version of the row (history in "
            "`stampede/results/archive.py`)"),
    _column("run_id", "text", "", 1, "`<UTC time>-[<tag>-]<random>`: one invocation (all "
            "its layouts); the tag names the command for `loaders` and `import` runs"),
    _column("timestamp", "text", "", 1, "UTC start of the run, ISO 8601"),
    _column("job", "text", "", 1, "job file name without `.toml` (`gpu`, `startup` for "
            "those commands)"),
    _column("backend", "text", "", 1, "storage the row's bytes came from or went to: the "
            "target's URL scheme (`posix`, `nfs`, `s3`, `memory`, `gs`, `file`); `-` where no "
            "storage is involved (`stampede startup`, `stampede gpu`'s memory modes); "
            "imported rows: the tool (`ior`, `mdtest`)", identity=True),
    _column("layout", "text", "", 1, "the layout the row measured (docs/concepts/layouts.md has the table); "
            "an existing checkpoint's rows: the assign policy (`files`, `tensor-slices`, "
            "`saved`, `reshard`); `startup` for `stampede startup`; `stampede gpu`: the mode (`pageable`, "
            "`pinned`, `file`, ...)", identity=True),
    _column("format", "text", "", 1, "`checkpoint.format` (raw, safetensors, hdf5), or the "
            "format found in an existing checkpoint", identity=True),
    _column("cache", "text", "", 1, "`run.cache`: warm, cold or direct (`-`: no file read)",
            identity=True),
    _column("nranks", "whole", "", 1, "MPI ranks", identity=True),
    _column("nnodes", "whole", "", 1, "distinct hosts"),
    _column("ranks_per_node", "whole", "", 1, "most ranks on one host"),
    _column("bytes_total", "whole", _B, 1, "checkpoint bytes restored (or saved) per "
            "iteration by all ranks"),
    _column("block_bytes", "whole", _B, 1, "`checkpoint.block_size`: bytes per read or "
            "write op (`stampede gpu`: the size copied)", identity=True),
    _column("iterations", "whole", "", 1, "measured iterations that produced samples (fewer "
            "than asked if the run stopped)"),
    _column("op", "text", "", 1, "the timed op (or pseudo-op) of the row: the ops section of "
            "this README lists them", identity=True),
    _column("count", "whole", "", 1, "successful ops over all ranks and measured iterations"),
    _column("errors", "whole", "", 1, "failed ops over all ranks and measured iterations "
            "(verify: a hash mismatch or non-finite values)"),
    *(_column(f"lat_{name}_s", "number", _S, 1, f"latency {label} over every successful "
              "sample (linear interpolation)")
      for name, label in (("min", "minimum"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"),
                          ("p999", "p99.9"), ("max", "maximum"))),
    _column("ops_per_s", "number", "ops/s", 1, "count / elapsed per iteration, median over "
            "iterations"),
    _column("agg_gbps", "number", "GB/s", 1, "bytes / elapsed / 10^9 per iteration, median "
            "over iterations; never a sum of per-rank rates. On the restore row the bytes are "
            "those every rank ends up holding, so for `broadcast` and `striped` it exceeds the "
            "read row's (bytes read from storage)"),
    _column("time_to_last_rank_s", "number", _S, 1, _RESTORE_ROW + "the slowest rank's time, "
            "median over iterations"),
    _column("first_done_s", "number", _S, 1, _RESTORE_ROW + "the fastest rank's time, median "
            "over iterations"),
    _column("straggler_ratio", "number", "", 1, _RESTORE_ROW + "slowest / median rank time, "
            "median over iterations"),
    _column("valid", "flag", "", 1, "`false` when an op failed or the deadline was reached "
            "(`invalid_reason` says why)"),
    _column("stampede_version", "text", "", 1, "the version of stampede that wrote the row"),
    _column("hosts", "text", "", 1, "host names (the first 8, then how many more)"),
    _column("slurm_job_id", "text", "", 1, "`SLURM_JOB_ID`, if set"),
    _column("bytes_per_rank", "whole", _B, 1, "bytes each rank restores per iteration (an "
            "existing checkpoint's ranks differ: the largest share)", identity=True),
    _column("op_bytes", "whole", _B, 1, "bytes moved by the successful ops, all ranks and "
            "iterations"),
    _column("elapsed_s", "number", _S, 1, "max(stop) - min(start) over all ranks, median "
            "over iterations"),
    *(_column(name, "number", unit, 1, f"the {extreme} iteration's `{of}` (its spread)")
      for of, unit, low, high in (
          ("ops_per_s", "ops/s", "ops_per_s_min", "ops_per_s_max"),
          ("agg_gbps", "GB/s", "agg_gbps_min", "agg_gbps_max"),
          ("time_to_last_rank_s", _S, "time_to_last_rank_min_s", "time_to_last_rank_max_s"))
      for name, extreme in ((low, "lowest"), (high, "highest"))),
    _column("slowest_rank_gbps", "number", "GB/s", 1, _RESTORE_ROW + "bytes_per_rank / "
            "time_to_last_rank_s / 10^9 (`BW_rank_io` of the recovery model)"),
    _column("slowest_ranks", "text", "", 1, _RESTORE_ROW + "up to three `rank@host:seconds`, "
            "slowest first (median per rank)"),
    _column("storage_s", "number", _S, 1, _RESTORE_ROW + "first start to last stop over all "
            "ranks of the storage ops (median over iterations)"),
    _column("network_s", "number", _S, 1, _RESTORE_ROW + "first start to last stop over all "
            "ranks of the exchange ops (median over iterations)"),
    _column("storage_ops_per_iteration", "number", "", 1, _RESTORE_ROW + "storage ops of all "
            "ranks per iteration (median)"),
    _column("storage_bytes_per_iteration", "number", _B, 1, _RESTORE_ROW + "bytes read from "
            "storage by all ranks per iteration (median)"),
    _column("device", "text", "", 1, "host -> device rows (`stampede gpu`, `run.h2d`): the "
            "device (a `host` stand-in says so); loader rows: where the tensors went (`cpu`, "
            "or the GPU as `stampede gpu` names it)"),
    _column("link_peak_gbps", "number", "GB/s", 1, "host -> device rows: the link's nominal "
            "one-way peak"),
    _column("samples", "text", "", 1, "`exact` (every sample reached rank 0) or `histogram` "
            "(p50..p99.9 from logarithmic buckets, within 1% of the exact values)"),
    _column("fs_type", "text", "", 1, "file-system type of the target (from /proc/mounts)",
            identity=True),
    _column("invalid_reason", "text", "", 1, "why the row is not valid; empty when it is"),
    _column("warnings", "text", "", 1, "why a number should not be trusted as it stands, "
            "`|`-separated"),
    _column("retries", "whole", "", 2, "storage-op rows: requests the storage client "
            "retried on its own (503 SlowDown, timeouts), over all ranks of the layout; not in "
            "`count`; 0 on POSIX"),
    _column("cache_resident_pct", "number", "%", 2, "`run.cache = cold` on POSIX: median "
            "over iterations of the share of the bytes the ranks were about to read still in "
            "the page cache after eviction (mincore); ~0 when the eviction worked; empty for "
            "warm and direct runs and on object stores"),
    _column("phase", "text", "", 3, "what the row's run measured: `restore`, `save`, "
            "`startup` or `h2d` (`stampede gpu`'s host -> device sweep; its rows of schemas "
            "1-4 said `restore`)", identity=True, before="restore"),
    _column("unprotected_s", "number", _S, 3, "save rows: the longest window of an iteration "
            "without a valid published version (0 when retention waited for the publish); "
            "`stampede rejoin`'s tier layouts: how long the published version was not yet on "
            "that tier on every node (0 for the tiers `tiers.publish` waited for)"),
    _column("restored_from", "text", "", 3, "restore rows of a saved checkpoint: the version "
            "restored (`saves/LAYOUT/vNNNNNN`); empty for a prepared one"),
    _column("tool", "text", "", 5, "whose code did the timed I/O: `stampede` (its own "
            "restore, save, startup and host -> device copies), a loader of `stampede "
            "loaders` (`safetensors`, `torch.load`, `dcp`, `runai`, `fastsafetensors`, "
            "`tensorizer`), or the tool of imported results (`ior`, `mdtest`); rows of "
            "schemas 1-4 read as what their `backend` said", identity=True),
    _column("notes", "text", "", 5, "what a run says of itself beside its numbers, not a "
            "warning (`stampede rejoin`: the tier each rank restored from, a fall-back to the "
            "next tier and why), `|`-separated"),
    *(_column(tier_column(tier), "whole", _B, 5, _RESTORE_ROW + "`stampede rejoin`'s "
              f"restores: bytes all ranks restored from the {tier} tier (last iteration)")
      for tier in TIERS),
    _column("throttles", "whole", "", 6, "storage-op rows: answers that said the storage "
            "was throttling (429, 503 SlowDown) over all ranks of the layout, retried (in "
            "`retries`) or, when the attempts ran out, an error (in `errors`); 0 where nothing "
            "throttles (POSIX, NFS)"),
    _column("backoff_s", "number", _S, 6, "storage-op rows: seconds the storage client "
            "waited before its retries and for its own rate limiter (`retry_mode = "
            "adaptive`), summed over all ranks and iterations of the layout; inside the op's "
            "latencies"),
    _column("needed_bytes", "whole", _B, 7, "restore rows: the unique bytes of the checkpoint "
            "the job needed, the union of what its ranks must end up holding (the checkpoint's "
            "size for a full restore; an existing checkpoint's: its tensors' bytes), from the "
            "plan, whatever the layout read"),
    _column("read_amplification", "number", "", 7, "restore rows: "
            "storage_bytes_per_iteration / needed_bytes: 1 when each needed byte was read once, "
            "N when N ranks each read the whole file (layout whole-file); below 1 where "
            "ranks take bytes from each other rather than from storage; a loader's rows "
            "(`stampede loaders`): the bytes it loaded (op `load`) over those assigned"),
    _column("read_amplification_node_max", "number", "", 7, "restore rows: the most over "
            "nodes (hosts) of a node's bytes read from storage per iteration over the bytes its "
            "ranks need (a shard two of its ranks hold counts once)"),
    _column("read_amplification_rank_max", "number", "", 7, "restore rows: the most over "
            "ranks of a rank's bytes read from storage per iteration over the bytes it must "
            "end up holding"),
    _column("ceiling_gbps", "number", "GB/s", 8, "restore rows of a run with `run.ceiling = "
            "true`: the slowest node's raw-read ceiling, measured before the first layout (the "
            "best GB/s of 1, 4, 16 and 32 streams of large sequential reads of the node's "
            "share of the checkpoint, cold); every node's every stream count is in the "
            "sidecar's `ceiling`"),
    _column("ceiling_gbps_max", "number", "GB/s", 8, "restore rows: the fastest node's "
            "raw-read ceiling (as `ceiling_gbps`)"),
    _column("ceiling_efficiency", "number", "", 8, "restore rows: the layout's storage GB/s "
            "per node (storage_bytes_per_iteration / nnodes / storage_s) over the nodes' mean "
            "raw-read ceiling: 1 when each node read as fast as raw large reads can; a "
            "loader's rows (`stampede loaders`): its restore GB/s per node over the same"),
)
# The options whose columns are part of a row's identity: they change what an op costs.
IDENTITY_OPTIONS = ("pattern", "replicas", "broadcast_group", "index_bytes", "stat_count",
                    "open_count", "verify", "jitter", "h2d", "save_mode", "durability",
                    "validate", "mkdir_by", "fanout", "workload", "scale", "subset", "exchange",
                    "copies", "key_prefix")
# The schema that added each option's column (the others came with schema 1) and what an
# older row, written before the option existed, measured.
OPTION_SINCE = {
    **dict.fromkeys(("storage_options", "stripe_count", "stripe_size", "dtype", "drop_caches",
                     "rank_shift", "check_finite", "checkpoint_source", "assign", "from"), 2),
    **dict.fromkeys(("fanout", "save_mode", "durability", "validate", "keep", "mkdir_by",
                     "part_size", "restore_from"), 3),
    **dict.fromkeys(("workload", "scale", "subset", "exchange"), 4),
    "ceiling": 8,
    "prefetch_bytes": 9,   # rows before it prefetched nothing (OPTION_BEFORE)
    # `stampede rejoin`'s tiers: not identity (their layouts, tier-* and rejoin, already
    # tell its rows apart, and other rows run none of them)
    **dict.fromkeys(("tier_dir", "tier_peers", "tier_placement", "spare_nodes", "lost_nodes",
                     "tier_publish", "tier_drain", "tier_versions", "keep_local", "keep_peer",
                     "keep_storage"), 5),
    **dict.fromkeys(("copies", "key_prefix"), 7),
}
# Rows of schemas 1-3 exchanged over MPI and ran no MLPerf workload, rows before 7 read one
# copy under plain keys, rows before 8 measured no ceiling (compared on).
OPTION_BEFORE = {"exchange": "mpi", "workload": "none", "scale": "1", "subset": "false",
                 "copies": "1", "key_prefix": "none", "ceiling": "false",
                 "prefetch_bytes": "0"}
# Option columns whose cells are sizes in bytes or seconds (their defaults do not say).
OPTION_UNITS = {"size_total_requested": _B, "size_per_rank_requested": _B, "index_bytes": _B,
                "block_bytes": _B, "prefetch_bytes": _B, "stripe_size": _B, "part_size": _B, "deadline_s": _S}


def _option_kind(option: Option) -> str:
    if option.column in OPTION_UNITS:
        return "whole" if OPTION_UNITS[option.column] == _B else "number"
    if isinstance(option.default, bool):
        return "flag"
    return {int: "whole", float: "number"}.get(type(option.default), "text")


def _option_column(option: Option) -> Column:
    return Column(option.column, _option_kind(option), OPTION_UNITS.get(option.column, ""),
                  f"`{option.key}`: {option.help}", OPTION_SINCE.get(option.column, 1),
                  option.column in IDENTITY_OPTIONS, OPTION_BEFORE.get(option.column, ""),
                  option.key)


_OWN_NAMES = {column.name for column in OWN}
REGISTRY: tuple[Column, ...] = OWN + tuple(
    _option_column(option) for option in OPTIONS
    if option.column and option.column not in _OWN_NAMES)   # "": spec.FOLDED
BY_NAME = {column.name: column for column in REGISTRY}
COLUMNS = tuple(column.name for column in REGISTRY)
REQUIRED_COLUMNS = COLUMNS[:COLUMNS.index("slurm_job_id") + 1]   # DESIGN.md's contract
# What a measurement is of (which layout, op, rank count, bytes per rank), as opposed to
# its configuration: `project` fits one configuration's runs across rank counts.
OF_WHAT = ("layout", "op", "nranks", "bytes_per_rank")
IDENTITY_COLUMNS = OF_WHAT + tuple(column.name for column in REGISTRY
                                   if column.identity and column.name not in OF_WHAT)
CONFIG_COLUMNS = IDENTITY_COLUMNS[len(OF_WHAT):]
# Older rows lack these columns: read as what such a row measured.
BEFORE = {column.name: column.before for column in REGISTRY if column.before}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """results/README.md's column section (markdown), from the registry."""
    lines = [
        "## Columns",
        "",
        f"Schema {ARCHIVE_SCHEMA}. Type: what a cell holds (an empty cell is \"not "
        "applicable\" in every type); since: the schema that added the column (an older "
        "row reads as empty, or as the value said); identity: equal in two rows that "
        "measured the same thing (`stampede compare` matches on these).",
        "",
        "| column | type | unit | since | identity | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for column in OWN:
        lines.append(_table_row(column, column.meaning))
    lines += ["", "The job options, one column each, as given (`stampede run --help` lists "
              "them with their defaults); an option in another's cell says so there:", "",
              "| column | type | unit | since | identity | option |",
              "|---|---|---|---|---|---|"]
    for column in REGISTRY[len(OWN):]:
        before = f"; older rows read as `{column.before}`" if column.before else ""
        folded = "".join(f"; with `{key}` (see its help)" for key, into in FOLDED.items()
                         if into == column.name)
        lines.append(_table_row(column, f"`{column.option}`{folded}{before}"))
    return "\n".join(lines) + "\n"


def _table_row(column: Column, meaning: str) -> str:
    return (f"| `{column.name}` | {column.kind} | {column.unit} | {column.since} | "
            f"{'yes' if column.identity else ''} | {_cell(meaning)} |")


BEGIN = ("<!-- BEGIN columns: generated from stampede/results/columns.py by "
         "`python -m stampede.results.columns --write results/README.md`; do not edit -->")
END = "<!-- END columns -->"


def replace_section(text: str, section: str) -> str:
    """`text` with what lies between BEGIN and END replaced by `section`."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"no {BEGIN!r} ... {END!r} markers")
    return text[:start + len(BEGIN)] + "\n" + section + text[stop:]


def main(argv: Sequence[str]) -> int:
    """Print the section, or (--write README) rewrite it between the markers."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(replace_section(path.read_text(), render()))
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
