"""Timed samples: the one record format from the timed loop to the statistics.

A sample is one row of int64 columns. Stamps are `time.perf_counter_ns()` of the rank
that took them, made relative to that rank's origin (taken right after the barrier that
opens the phase); they are only ever combined across ranks as min/max of starts/stops.
"""

from __future__ import annotations

# The ops, in the order of their codes in the OP column. `restore` is a pseudo-op: from
# the rank's barrier exit until it holds all its bytes (end of its last read).
OPS = ("stat", "open", "read", "close", "verify", "restore")
OP_CODE = {name: code for code, name in enumerate(OPS)}

# Columns of a sample row as gathered on rank 0 (RANK is added there, by position).
ITER, OP, START, STOP, NBYTES, OK = range(6)
RANK = 6
SAMPLE_COLUMNS = ("iteration", "op", "start_ns", "stop_ns", "bytes", "ok", "rank")
