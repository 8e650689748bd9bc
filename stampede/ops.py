"""The timed ops, written once: each op's code, kind, rows, timeline phase, retries, unit
and definition. Every list of ops elsewhere (the sample codes, the storage and network
ops, the pseudo-ops, the timeline's phases, the retried requests, pattern.ops, the
archive README's op section) derives from OPS_TABLE. The stdlib only: the CLI imports it
on every start.

A new op is one line here, the code that times it, and `results/README.md`'s op section
regenerated (`python -m stampede.ops`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Op(NamedTuple):   # not a dataclass: dataclasses imports inspect, 10 modules the CLI skips
    name: str
    # The op's index in a sample's OP column and in a trace's op list: traces and sidecars
    # already written hold these numbers, so a code is never changed or reused.
    code: int
    # delay, storage, part (of another op's sample), wait, network, check, pseudo (from
    # the phase's start until a moment of the rank), startup, device, copy, loader, setup
    # (timed before the phase's start barrier, outside it)
    kind: str
    # the phases whose rows carry it: restore, save, startup, gpu, loaders
    phases: tuple[str, ...]
    definition: str
    timeline: str = ""        # its phase in a rank's timeline (TIMELINE_COLOURS), if any
    retried: bool = False     # the storage client retries its requests (Backend.retries)
    pattern: bool = False     # a value of the job option pattern.ops
    # the unit of its rate column: "ops/s" where a count per second means something, ""
    # where it does not (pseudo-ops, waits, verify: its span is not a time anything took)
    unit: str = ""


R, S = ("restore",), ("save",)
OPS_TABLE = (
    Op("jitter", 0, "delay", R, "the random start delay (run.jitter), before the first storage op"),
    Op("list", 1, "storage", R, "list the checkpoint directory", "metadata", True, unit="ops/s"),
    Op("index", 2, "storage", (*R, "loaders"), "open, read whole and close a shared index file",
       "metadata", unit="ops/s"),
    Op("stat", 3, "storage", R, "stat a file (object stores: one HEAD)", "metadata", True, True,
       "ops/s"),
    Op("open", 4, "storage", (*R, *S), "open a file (object stores: one HEAD); a save's shared "
       "file, by its other writers", "metadata", True, True, "ops/s"),
    Op("header", 5, "storage", (*R, "loaders"), "read and parse a formatted file's header "
       "(safetensors, HDF5)", "metadata", unit="ops/s"),
    Op("read", 6, "storage", R, "read one block (os.preadv into a page-aligned buffer, or one "
       "ranged GET)", "read", True, True, "ops/s"),
    Op("ttfb", 7, "part", R, "object stores: a read's time to first byte (request sent to the "
       "first byte of the body), from the read's start stamp"),
    Op("close", 8, "storage", (*R, *S), "close a file", "metadata", True, True, "ops/s"),
    Op("wait", 9, "wait", (*R, *S), "wait for other ranks: the group's storage readers before "
       "an exchange, or a save's step that needs them all", "wait"),
    Op("bcast", 10, "network", R, "broadcast a shard to the group (layout broadcast)",
       "exchange", unit="ops/s"),
    Op("allgather", 11, "network", R, "allgather the group's stripes (layout striped)",
       "exchange", unit="ops/s"),
    Op("verify", 12, "check", R, "hash what was read and check it finite (run.verify, "
       "run.check_finite), timed apart from reads", "verify"),
    Op("restore", 13, "pseudo", R, "from the phase's start (the first rank of the node leaving "
       "the start barrier) until the rank holds all its bytes"),
    Op("interpreter", 14, "startup", ("startup",), "launch until the first line of stampede"),
    Op("import", 15, "startup", ("startup",), "the first line of stampede until its imports "
       "are done"),
    Op("mpi_init", 16, "startup", ("startup",), "imports done until MPI is initialised"),
    Op("startup", 17, "pseudo", ("startup",), "launch until MPI is initialised: the start-up's "
       "completion op"),
    Op("pin", 18, "device", ("gpu", *R), "page-lock a host buffer (stampede gpu, run.h2d)",
       "device copy"),
    Op("h2d", 19, "device", ("gpu", *R), "copy host to device (stampede gpu, run.h2d)",
       "device copy"),
    Op("barrier", 20, "network", ("startup",), "a barrier once the ranks are up (T_barrier_sync)"),
    Op("allreduce", 21, "network", ("startup",), "an allreduce once the ranks are up"),
    Op("snapshot", 22, "copy", S, "save.mode = async: copy the shard to the staging buffer, "
       "what stops training", "write"),
    Op("mkdir", 23, "storage", S, "make the version's directories (rank 0, or every rank with "
       "save.mkdir = every)", "metadata", unit="ops/s"),
    Op("create", 24, "storage", S, "create the temporary name (O_CREAT|O_EXCL; object stores: "
       "CreateMultipartUpload)", "metadata", True, unit="ops/s"),
    Op("write", 25, "storage", S, "write one block (pwritev from the page-aligned shard, O_DIRECT "
       "with run.cache = direct; object stores: UploadPart or one PUT)", "write", True, unit="ops/s"),
    Op("fsync", 26, "storage", S, "fsync a file (object stores: CompleteMultipartUpload)",
       "write", True, unit="ops/s"),
    Op("rename", 27, "storage", S, "rename the temporary name to the final one", "metadata",
       unit="ops/s"),
    Op("fsync_dir", 28, "storage", S, "fsync a directory's entries", "metadata", unit="ops/s"),
    Op("validate", 29, "check", S, "evict one extent, re-read it and hash it or check it finite, "
       "before release",
       "verify", unit="ops/s"),
    Op("publish", 30, "storage", S, "replace the layout's pointer atomically", "metadata", True,
       unit="ops/s"),
    Op("unlink", 31, "storage", S, "retention (the versions beyond save.keep, after the publish): "
       "delete a file of an old version (object stores: a DELETE)", "metadata", True, unit="ops/s"),
    Op("rmdir", 32, "storage", S, "retention: remove a directory of an old version", "metadata",
       unit="ops/s"),
    Op("blocked", 33, "pseudo", S, "phase start until the rank could train again: after the "
       "snapshot (async) or once every rank's bytes are durable (sync)"),
    Op("save", 34, "pseudo", S, "phase start until the rank's bytes are durable under their "
       "final names"),
    Op("published", 35, "pseudo", S, "rank 0: phase start until the pointer is durable"),
    Op("plan", 36, "loader", ("loaders",), "DCP's load planning and its collectives"),
    Op("load", 37, "loader", ("loaders",), "the loader's read of the tensors' bytes (bytes = "
       "what it brought in)"),
    Op("deserialise", 38, "loader", ("loaders",), "make tensors from bytes already in memory"),
    Op("touch", 39, "loader", ("loaders",), "first touch of every page of tensors returned over "
       "a file mapping: the read a mapped load defers"),
    Op("pg_init", 40, "setup", R, "run.exchange = torch: init_process_group and the exchange "
       "group, before the iteration's start barrier (T_sync)"),
    Op("bcast_first", 41, "setup", R, "run.exchange = torch: the new group's first broadcast at "
       "the shard's size, before the start barrier"),
    Op("allgather_first", 42, "setup", R, "run.exchange = torch: the new group's first "
       "allgather at the shard's size, before the start barrier"),
    Op("d2h", 43, "device", R, "copy device to host a shard that reached the device, so that "
       "run.verify and run.check_finite check host bytes"),
    Op("peer", 44, "network", (*R, *S), "`stampede rejoin`: a shard sent to or received from "
       "one other rank (a replica to its holder, a lost shard to its spare; bytes: what "
       "reached this rank)", "exchange", unit="ops/s"),
    Op("scatter", 45, "network", R, "send each rank of a node its slice of what the node's "
       "reader read (layout node-once; bytes: what reached this rank)", "exchange",
       unit="ops/s"),
)
BY_NAME = {op.name: op for op in OPS_TABLE}

# The op names by code (the order a restore runs them, and the report lists them)
OPS = tuple(op.name for op in OPS_TABLE)
OP_CODE = {op.name: op.code for op in OPS_TABLE}
# A save's ops in the order it runs them (and its report lists them); peer: a rejoin's
# replica to another node
SAVE_ORDER = ("snapshot", "mkdir", "create", "open", "write", "fsync", "close", "rename",
              "fsync_dir", "peer", "wait", "validate", "publish", "unlink", "rmdir", "blocked", "save",
              "published")


def _names(keep: Callable[[Op], bool]) -> tuple[str, ...]:
    return tuple(op.name for op in OPS_TABLE if keep(op))


STORAGE_OPS = _names(lambda op: op.kind == "storage" and "restore" in op.phases)
SAVE_STORAGE_OPS = tuple(name for name in SAVE_ORDER if BY_NAME[name].kind == "storage")
NETWORK_OPS = _names(lambda op: op.kind == "network" and "restore" in op.phases)
BEFORE_PHASE_OPS = _names(lambda op: op.kind == "setup")
PSEUDO_OPS = _names(lambda op: op.kind == "pseudo")
RATE_OPS = _names(lambda op: op.unit == "ops/s")
RETRY_OPS = _names(lambda op: op.retried)
PATTERN_OPS = _names(lambda op: op.pattern)
LOADER_OPS = _names(lambda op: "loaders" in op.phases)

# The phases of a rank's timeline, in the order drawn, each in its colour; the sidecar's
# timeline holds a column per phase (`<phase>_s`, spaces as _), in this order.
TIMELINE_COLOURS = {"metadata": "#9467bd", "read": "#1f77b4", "write": "#17becf",
                    "wait": "#bbbbbb", "exchange": "#ff7f0e", "verify": "#2ca02c",
                    "device copy": "#d62728"}
TIMELINE_PHASES = {phase: tuple(op.name for op in OPS_TABLE if op.timeline == phase)
                   for phase in TIMELINE_COLOURS}

BEGIN, END = "<!-- ops: begin -->", "<!-- ops: end -->"   # python -m stampede.ops writes between


def readme_section() -> str:
    """The archive README's op section, from the table."""
    lines = [BEGIN, "## Ops", "",
             "The values of the `op` column (stampede/ops.py). `code` is the op's number in a "
             "trace (`<run_id>.trace.npz`); `rows of` the phases whose rows carry it; "
             "`timeline` its phase in the HTML report's per-rank timeline; `retried` whether "
             "the storage client retries its requests (the `retries` column); `ops/s` whether "
             "its row has `ops_per_s`. A rank runs the stat, open, read (header first) "
             "and close of `pattern.ops` each over all its files in turn (`pattern.order = "
             "\"op\"`, the default), or every one of them on one file before the next file "
             "(`\"file\"`, mdtest -E's order; the `pattern` cell then ends ` by file`).", "",
             "| op | code | kind | rows of | timeline | retried | ops/s | definition |",
             "|---|---|---|---|---|---|---|---|"]
    for op in OPS_TABLE:
        definition = op.definition.replace("|", r"\|")   # a bare | would end the cell
        lines.append(f"| `{op.name}` | {op.code} | {op.kind} | {', '.join(op.phases)} | "
                     f"{op.timeline} | {'yes' if op.retried else ''} | "
                     f"{'yes' if op.unit else ''} | {definition} |")
    return "\n".join([*lines, END])


def readme_with_section(text: str) -> str:
    """`text` (the README) with its op section replaced by readme_section()."""
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the README has no op section between {BEGIN} and {END}")
    return head + readme_section() + tail


if __name__ == "__main__":   # rewrite the README's op section (results/README.md in a clone)
    from stampede.bundled import RESULTS_README

    RESULTS_README.write_text(readme_with_section(RESULTS_README.read_text()))
