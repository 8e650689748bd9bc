"""From a finished run to archive rows and a sidecar document (rank 0 only)."""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict
from typing import Any

from stampede import __version__
from stampede.checkpoint.plan import EXCHANGE
from stampede.results.archive import ARCHIVE_SCHEMA, cell
from stampede.results.samples import RATE_OPS, STORAGE_OPS
from stampede.results.stats import LayoutStats, warnings_for
from stampede.run.job import LayoutRun, RunContext
from stampede.spec import JobSpec
from stampede.sysinfo import node_facts, slurm_variables

MAX_HOSTS_IN_ROW = 8
COLD_RESIDENT_MAX = 0.05   # a cold phase that starts with more cached than this is warned


def hosts_cell(hosts: tuple[str, ...]) -> str:
    unique = sorted(set(hosts))
    shown = " ".join(unique[:MAX_HOSTS_IN_ROW])
    return shown + (f" (+{len(unique) - MAX_HOSTS_IN_ROW} more)" if len(unique) > MAX_HOSTS_IN_ROW else "")


def layout_warnings(spec: JobSpec, context: RunContext, stats: LayoutStats) -> tuple[str, ...]:
    # Layouts that exchange verify the held shard after the restore; the others hash
    # between reads, inside it.
    checks = "+".join(filter(None, (spec.verify if spec.verify != "none" else "",
                                    "finite check" if spec.check_finite else "")))
    inline = checks if stats.layout not in EXCHANGE else ""
    notes = warnings_for(stats, spec.cache, context.ranks_per_node, os.cpu_count() or 1,
                         context.fs_type, inline)
    if spec.h2d == "host":
        notes += (f"h2d went to {context.device}: a stand-in for tests",)
    if stats.samples == "histogram":
        notes += ("p50-p99.9 interpolated in log buckets (run.samples = histogram): within 12% "
                  "of the exact values; min, max, counts, GB/s and restore times are exact",)
    checking = " and ".join(filter(None, (
        f"{spec.verify} hashing" if spec.verify != "none" else "",
        "the finite check" if spec.check_finite else "")))
    between = [what for what, on in ((checking, bool(inline)),
                                      ("copies to the device", spec.h2d != "none"
                                       and stats.layout not in EXCHANGE)) if on]
    if between:
        notes += (f"{' and '.join(between)} run between reads: the read op's aggregate GB/s "
                  "spans them (its latencies do not)",)
    return notes


def archive_rows(spec: JobSpec, context: RunContext, layout_run: LayoutRun) -> list[dict[str, str]]:
    """One row per op of one layout, every row repeating the whole configuration."""
    stats = layout_run.stats
    assert stats is not None
    warnings = layout_warnings(spec, context, stats) + layout_run.notes
    resident = statistics.median(layout_run.resident_fraction) \
        if layout_run.resident_fraction else None
    if spec.cache != "warm" and resident is not None and resident > COLD_RESIDENT_MAX:
        warnings += (f"cache={spec.cache}, yet {100 * resident:.0f}% of the bytes to read were "
                     "in the page cache when the phase started: not as cold as asked",)
    shared = {
        **spec.columns(),
        "schema": ARCHIVE_SCHEMA, "run_id": context.run_id, "timestamp": context.timestamp,
        "job": spec.name, "backend": context.backend, "layout": layout_run.layout,
        "nranks": context.nranks, "nnodes": context.nnodes,
        "ranks_per_node": context.ranks_per_node,
        "bytes_per_rank": layout_run.bytes_per_rank,
        "bytes_total": layout_run.bytes_total or layout_run.bytes_per_rank * context.nranks,
        "iterations": stats.iterations, "valid": not layout_run.invalid_reason,
        "invalid_reason": layout_run.invalid_reason,
        "stampede_version": __version__, "hosts": hosts_cell(context.hosts),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "fs_type": context.fs_type,
        "warnings": " | ".join(warnings), "device": context.device,
        "cache_resident_pct": 100 * resident if resident is not None else None,
    }
    if context.checkpoint_format:   # an existing checkpoint: the format found, not asked
        shared["format"] = context.checkpoint_format
    rows = op_rows(shared, stats, layout_run.bytes_per_rank, context.hosts)
    for row in rows:
        row["retries"] = cell(layout_run.retries.get(row["op"], 0)) \
            if row["op"] in STORAGE_OPS else ""
    return rows


