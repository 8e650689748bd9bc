"""Timed samples: the one record format from the timed loop to the statistics.

A sample is one row of int64 columns. Stamps are `time.perf_counter_ns()` of the rank
that took them; rank 0 puts them on one axis per phase (stampede.run.clock), and they are only
ever combined across ranks as min/max of starts/stops.
"""

from __future__ import annotations

# The ops, in the order a restore runs them (and the report lists them); the index is the
# op's code in the OP column.
# - storage ops: jitter (the random start delay, not storage but before it), list (the
#   checkpoint directory), index (open + read whole + close of a shared index file),
#   stat, open, header (read and parse a formatted file's header), read (one block),
#   close; ttfb is not an op of its own but a read's time to first byte (object stores:
#   request sent -> first byte of the body), from the same start stamp;
# - network ops: wait (for the group's storage readers, before an exchange), bcast,
#   allgather;
# - verify (hashing what was read, timed apart) and the pseudo-op restore: from the
#   rank's barrier exit until it holds all its bytes.
OPS = ("jitter", "list", "index", "stat", "open", "header", "read", "ttfb", "close", "wait",
       "bcast", "allgather", "verify", "restore",
       # the start-up stampede (`stampede startup`): launch -> first line of stampede ->
       # imports done -> MPI initialised; startup is the whole, the completion op there
       "interpreter", "import", "mpi_init", "startup",
       # host -> device (`stampede gpu`, run.h2d): page-locking a buffer, and the copy
       "pin", "h2d",
       # collectives timed once the ranks are up (`stampede startup`): T_barrier_sync
       "barrier", "allreduce",
       # the save (`stampede save`), in the order it runs them: snapshot (async: the copy
       # to the staging buffer, what stops training), mkdir, create (O_CREAT|O_EXCL),
       # write (one block), fsync (a file), close (the restore's op), rename (temporary
       # name -> final), fsync_dir (a directory's entries), validate (evict, re-read and check one
       # extent), publish (the pointer, replaced atomically), unlink and rmdir (the
       # retention of old versions); the pseudo-ops: blocked (phase start -> the rank
       # could train again: after the snapshot (async) or the collective save (sync)),
       # save (-> the rank's bytes durable under their final names), published (-> the
       # pointer durable: rank 0)
       "snapshot", "mkdir", "create", "write", "fsync", "rename", "fsync_dir",
       "validate", "publish", "unlink", "rmdir", "blocked", "save", "published",
       # a real loader's phases (`stampede loaders`), each one span per rank and iteration
       # beside index and header: plan (DCP's load planning and its collectives), load
       # (the loader's read of the tensors' bytes, with whatever it does in the same
       # calls), deserialise (tensors made from bytes already in memory), touch (the
       # first touch of every page of tensors a loader returned over a file mapping: the
       # read that a mapped load defers)
       "plan", "load", "deserialise", "touch",
       # run.exchange = "torch" (stampede.run.torch_exchange), before each iteration's start
       # barrier, outside the restore (their stamps are negative on the phase's axis):
       # pg_init (init_process_group + the exchange group: the recovery model's T_sync) and
       # the new group's first collective at the shard's size (bcast_first,
       # allgather_first), apart from the restore's steady-state bcast / allgather; d2h
       # (inside the restore): device -> host copy of a shard that reached HBM (nccl,
       # cuda-gds) so that run.verify and run.check_finite can check host bytes
       "pg_init", "bcast_first", "allgather_first", "d2h",
       # a rejoin (`stampede rejoin`, stampede.run.rejoin): peer = a shard sent or received
       # between two ranks (a replica to its holder, a lost shard to its spare; bytes: what
       # reached this rank)
       "peer")
OP_CODE = {name: code for code, name in enumerate(OPS)}
# A save's ops in the order it runs them (and its report lists them); peer: a rejoin's
# replica sent to another node
SAVE_ORDER = ("snapshot", "mkdir", "create", "open", "write", "fsync", "close", "rename",
              "fsync_dir", "peer", "wait", "validate", "publish", "unlink", "rmdir", "blocked", "save",
              "published")
STORAGE_OPS = ("list", "index", "stat", "open", "header", "read", "close")
SAVE_STORAGE_OPS = ("mkdir", "create", "open", "write", "fsync", "close", "rename",
                    "fsync_dir", "publish", "unlink", "rmdir")
NETWORK_OPS = ("bcast", "allgather", "peer")
# Timed before the phase's start barrier, so outside the restore (run.exchange = "torch")
BEFORE_PHASE_OPS = ("pg_init", "bcast_first", "allgather_first")
# ops for which ops/s means something
RATE_OPS = tuple(dict.fromkeys((*STORAGE_OPS, *NETWORK_OPS, "verify", *SAVE_STORAGE_OPS,
                                 "validate")))
# From the phase's start until a moment of the rank (stampede.run.clock starts them at the
# node's first barrier exit); the completion op of a phase is one of them.
PSEUDO_OPS = ("restore", "startup", "blocked", "save", "published")

# Columns of a sample row as gathered on rank 0 (RANK is added there, by position).
ITER, OP, START, STOP, NBYTES, OK = range(6)
RANK = 6
