"""The job specification: the only place options are defined.

Each `Option` below is defined once and drives the TOML key, the `--set` override, the
CSV column and the `stampede plan` output. A job is loaded, overridden and validated
here, before any I/O; every error names the file, the key, the value and what is allowed.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from stampede import values
from stampede.dtypes import WRITTEN
from stampede.errors import UsageError
from stampede.layouts import NAMES as LAYOUTS
from stampede.ops import PATTERN_OPS
from stampede.spec_fields import SpecFields
from stampede.spec_rules import check_combination
from stampede.units import BYTES_PER_MIB

# checkpoint.workload: MLPerf Storage's checkpointing models (stampede.checkpoint.mlperf),
# each with the rank count of a closed submission (mlpstorage's LLM_ALLOWED_VALUES)
JOB_LIMIT_BYTES = BYTES_PER_MIB    # a job file is a page of TOML: a larger one is not a job
WORKLOAD_RANKS = {"llama3-8b": 8, "llama3-70b": 64, "llama3-405b": 512, "llama3-1t": 1024}
WORKLOADS = ("none", *WORKLOAD_RANKS)
BROADCAST_GROUPS = ("replica", "node")
FORMATS = ("raw", "safetensors", "hdf5")
DTYPES = tuple(WRITTEN)
CACHE_MODES = ("warm", "cold", "direct")
SOURCES = ("synthetic", "existing")
# stampede.existing.assign: who reads what of an existing checkpoint
ASSIGN_POLICIES = ("files", "tensor-slices", "saved", "reshard", "whole-file", "owners")
VERIFY_MODES = ("none", "sha256", "xxh3")
SAVE_MODES = ("sync", "async")
DURABILITY = ("fsync", "none")
VALIDATE_MODES = ("none", "sha256", "xxh3", "finite")
MKDIR_BY = ("root", "every")
RESTORE_FROM = ("auto", "prepared", "saved")
H2D_MODES = ("none", "host", "cuda-pageable", "cuda-pinned", "cuda-gds")
PLACEMENTS = ("ring", "buddy")   # stampede.run.roles: where a rejoin's replicas go
PUBLISH_LEVELS = ("local", "peer", "storage")   # stampede.run.tiers: when a version counts
DRAINS = ("background", "inline")               # stampede.run.tiers: the storage copy
EXCHANGES = ("mpi", "torch")   # how broadcast and striped move the shard
KEY_PREFIXES = ("none", "hash")   # stampede.checkpoint.plan: what leads an object's key
PATTERN_ORDERS = ("op", "file")   # stampede.run.pattern: each op over every file, or file by file
# Options without a column of their own: their value, where it is not the default, is folded
# into another option's cell as " by VALUE" (key -> that column), so rows that differ in it
# still differ in an identity column, and the archive's columns (its schema) stay as they
# were. The sidecar records them as any.
FOLDED = {"pattern.order": "pattern"}

class Option(NamedTuple):
    key: str                       # dotted TOML key, also the --set name
    field: str                     # JobSpec attribute
    parse: Callable[[object], object]
    default: object                # REQUIRED when the job must give it
    help: str
    column: str                    # CSV column that repeats this option in every row


REQUIRED = object()

OPTIONS: tuple[Option, ...] = (
    Option("target.path", "target_path", values.target_path, REQUIRED,
           "where the checkpoint lives: a POSIX directory (relative paths are from the cwd), "
           "an NFS server's directory (nfs://server[:port]/export/path[?version=3|4], one "
           "user-space client per rank), a CephFS directory (cephfs://[user@]mon-host[:port]/"
           "path, one libcephfs client per rank) or an fsspec URL (s3://bucket/prefix, gs://..., "
           "memory://..., file:///...)",
           "target"),
    Option("target.storage_options", "storage_options", values.storage_options, {},
           "options of a URL target: an object store's fsspec options (endpoint_url, timeouts, "
           "retries); NFS's export, version, timeout_ms; CephFS's conf, keyring, fs, timeout_s; "
           "credentials never go here: they come "
           "from the environment", "storage_options"),
    Option("target.stripe_count", "stripe_count", values.stripe_count, 0,
           "Lustre and CephFS: the stripe count set on every directory stampede makes "
           "(prepare's, and each save series' before its versions; Lustre `lfs setstripe "
           "-c`, CephFS ceph.dir.layout.stripe_count) (0 = leave the file system's default, "
           "-1 = every OST)", "stripe_count"),
    Option("target.stripe_size", "stripe_size_bytes", values.stripe_size, "",
           "Lustre and CephFS: the stripe size (Lustre `lfs setstripe -S`, CephFS "
           "ceph.dir.layout.stripe_unit) (empty = the file system's default)", "stripe_size"),
    Option("checkpoint.source", "checkpoint_source", values.choice(SOURCES), "synthetic",
           "synthetic = the checkpoint prepare writes; existing = a checkpoint stampede did "
           "not write (safetensors with or without an index, PyTorch DCP, HDF5) at "
           "target.path, restored as its loader would and never written to "
           "(`run --checkpoint PATH`)", "checkpoint_source"),
    Option("checkpoint.assign", "assign", values.choice_list(ASSIGN_POLICIES, unique=True), ("files",),
           "existing checkpoints: who reads what. files = whole files to ranks, balanced by "
           "bytes; tensor-slices = every rank a 1/N slice of every tensor (tensor-parallel); "
           "saved = DCP files to the rank that saved them (mod N); reshard = every rank its 1/N "
           "of every tensor's rows (dim 0), read as byte ranges of the saved chunks, at any "
           "rank count (DCP saved at 4, restored at 2 or 3); whole-file = every rank reads "
           "every tensor (the naive load: N-fold reads); owners = every rank ends up "
           "holding every tensor, each read once by an owner chosen by bytes (largest first, "
           "least-loaded rank), then Allgatherv. A list runs each in turn",
           "assign"),
    Option("checkpoint.from", "from_path", values.optional_path, "",
           "prepare: fill the job's layouts with the tensors of this existing checkpoint "
           "instead of synthetic bytes (`prepare --from PATH`), written as a copy at "
           "target.path; its size is the checkpoint's", "from"),
    Option("checkpoint.size", "size_total_bytes", values.optional_size, "",
           "total checkpoint size, split evenly over the ranks (give this or size_per_rank)",
           "size_total_requested"),
    Option("checkpoint.size_per_rank", "size_per_rank_bytes", values.optional_size, "",
           "bytes each rank restores (give this or size)", "size_per_rank_requested"),
    Option("checkpoint.layout", "layouts", values.choice_list(LAYOUTS, unique=True), ("shared", "sharded"),
           "restore strategy: shared = one file, each rank reads its slice; sharded = one file "
           "per shard; replicated = every replica reads its shard; broadcast = one reader per "
           "group, then MPI Bcast; striped = each replica reads 1/R, then Allgatherv; "
           "metadata-first = all read a shared index first; list-first = all list the "
           "directory first; list-bcast = rank 0 lists and broadcasts. A list runs each in "
           "turn on the same target", "layout"),
    Option("checkpoint.workload", "workload", values.choice(WORKLOADS), "none",
           "layout mlperf: MLPerf Storage's checkpointing model whose files every rank writes "
           "(model and optimizer states per TP/PP/DP rank, as DLIO writes them; sizes from "
           "the model, so no checkpoint.size)", "workload"),
    Option("checkpoint.scale", "scale", values.scale, "1",
           "layout mlperf: every file's size times this (\"1/1024\", 0.001), the file layout "
           "kept; below 1 the run is labelled not comparable with submissions", "scale"),
    Option("checkpoint.subset", "subset", values.boolean, False,
           "layout mlperf: MLPerf's subset mode: the ranks are the first ranks of the "
           "workload's closed run (one host of 8), each writing what it would write there",
           "subset"),
    Option("checkpoint.replicas", "replicas", values.whole_number(1), 1,
           "data-parallel replicas R: N ranks = N/R model shards x R; the ranks holding one "
           "shard form a group", "replicas"),
    Option("checkpoint.broadcast_group", "broadcast_group", values.choice(BROADCAST_GROUPS), "replica",
           "broadcast: one storage reader per replica group, or per group and node", "broadcast_group"),
    Option("checkpoint.index_size", "index_bytes", values.positive_size, "64KiB",
           "metadata-first: size of the shared index file every rank reads first", "index_bytes"),
    Option("checkpoint.block_size", "block_bytes", values.positive_size, "4MiB",
           "bytes per read op (one preadv into a page-aligned buffer)", "block_bytes"),
    Option("checkpoint.prefetch", "prefetch_bytes", values.size, 0,
           "POSIX targets: keep this many bytes of the rank's current extent asked for ahead "
           "of its reads (posix_fadvise WILLNEED, the large-read prefetch of loaders that "
           "halved cold loads), inside the timed restore; 0 = none. Not with run.cache = "
           "\"direct\" (O_DIRECT bypasses the page cache the prefetch fills)",
           "prefetch_bytes"),
    Option("checkpoint.format", "format", values.choice(FORMATS), "raw",
           "bytes on disk: raw (the bytes alone); safetensors (a JSON header of named "
           "tensors, then their data; the header is read and parsed inside the timed restore, "
           "op header); hdf5 (one contiguous dataset per shard, located through h5py inside "
           "the timed restore)", "format"),
    Option("checkpoint.dtype", "dtype", values.choice(DTYPES), "float16",
           "element type of the tensors written (finite values, so run.check_finite passes "
           "on a good checkpoint)", "dtype"),
    Option("pattern.ops", "ops", values.choice_list(PATTERN_OPS, unique=True),
           ("stat", "open", "read", "close"),
           "ops each rank runs in order on its file(s); read needs open before it (the "
           "column: the ops joined by +, then \" by file\" when pattern.order = \"file\")",
           "pattern"),
    Option("pattern.stat_count", "stat_count", values.whole_number(1), 1,
           "stats per file per iteration (> 1: an mdtest-style stat storm)", "stat_count"),
    Option("pattern.open_count", "open_count", values.whole_number(1), 1,
           "opens per file per iteration, each closed by the close op (> 1: an open storm)",
           "open_count"),
    Option("pattern.order", "order", values.choice(PATTERN_ORDERS), "op",
           "op = each op of pattern.ops over all the rank's files before the next op (stat "
           "every file, open every file, read, close all); file = file by file, as mdtest -E "
           "and most loaders do: every op of pattern.ops on one file (stat x stat_count, open "
           "x open_count, its reads, close), then the next file. No column of its own: "
           "\" by file\" ends the pattern cell", ""),
    Option("run.iterations", "iterations", values.whole_number(1), 3,
           "measured repeats of the whole pattern", "iterations"),
    Option("run.warmup", "warmup", values.whole_number(0), 1,
           "repeats run first and dropped", "warmup"),
    Option("run.cache", "cache", values.choice(CACHE_MODES), "warm",
           "warm = page cache as it is; cold = files' pages written back (fdatasync) and evicted "
           "(posix_fadvise DONTNEED) before every iteration; direct = O_DIRECT", "cache"),
    Option("run.ceiling", "ceiling", values.boolean, False,
           "measure every node's raw-read ceiling once, before the first layout: its share of "
           "the checkpoint read cold by 1, 4, 16 and 32 streams of 8 MiB requests, each 3 "
           "times, the best stream count's median GB/s; each restore row then says its "
           "efficiency against it (ceiling_efficiency)",
           "ceiling"),
    Option("run.drop_caches", "drop_caches", values.boolean, False,
           "cold: also drop the whole page cache (sync; echo 3 > /proc/sys/vm/drop_caches, one "
           "rank per node) before every iteration, where permitted (root)", "drop_caches"),
    Option("run.rank_shift", "rank_shift", values.whole_number(0), 0,
           "rank r restores the shard of rank (r + shift) mod N, so it reads bytes another "
           "rank wrote: with shift = ranks per node, another node's (defeats client caches, "
           "like IOR's task reordering)", "rank_shift"),
    Option("run.jitter", "jitter", values.jitter, "none",
           "start-time jitter: each rank waits a random delay before its restore "
           "(uniform:S = [0, S) s; exponential:S = mean S s), inside the restore time", "jitter"),
    Option("run.seed", "seed", values.whole_number(0), 1,
           "seed of the jitter delays (rank and iteration are mixed in)", "seed"),
    Option("run.h2d", "h2d", values.choice(H2D_MODES), "none",
           "copy the restored bytes on to a device, timed as op h2d inside the restore: "
           "cuda-pinned (the read buffer page-locked), cuda-pageable, cuda-gds (no copy: "
           "each read goes file -> HBM through cuFile (kvikio; POSIX files); kvikio's "
           "compatibility mode is labelled NOT GDS), or host (memcpy, labelled as not a "
           "GPU)", "h2d"),
    Option("run.exchange", "exchange", values.choice(EXCHANGES), "mpi",
           "broadcast and striped: how a group's ranks move the shard. mpi = MPI Bcast / "
           "Allgatherv of host memory; torch = torch.distributed as trainers do it: nccl "
           "GPU to GPU with run.h2d = cuda-* (the readers copy on to HBM first), gloo on "
           "host memory otherwise. Before each iteration, outside the restore, the process "
           "group is made again (op pg_init: the recovery model's T_sync) and its first "
           "collective timed apart (op bcast_first or allgather_first)", "exchange"),
    Option("run.max_error_fraction", "max_error_fraction", values.fraction, 0.0,
           "failed ops tolerated per iteration, as a fraction of all ops of all ranks: they "
           "are counted and reported; past it every rank stops (0 = stop at the first)",
           "max_error_fraction"),
    Option("run.samples", "samples", values.choice(("auto", "exact", "histogram")), "auto",
           "exact = every sample to rank 0 (Gatherv); histogram = each rank reduces its samples "
           "to log-bucket histograms and MPI sums them (p50..p99.9 within 1%, min/max exact), "
           "for thousands of ranks; auto = histogram past 4 million samples", "samples_mode"),
    Option("run.deadline_s", "deadline_s", values.seconds, 600.0,
           "per-phase deadline: a rank still working then stops, the run is marked invalid",
           "deadline_s"),
    Option("run.verify", "verify", values.choice(VERIFY_MODES), "none",
           "hash every byte read and compare with what prepare recorded: sha256, or xxh3 "
           "(xxh3-128, ~15x faster than sha256 on one core); timed as its own verify op, never inside read",
           "verify"),
    Option("run.check_finite", "check_finite", values.boolean, False,
           "check every element read is finite (no NaN/Inf) as checkpoint.dtype; timed with "
           "verify", "check_finite"),
    Option("checkpoint.fanout", "fanout", values.whole_number(1), 16,
           "fan-out: the shard files spread over this many subdirectories of fanout/ (shard "
           "s in fanout/NNN, NNN = s mod fanout: many directories' locks against one)", "fanout"),
    Option("checkpoint.copies", "copies", values.whole_number(1), 1,
           "object stores: prepare writes K copies of the checkpoint under K prefixes "
           "(copy-0/ ... copy-K-1/ first in every key, each its own partition) and rank r "
           "reads copy r mod K, so each prefix takes 1/K of the restore's requests; a "
           "restore's option (save writes one copy and refuses more)", "copies"),
    Option("checkpoint.key_prefix", "key_prefix", values.choice(KEY_PREFIXES), "none",
           "object stores: hash = a shard's key starts with 4 hex digits of a hash of its "
           "number (a3f9/sharded/shard-00012-of-00016.raw), so the shards spread over the "
           "store's partitions (entropy first); none = the plain key", "key_prefix"),
    Option("save.mode", "save_mode", values.choice(SAVE_MODES), "sync",
           "sync = every rank writes its bytes and fsyncs before it goes on; async = it copies "
           "them to a staging buffer (op snapshot: what stops training) and a background "
           "thread writes them (DCP's async save)", "save_mode"),
    Option("save.durability", "durability", values.choice(DURABILITY), "fsync",
           "fsync = every file (and its directory) fsynced before the save counts as done; "
           "none = no fsync: reported as buffered, never as storage GB/s", "durability"),
    Option("save.validate", "validate", values.choice(VALIDATE_MODES), "xxh3",
           "after a save every rank evicts and re-reads what it wrote and checks it against "
           "the hashes it computed while writing (or that every element is finite); the "
           "version is published, and the oldest released, only when every rank's part is "
           "good", "validate"),
    Option("save.keep", "keep", values.whole_number(1), 2,
           "versions kept published or ready; older ones are deleted after a newer one is "
           "published (retention: an unlink storm)", "keep"),
    Option("save.mkdir", "mkdir_by", values.choice(MKDIR_BY), "root",
           "who makes a version's directories: root = rank 0, then a barrier; every = every "
           "rank (a mkdir storm: real trainers do both)", "mkdir_by"),
    Option("save.part_size", "part_bytes", values.optional_size, "",
           "object stores: a multipart upload per file in parts of this size (>= 5 MiB); "
           "empty = one PUT per file", "part_size"),
    Option("tiers.local_dir", "tier_dir", values.nonempty_text, "/dev/shm/stampede-tiers",
           "`stampede rejoin`: the node-local tier, a directory on each node (memory: "
           "/dev/shm; or a local disk); each node writes under its host name", "tier_dir"),
    Option("tiers.peers", "tier_peers", values.whole_number(1), 1,
           "`stampede rejoin`: replicas of each shard kept on other nodes' local tiers",
           "tier_peers"),
    Option("tiers.placement", "tier_placement", values.choice(PLACEMENTS), "ring",
           "`stampede rejoin`: where replicas go: ring = the next nodes; buddy = nodes in "
           "pairs (one replica)", "tier_placement"),
    Option("tiers.spare_nodes", "spare_nodes", values.whole_number(1), 1,
           "`stampede rejoin`: the last nodes are hot spares (idle until a restore)",
           "spare_nodes"),
    Option("tiers.lost_nodes", "lost_nodes", values.whole_number(1), 1,
           "`stampede rejoin`: the last working nodes are lost after the save (their local "
           "tier deleted); spares take their ranks' places", "lost_nodes"),
    Option("tiers.publish", "tier_publish", values.choice(PUBLISH_LEVELS), "storage",
           "`stampede rejoin`: the protection at which the version counts as published (its "
           "manifest written): local = durable on every node; peer = every shard also on a "
           "peer; storage = every shard on the shared storage", "tier_publish"),
    Option("tiers.drain", "tier_drain", values.choice(DRAINS), "background",
           "`stampede rejoin`: the storage copy written by a thread of each rank while the "
           "rank goes on (background: training blocked only for the local and peer copies), "
           "or by the rank itself after them (inline)", "tier_drain"),
    Option("tiers.versions", "tier_versions", values.whole_number(1), 1,
           "`stampede rejoin`: versions saved in tiers, one after the other (the last is "
           "restored); each an iteration of the save's layouts", "tier_versions"),
    *(Option(f"tiers.keep_{tier}", f"keep_{tier}", values.whole_number(1), 1,
             f"`stampede rejoin`: versions the {where} keeps; an older one is removed (op "
             "unlink) once a newer is published", f"keep_{tier}")
      for tier, where in (("local", "node-local tier"), ("peer", "peer tier (the replicas)"),
                          ("storage", "storage tier"))),
    Option("run.restore", "restore_from", values.choice(RESTORE_FROM), "auto",
           "what run restores: auto = the layout's published save when the target holds one "
           "(`stampede save`), else the prepared checkpoint; prepared; saved", "restore_from"),
    Option("archive.path", "archive_path", values.nonempty_text, "results/{job}.csv",
           "CSV archive the run appends to; {job} is the job file's name", "archive"),
)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}


class JobSpec(SpecFields):
    """A validated job: frozen, so a plan or a run can never change what was asked (its
    fields: stampede.spec_fields)."""

    def command(self, step: str, nranks: int) -> str:
        """`stampede STEP` of this job, with its --set options, to suggest in a message."""
        from stampede.launcher import suggested_command

        sets = [word for text in self.overrides for word in ("--set", text)]
        return suggested_command(nranks, step, self.source, *sets)

    def columns(self) -> dict[str, object]:
        """The options as CSV columns, so every archived row carries its configuration."""
        cells = {OPTIONS_BY_KEY[key].column: _as_cell(value) for key, value in self.values.items()
                 if key not in FOLDED}
        for key, into in FOLDED.items():
            if self.values[key] != OPTIONS_BY_KEY[key].default:
                cells[into] = f"{cells[into]} by {self.values[key]}"
        return cells


def _as_cell(value: object) -> object:
    if isinstance(value, dict):
        import json
        return json.dumps(value, sort_keys=True) if value else ""
    if isinstance(value, tuple):
        return "+".join(str(item) for item in value)
    return "" if value is None else value


def load_job(path: str | Path, overrides: Iterable[str] = ()) -> JobSpec:
    """Read a TOML job file, apply `--set key=value` overrides and validate everything."""
    path = Path(path)
    text = values.read_text(path, "job file", JOB_LIMIT_BYTES)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"{path}: not valid TOML: {error}") from None
    return build_job(path.stem, str(path), document, overrides)


def build_job(name: str, source: str, document: Mapping[str, object],
              overrides: Iterable[str] = ()) -> JobSpec:
    """Validate a parsed job document (plus overrides) into a JobSpec."""
    overrides = tuple(overrides)
    raw = _flatten(source, document)
    for text in overrides:
        key, value = parse_override(text)
        raw[key] = (value, "--set")
        for other in EXCLUSIVE.get(key, ()):   # --set one of a pair replaces the other
            raw.pop(other, None)
    parsed: dict[str, object] = {}
    for option in OPTIONS:
        if option.key in raw:
            value, origin = raw[option.key]
        elif option.default is REQUIRED:
            raise UsageError(f"{source}: [{option.key.split('.')[0]}] {option.key.split('.')[1]}"
                             f" is required: {option.help}")
        else:
            value, origin = option.default, "default"
        try:
            parsed[option.key] = option.parse(value)
        except ValueError as error:
            where = source if origin != "--set" else f"--set {option.key}"
            # a table that may hold a credential by mistake is never echoed
            shown = "{...}" if option.key == "target.storage_options" else values.shown(value)
            raise UsageError(f"{where}: {option.key} = {shown}: {error}") from None
    parsed["archive.path"] = str(parsed["archive.path"]).replace("{job}", name)
    fields: dict[str, Any] = {OPTIONS_BY_KEY[key].field: value for key, value in parsed.items()}
    spec = JobSpec(name=name, source=source, values=MappingProxyType(parsed),
                   overrides=tuple(overrides), **fields)
    check_combination(spec, WORKLOADS[1:])
    return spec


def parse_override(text: str) -> tuple[str, object]:
    """'run.cache=cold' -> ('run.cache', 'cold'); values parse as TOML, else as a string."""
    key, sep, value_text = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set {text!r}: expected KEY=VALUE, for example --set run.cache=cold")
    _check_key(key, "--set")
    try:
        value: object = tomllib.loads(f"v = {value_text}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return key, value


# Keys of which a job gives one: a --set of either replaces the other.
EXCLUSIVE = {"checkpoint.size": ("checkpoint.size_per_rank",),
             "checkpoint.size_per_rank": ("checkpoint.size",)}

# Sections of a job file that other commands read (and validate) and `run` ignores.
FOREIGN_SECTIONS = ("mttr",)


def _flatten(source: str, document: Mapping[str, object]) -> dict[str, tuple[object, str]]:
    flat: dict[str, tuple[object, str]] = {}
    for section, table in document.items():
        if section in FOREIGN_SECTIONS and isinstance(table, dict):
            continue
        if not isinstance(table, dict):
            _check_key(section, source)  # a bare key at top level: unknown section
            raise UsageError(f"{source}: {section} must be a [section] table")
        for key, value in table.items():
            dotted = f"{section}.{key}"
            _check_key(dotted, source)
            flat[dotted] = (value, source)
    return flat


def _check_key(key: str, where: str) -> None:
    if key not in OPTIONS_BY_KEY:
        raise UsageError(f"{where}: unknown key {key!r}{values.did_you_mean(key, OPTIONS_BY_KEY)}",
                         hint="`stampede run --help` lists every key")