def op_rows(shared: dict[str, object], stats: LayoutStats, bytes_per_rank: int,
            hosts: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of one layout: `shared` columns plus each op's results; the completion op
    (restore, or startup) also carries time to last rank and its kin."""
    restore = stats.restore
    rows = []
    for op in stats.ops:
        row: dict[str, object] = {
            **shared, "op": op.op, "samples": stats.samples, "count": op.count,
            "errors": op.errors, "op_bytes": op.bytes,
            "lat_min_s": op.latency.min_s, "lat_p50_s": op.latency.p50_s,
            "lat_p90_s": op.latency.p90_s, "lat_p99_s": op.latency.p99_s,
            "lat_p999_s": op.latency.p999_s, "lat_max_s": op.latency.max_s,
            "elapsed_s": op.elapsed_s.median,
        }
        if op.op in RATE_OPS and op.op != "verify":  # restores or waits per second mean nothing
            row.update(ops_per_s=op.ops_per_s.median, ops_per_s_min=op.ops_per_s.min,
                       ops_per_s_max=op.ops_per_s.max)
        # GB/s only for ops that move bytes between real stamps (verify's stop is its start
        # plus summed hashing time, so its span across ranks is not a time anything took)
        if op.bytes and op.op != "verify":
            row.update(agg_gbps=op.agg_gbps.median, agg_gbps_min=op.agg_gbps.min,
                       agg_gbps_max=op.agg_gbps.max)
        if op.op == stats.completion_op:
            row.update(
                time_to_last_rank_s=restore.time_to_last_rank_s.median,
                time_to_last_rank_min_s=restore.time_to_last_rank_s.min,
                time_to_last_rank_max_s=restore.time_to_last_rank_s.max,
                first_done_s=restore.first_done_s.median,
                straggler_ratio=restore.straggler_ratio.median,
                # BW_rank_io of the recovery model: the slowest rank's effective rate.
                slowest_rank_gbps=bytes_per_rank / restore.time_to_last_rank_s.median / 1e9
                if restore.time_to_last_rank_s.median > 0 and bytes_per_rank else None,
                storage_s=restore.storage_s.median, network_s=restore.network_s.median,
                storage_ops_per_iteration=restore.storage_ops.median,
                storage_bytes_per_iteration=restore.storage_bytes.median,
                slowest_ranks=" ".join(f"{rank}@{hosts[rank]}:{seconds!r}"
                                       for rank, seconds in restore.slowest_ranks))
        rows.append({column: cell(value) for column, value in row.items()})
    return rows


def sidecar(spec: JobSpec, context: RunContext, runs: list[LayoutRun]) -> dict[str, Any]:
    """Everything the CSV cannot hold: per-rank detail, hosts, MPI, mounts, Slurm."""
    return {
        "schema": ARCHIVE_SCHEMA,
        "run_id": context.run_id,
        "timestamp": context.timestamp,
        "stampede_version": __version__,
        "job": {"name": spec.name, "source": spec.source,
                "options": {key: list(v) if isinstance(v, tuple) else v
                            for key, v in spec.values.items()}},
        "nranks": context.nranks,
        "hosts_by_rank": list(context.hosts),
        "mpi_library": context.mpi_library,
        "backend": context.backend,
        "storage": context.storage,
        "node": node_facts(spec.target_path),
        "slurm": slurm_variables(),
        "layouts": {
            run.layout: {
                "valid": not run.invalid_reason,
                "invalid_reason": run.invalid_reason,
                "errors": list(run.messages),
                "warnings": [*(layout_warnings(spec, context, run.stats) if run.stats else ()),
                             *run.notes],
                "retries": run.retries,
                "digests": list(run.digests),
                "cache_resident_fraction": list(run.resident_fraction),
                "stats": asdict(run.stats) if run.stats else None,
            }
            for run in runs
        },
    }
