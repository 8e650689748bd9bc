"""A cycle of layout mlperf, as MLPerf Storage reports it: the facts its rules need (each
host's memory and what its ranks wrote, the page-cache residency before each read, the
gap between the writes and the reads, the hosts of the shifted readers), its metrics
(stampede.results.mlperf) and the summary JSON beside the archive:

    results/JOB.runs/RUN_ID-summary.json    DLIO's summary.json field names, the rules

Untimed: all of it after the measured phases (the gap is read from their ends).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stampede import mpi
from stampede.checkpoint.mlperf import MODELS, rank_files
from stampede.results.archive import sidecar_path
from stampede.results.mlperf import (
    Phase,
    Rule,
    cache_rule,
    comparability,
    gap_rule,
    rank_shift_rule,
    summary,
)
from stampede.results.model import LayoutRun, RunContext
from stampede.spec import JobSpec
from stampede.sysinfo import meminfo_bytes
from stampede.units import format_plain

METADATA_OPS = ("mkdir", "create", "fsync", "rename", "fsync_dir", "stat", "open", "close")


class Gap:
    """When the writes ended and the reads started: each iteration's end is seen by the
    cycle's tick (and its length with it)."""

    def __init__(self) -> None:
        self.reading = False
        self.writes_end_s = float("nan")
        self.reads_start_s = float("nan")

    def watch(self, tick: Callable[[str, int, float], None]) -> Callable[[str, int, float], None]:
        def watched(layout: str, iteration: int, seconds: float) -> None:
            now = time.monotonic()
            if not self.reading:
                self.writes_end_s = now
            elif math.isnan(self.reads_start_s):   # the first read
                self.reads_start_s = now - seconds
            tick(layout, iteration, seconds)
        return watched

    @property
    def seconds(self) -> float:
        return self.reads_start_s - self.writes_end_s


def report(comm: mpi.Comm, spec: JobSpec, restore: JobSpec, context: RunContext,
           runs: list[LayoutRun], gap: Gap) -> str:
    """Collective: MLPerf's rules checked and its summary written (rank 0); returns the
    summary's path on rank 0 ("" elsewhere, or when a half did not run)."""
    memory = mpi.gather(comm, meminfo_bytes("MemTotal") or 0)
    if comm.Get_rank() != 0:
        return ""
    save = next((run for run in runs if run.phase == "save" and run.stats), None)
    load = next((run for run in runs if run.phase == "restore" and run.stats), None)
    if save is None or load is None:
        return ""
    hosts = context.hosts
    memory_by_host = dict(zip(hosts, memory or []))
    document = _document(spec, restore, hosts, memory_by_host, save, load, gap)
    path = sidecar_path(spec.archive_path, context.run_id).with_name(
        f"{context.run_id}-summary.json")
    _write(path, document)
    _say(document, path)
    return str(path)


def _document(spec: JobSpec, restore: JobSpec, hosts: tuple[str, ...], memory: dict[str, int],
              save: LayoutRun, load: LayoutRun, gap: Gap) -> dict[str, object]:
    model, nranks = MODELS[spec.workload], len(hosts)
    written = [sum(nbytes for _, nbytes in rank_files(model, rank, nranks, spec.subset,
                                                      spec.scale)) for rank in range(nranks)]
    read = [written[(rank + restore.rank_shift) % nranks] for rank in range(nranks)]
    by_host: dict[str, int] = {}
    for host, nbytes in zip(hosts, written):
        by_host[host] = by_host.get(host, 0) + nbytes
    assert save.stats is not None and load.stats is not None
    rules: list[Rule] = [cache_rule(by_host, memory, load.resident_fraction),
                         gap_rule(gap.seconds), rank_shift_rule(hosts, restore.rank_shift)]
    phases = [Phase(run.stats.restore.per_iteration_s, run.stats.restore.per_rank_s,
                    tuple(nbytes)) for run, nbytes in ((save, written), (load, read))
              if run.stats is not None]
    why = comparability(spec.workload, nranks, spec.subset, spec.scale)
    return summary(spec.workload, nranks, hosts, memory, phases[0], phases[1], rules, why,
                   {"save": _own(save), "load": _own(load), "scale": str(spec.scale),
                    "subset": spec.subset, "rank_shift": restore.rank_shift,
                    "cache": restore.cache, "gap_s": gap.seconds,
                    "resident_before_each_read": list(load.resident_fraction)})


def _own(run: LayoutRun) -> dict[str, object]:
    """stampede's numbers of one half: aggregate GB/s (1e9), time to last rank, straggler
    ratio, the metadata ops' latency."""
    assert run.stats is not None
    done = run.stats.restore
    completion = next(op for op in run.stats.ops if op.op == run.stats.completion_op)
    return {"agg_gbps": completion.agg_gbps.median,
            "time_to_last_rank_s": done.time_to_last_rank_s.median,
            "straggler_ratio": done.straggler_ratio.median,
            "slowest_ranks": [rank for rank, _ in done.slowest_ranks[:4]],
            "metadata_p50_s": {op.op: op.latency.p50_s for op in run.stats.ops
                               if op.op in METADATA_OPS and op.count},
            "valid": not run.invalid_reason}


def _write(path: Path, document: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n")
    temporary.replace(path)


def _say(document: dict[str, Any], path: Path) -> None:
    metric = document["metric"]
    lines = [f"mlperf {document['workload']}: save "
             f"{format_plain(metric['save_checkpoint_duration_mean_seconds'])} s (max over ranks), "
             f"{format_plain(metric['save_checkpoint_throughput_GB_per_second'])} GB/s; "
             f"load {format_plain(metric['load_checkpoint_duration_mean_seconds'])} s, "
             f"{format_plain(metric['load_checkpoint_throughput_GB_per_second'])} GB/s (GB = 2**30 bytes); "
             f"DLIO's mean of per-checkpoint rates: save "
             f"{format_plain(metric['save_checkpoint_io_mean_GB_per_second'])}, load "
             f"{format_plain(metric['load_checkpoint_io_mean_GB_per_second'])} GB/s"]
    lines += [f"mlperf rule {rule['rule']}: {'ok' if rule['ok'] else 'BROKEN'}: {rule['detail']}"
              for rule in document["rules"]]
    lines += [f"mlperf: {reason}" for reason in document["not_comparable"]]
    lines.append(f"mlperf summary: {path}")
    print("\n".join(lines), file=sys.stderr, flush=True)
