"""The checkpoint layouts, as data: one descriptor each, and callers test its properties.

A layout is a way to lay a checkpoint out (its files) and to restore it (who reads what,
then which exchange). Plan (stampede.checkpoint.plan), save (stampede.checkpoint.save_plan),
the run, the model (stampede.model.traffic, contention) and the job's rules ask a
descriptor here what the layout does, never its name: a layout built from properties that
exist already is one entry of `TABLE` (docs/concepts/layouts.md's table is generated from
it by `python -m stampede.docs`). Pure data, at the bottom of the package, so that the
job's rules and the model can read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

# The traffic models of stampede.model.traffic: whose bytes cross which link in one phase.
EACH_READS = "each-reads"           # every rank reads its own bytes from storage
LEADER_BCAST = "leader-bcast"       # one reader per group (or node), then a broadcast
STRIPE_ALLGATHER = "stripe-allgather"   # each replica reads 1/R, then an allgather
EACH_READS_ALL = "each-reads-all"   # every rank reads every shard from storage, keeps its own
NODE_ONCE = "node-once"             # one reader per node reads every shard, then its node's
                                    # ranks get their own from it (no NIC between nodes)
OWNER_BCAST = "owner-bcast"         # each shard read once, by an owner, then broadcast


class Layout(NamedTuple):
    """What one layout reads and saves, and how (see stampede.checkpoint.plan's table)."""

    name: str
    reads: str                      # what rank r reads from storage (docs, `stampede plan`)
    saved_by: str = ""              # who writes it in a save; "": save refuses the layout
    one_file: bool = False          # every shard a slice of one file (else a file per shard)
    fanout_dirs: bool = False       # shard files spread over checkpoint.fanout directories
    workload_files: bool = False    # MLPerf's files per rank (checkpoint.workload), whole
    replica_aware: bool = False     # meaningless with one replica: needs replicas >= 2
    stripes: bool = False           # each replica reads (and saves) 1/R of its shard
    leader_reads: bool = False      # only a group's leader reads storage
    whole_file: bool = False        # every rank reads every shard, then keeps its own: the
                                    # naive load, whose reads are N-fold what the job needs
    node_reads: bool = False        # its groups are the nodes (each node's ranks, whatever
                                    # their shards): the node's lowest rank reads for them
    owners: bool = False            # each shard's reader is chosen by bytes (largest shard
                                    # first, to its least-loaded holder), the others receive
    exchange: str = ""              # after the reads: "", "bcast", "allgather" or "scatter"
    shared_inode: bool = False      # every rank's metadata ops hit one inode (one lock)
    listing: bool = False           # the shard directory is listed before the reads
    list_on_root: bool = False      # ... by rank 0 alone, which broadcasts the names
    index_file: bool = False        # a shared index (PyTorch DCP's .metadata), read whole first
    traffic: str = EACH_READS       # its model in stampede.model.traffic
    models: str = ""                # the restore in the wild it stands for (the docs' table)

    @property
    def saves(self) -> bool:
        return bool(self.saved_by)


_SHARD_SAVE = "replica 0 of each shard"
TABLE: Mapping[str, Layout] = MappingProxyType({layout.name: layout for layout in (
    Layout("shared", "slice r mod S of one file", f"{_SHARD_SAVE} its slice; rank 0 creates "
           "and renames the file", one_file=True, shared_inode=True,
           models="a monolithic checkpoint: one metadata hot spot"),
    Layout("sharded", "shard file r mod S", f"{_SHARD_SAVE} (R = 1: all)",
           models="per-rank shards (with R = 1, one file per rank)"),
    Layout("replicated", "shard file r mod S (R ranks read each)", _SHARD_SAVE,
           replica_aware=True, models="the naive restore of identical weights"),
    Layout("broadcast", "its shard file, if it leads its group; then Bcast",
           replica_aware=True, leader_reads=True, exchange="bcast", traffic=LEADER_BCAST,
           models="read once, then peer-to-peer; groups by replica or by node "
           "(`checkpoint.broadcast_group`)"),
    Layout("striped", "stripe (r div S) of R of its shard; then Allgatherv",
           "every replica 1/R of it; replica 0 creates and renames", replica_aware=True,
           stripes=True, exchange="allgather", traffic=STRIPE_ALLGATHER,
           models="Megatron's fully parallel load"),
    Layout("whole-file", "the whole file (every slice); keeps slice r mod S", one_file=True,
           shared_inode=True, whole_file=True, traffic=EACH_READS_ALL,
           models="the naive safetensors load (HF's): every rank reads the whole file"),
    Layout("metadata-first", "the whole index, then its shard file",
           f"{_SHARD_SAVE}; rank 0 the index once every shard is durable", index_file=True,
           models="PyTorch DCP's `.metadata` (its size `checkpoint.index_size`)"),
    Layout("fan-out", "its shard file, in fanout/NNN (NNN = shard mod checkpoint.fanout)",
           _SHARD_SAVE, fanout_dirs=True,
           models="many directories' locks against one (`checkpoint.fanout`)"),
    Layout("list-first", "list the directory, then its shard file", listing=True,
           models="the listing storm that brought S3 throttling"),
    Layout("list-bcast", "rank 0 lists and broadcasts; its shard file", listing=True,
           list_on_root=True, models="list-first's fix"),
    Layout("mlperf", "its own files (checkpoint.workload), whole",
           "every rank its own files", workload_files=True,
           models="MLPerf Storage's checkpointing: DLIO's files per TP/PP/DP rank"),
    # issue 40's layouts users run, kept together at the end of the tuple
    Layout("node-once", "the whole file, if it leads its node; then each rank of the node "
           "its slice (point to point)", one_file=True, shared_inode=True, whole_file=True,
           leader_reads=True, node_reads=True, exchange="scatter", traffic=NODE_ONCE,
           models="every node reads the whole checkpoint once and its ranks share it "
           "(node-local memory): N-node amplification, none within a node"),
    Layout("owners", "its slice of one file, if it owns it; then Bcast to its holders",
           one_file=True, shared_inode=True, leader_reads=True, owners=True, exchange="bcast",
           traffic=OWNER_BCAST,
           models="PyTorch's cooperative DCP load: owners by bytes (largest first, to the "
           "least-loaded rank), each byte read once, then broadcast"),
)})

NAMES = tuple(TABLE)
SAVE_LAYOUTS = tuple(name for name, layout in TABLE.items() if layout.saves)


def layout_of(name: str) -> Layout:
    """The descriptor of a layout the job's rules accepted (KeyError for any other name)."""
    return TABLE[name]


def exchanges(name: str) -> bool:
    """Whether a row's layout moves bytes between ranks after its reads: False for a
    name that is no layout (an existing checkpoint's assign policy)."""
    layout = TABLE.get(name)
    return layout is not None and bool(layout.exchange)
