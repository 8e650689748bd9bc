"""Archive rows: the columns every row shares (one builder, for run, startup, gpu and
imported rows), the rows of one layout's ops, and the sidecar document of a run."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime

from stampede import __version__
from stampede.filesystems import KERNEL_NFS_RPCS, mount_facts
from stampede.ops import RATE_OPS, SAVE_STORAGE_OPS, STORAGE_OPS
from stampede.results.amplification import Amplification
from stampede.results.archive import ARCHIVE_SCHEMA
from stampede.results.ceiling import ceiling_columns
from stampede.results.cells import cell
from stampede.results.columns import OWN_TOOL
from stampede.results.model import LayoutRun, RunContext, node_counts
from stampede.results.summaries import LayoutStats
from stampede.results.tiers import tier_column
from stampede.results.warnings import layout_warnings, residency_warning, throttle_warning
from stampede.spec import JobSpec
from stampede.sysinfo import node_facts, slurm_job_id, slurm_variables
from stampede.units import BYTES_PER_GB

MAX_HOSTS_IN_ROW = 8


def new_run_id(tag: str = "") -> str:
    """`<UTC time>-[<tag>-]<random>`: sorts by time, unique across concurrent runs."""
    return "-".join(filter(None, (f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}", tag,
                                  uuid.uuid4().hex[:8])))


def now_stamp() -> str:
    """A run's timestamp column: UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def hosts_cell(hosts: Sequence[str]) -> str:
    unique = sorted(set(hosts))
    shown = " ".join(unique[:MAX_HOSTS_IN_ROW])
    return shown + (f" (+{len(unique) - MAX_HOSTS_IN_ROW} more)" if len(unique) > MAX_HOSTS_IN_ROW else "")


