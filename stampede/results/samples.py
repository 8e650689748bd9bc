"""Timed samples: the one record format from the timed loop to the statistics.

A sample is one row of int64 columns. Stamps are `time.perf_counter_ns()` of the rank
that took them; rank 0 puts them on one axis per phase (stampede.run.clock), and they are only
ever combined across ranks as min/max of starts/stops.
"""

from __future__ import annotations

# The op column holds the op's code (stampede.ops: OP_CODE, and every op's definition).

# Columns of a sample row as gathered on rank 0 (RANK is added there, by position).
ITER, OP, START, STOP, NBYTES, OK = range(6)
RANK = 6