def shared_columns(run_id: str, timestamp: str, job: str, backend: str, layout: str,
                   hosts: Sequence[str] = (), nranks: int = 0, nnodes: int = 0,
                   valid: bool = True, phase: str = "restore",
                   tool: str = OWN_TOOL) -> dict[str, object]:
    """The columns every archive row carries: which run, of what, by which tool, where, by
    whom. The rank and node counts come from the host of each rank, or are given
    (imported results)."""
    if hosts:
        nnodes, per_node = node_counts(list(hosts))
        nranks = len(hosts)
    else:
        per_node = -(-nranks // max(nnodes, 1))
    return {"schema": ARCHIVE_SCHEMA, "run_id": run_id, "timestamp": timestamp, "job": job,
            "backend": backend, "phase": phase, "tool": tool, "layout": layout,
            "nranks": nranks, "nnodes": nnodes,
            "ranks_per_node": per_node, "valid": valid, "stampede_version": __version__,
            "hosts": hosts_cell(hosts), "slurm_job_id": slurm_job_id()}


def archive_rows(spec: JobSpec, context: RunContext, layout_run: LayoutRun) -> list[dict[str, str]]:
    """One row per op of one layout, every row repeating the whole configuration."""
    stats = layout_run.stats
    assert stats is not None
    resident = statistics.median(layout_run.resident_fraction) \
        if layout_run.resident_fraction else None
    warnings = layout_warnings(spec, context, stats) + layout_run.notes + \
        residency_warning(spec.cache, resident) + throttle_warning(layout_run.client)
    shared = {
        **spec.columns(),
        **shared_columns(context.run_id, context.timestamp, spec.name, context.backend,
                         layout_run.layout, context.hosts, valid=not layout_run.invalid_reason,
                         phase=layout_run.phase),
        "bytes_per_rank": layout_run.bytes_per_rank,
        "bytes_total": layout_run.bytes_total or layout_run.bytes_per_rank * context.nranks,
        "iterations": stats.iterations, "invalid_reason": layout_run.invalid_reason,
        "fs_type": context.fs_type, "warnings": " | ".join(warnings), "device": context.device,
        "notes": " | ".join(layout_run.said),
        "cache_resident_pct": 100 * resident if resident is not None else None,
        "restored_from": layout_run.restored_from,
    }
    if context.checkpoint_format:   # an existing checkpoint: the format found, not asked
        shared["format"] = context.checkpoint_format
    rows = op_rows(shared, stats, layout_run.bytes_per_rank, context.hosts)
    for row in rows:
        if row["op"] == stats.completion_op:
            row.update({tier_column(tier): cell(nbytes)
                        for tier, nbytes in layout_run.tier_bytes.items()})
            if layout_run.phase == "restore" and layout_run.amplification is not None:
                row.update(amplification_columns(layout_run.amplification,
                                                 stats.restore.storage_bytes.median))
            if layout_run.phase == "restore" and context.ceiling is not None:
                row.update({name: cell(value) for name, value in ceiling_columns(
                    context.ceiling, stats.restore.storage_bytes.median,
                    stats.restore.storage_s.median, context.nnodes).items()})
        if row["op"] in STORAGE_OPS or row["op"] in SAVE_STORAGE_OPS:
            client = layout_run.client
            row.update(retries=cell(client.retries.get(row["op"], 0)),
                       throttles=cell(client.throttles.get(row["op"], 0)),
                       backoff_s=cell(client.backoff_s.get(row["op"], 0.0)))
    return rows


def amplification_columns(amplification: Amplification,
                          storage_bytes: float) -> dict[str, str]:
    """A restore's completion row: the unique bytes the job needed, and its read
    amplification per iteration, at its worst node and at its worst rank."""
    return {"needed_bytes": cell(amplification.needed_bytes),
            "read_amplification": cell(amplification.of(storage_bytes)),
            "read_amplification_node_max": cell(amplification.node_max),
            "read_amplification_rank_max": cell(amplification.rank_max)}


def op_rows(shared: dict[str, object], stats: LayoutStats, bytes_per_rank: int,
            hosts: Sequence[str]) -> list[dict[str, str]]:
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
        if op.op in RATE_OPS:  # restores or waits per second mean nothing (stampede.ops: unit)
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
                slowest_rank_gbps=bytes_per_rank / restore.time_to_last_rank_s.median / BYTES_PER_GB
                if restore.time_to_last_rank_s.median > 0 and bytes_per_rank else None,
                storage_s=restore.storage_s.median, network_s=restore.network_s.median,
                storage_ops_per_iteration=restore.storage_ops.median,
                storage_bytes_per_iteration=restore.storage_bytes.median,
                slowest_ranks=" ".join(f"{rank}@{hosts[rank]}:{seconds!r}"
                                       for rank, seconds in restore.slowest_ranks))
            if op.op == "save":
                row["unprotected_s"] = stats.unprotected_s
        rows.append({column: cell(value) for column, value in row.items()})
    return rows


def sidecar(spec: JobSpec, context: RunContext, runs: list[LayoutRun]) -> dict[str, object]:
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
        "node": {**node_facts(), **mount_facts(spec.target_path)},
        "slurm": slurm_variables(),
        **({"ceiling": context.ceiling.sidecar()} if context.ceiling is not None else {}),
        **{"layouts" if phase == "restore" else "saves": {
            run.layout: {
                "valid": not run.invalid_reason,
                "invalid_reason": run.invalid_reason,
                "errors": list(run.messages),
                "warnings": [*(layout_warnings(spec, context, run.stats) if run.stats else ()),
                             *run.notes],
                "retries": run.client.retries,
                "throttles": run.client.throttles,
                "backoff_s": run.client.backoff_s,
                "digests": list(run.digests),
                "cache_resident_fraction": list(run.resident_fraction),
                # which ranks dropped the page cache, and how often (one rank per node)
                "cache_drops_by_rank": list(run.cache_drops),
                "stats": asdict(run.stats) if run.stats else None,
                # what the file-system client said around the layout (stampede.run.file_system):
                # a kernel NFS mount's RPCs per op (always said, or why not), Lustre's llite
                # counters, the layout the files got (Lustre, CephFS)
                KERNEL_NFS_RPCS: (
                    f"not counted: the target is not on a kernel NFS mount ({context.fs_type})"),
                **run.file_system,
            }
            for run in runs if run.phase == phase
        } for phase in dict.fromkeys(("restore", *(run.phase for run in runs)))},
    }
