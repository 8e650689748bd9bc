"""The metadata stampede on a real NFS server across emulated nodes: nfs-ganesha on the
storage host of an emulated cluster (stampede emulate-cluster's machinery: network
namespaces, shaped NICs and storage link), every rank an NFS client of its own on its
node, shared and sharded restored, what each op cost on the wire.

For each node count in --nodes, a cluster of n nodes x --ranks-per-node ranks is built;
ganesha (NFSv4, FSAL VFS) serves a directory of the scratch area on the storage host's
address; one job (--size-per-rank per rank, stat_count --stats, warm) is prepared, run and
cleaned through the cluster's mpiexec. Printed per point and layout: the time to last
rank (median over --iterations), the stat and open p50, the run's RPCs per op (the
sidecar's storage.rpcs_per_op: counted on a relay by a client of its own, untimed). One
archive for all points: `stampede project ARCHIVE --target-ranks N --target-ranks-per-node K` fits it.
Root only (namespaces, tc), nfs-ganesha, libnfs, MPICH.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common import (
    VENV_BIN,
    archive_rows,
    comma_separated,
    docstring_parser,
    load_average_text,
    machine_text,
    scratch_directory,
    write_job_toml,
)

from stampede.emulate.cluster import new_cluster_id, running_cluster
from stampede.emulate.topology import STORAGE, Link, plan_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.nfsserver import PSEUDO, config, unavailable  # noqa: E402

NFS_PORT = 2049


def run_point(scratch: Path, nodes: int, args: object, archive: Path) -> str:
    """One cluster: ganesha on its storage host, prepare/run/clean; the run's id."""
    plan = plan_cluster(new_cluster_id(), nodes, args.ranks_per_node,  # type: ignore[attr-defined]
                        Link(args.node_gbps), Link(args.storage_gbps))  # type: ignore[attr-defined]
    with running_cluster(plan, scratch / f"cluster-{plan.cluster_id}") as cluster:
        storage = plan.storage
        assert storage is not None
        directory = scratch / f"nfs-{nodes}"
        (directory / "export").mkdir(parents=True)
        (directory / "recovery").mkdir()
        conf = directory / "ganesha.conf"
        conf.write_text(config(directory, directory / "export", NFS_PORT,
                               address=storage.address))
        cluster.popen(STORAGE, ["ganesha.nfsd", "-F", "-f", str(conf), "-L",
                                str(directory / "ganesha.log"), "-p",
                                str(directory / "ganesha.pid"), "-N", "NIV_EVENT"],
                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
        url = f"nfs://{storage.address}{PSEUDO}?version=4&nfsport={NFS_PORT}"
        deadline = time.monotonic() + 30
        while cluster.run("node0", ["nfs-ls", url], capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise SystemExit(f"ganesha did not serve on {storage.address}")
            time.sleep(0.5)
        job = write_job_toml(scratch / f"job-{nodes}.toml", {
            "target": {"path": f"nfs://{storage.address}:{NFS_PORT}{PSEUDO}/ck"},
            "checkpoint": {"size_per_rank": args.size_per_rank,  # type: ignore[attr-defined]
                           "layout": ["shared", "sharded"], "block_size": "1MiB"},
            "pattern": {"stat_count": args.stats},  # type: ignore[attr-defined]
            "run": {"iterations": args.iterations, "warmup": 1,  # type: ignore[attr-defined]
                    "verify": "none"},
            "archive": {"path": archive}})
        env = cluster.environment(str(VENV_BIN / "mpiexec"))
        launch = [str(VENV_BIN / "mpiexec"), *cluster.mpiexec_arguments, "-n",
                  str(plan.nranks), sys.executable, "-m", "stampede"]
        before = len(archive_rows(archive)) if archive.exists() else 0
        for step in ("prepare", "run", "clean"):
            command = launch if step != "clean" else [sys.executable, "-m", "stampede"]
            done = cluster.run("head", [*command, step, str(job)], env=env, capture_output=True,
                               text=True, timeout=900)
            if done.returncode:
                raise SystemExit(f"FAILED {step} at {nodes} node(s):\n{done.stdout[-3000:]}"
                                 f"{done.stderr[-3000:]}")
        return archive_rows(archive)[before]["run_id"]


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--nodes", type=lambda t: comma_separated(t, int), default=[1, 2, 3])
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--size-per-rank", default="4MiB")
    parser.add_argument("--stats", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--node-gbps", type=float, default=1.0)
    parser.add_argument("--storage-gbps", type=float, default=1.0)
    args = parser.parse_args()
    reason = unavailable()
    if reason:
        raise SystemExit(f"nfs_cluster: {reason}")
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    with scratch_directory("stampede-nfs-cluster-", None) as scratch:
        archive = scratch / "runs.csv"
        runs = [(nodes, run_point(scratch, nodes, args, archive)) for nodes in args.nodes]
        rows = archive_rows(archive)
        print(f"ganesha 4.3 NFSv4 on the storage host; {args.ranks_per_node} ranks per node, "
              f"{args.size_per_rank} per rank, stat_count {args.stats}, NICs "
              f"{args.node_gbps:g} GB/s, storage link {args.storage_gbps:g} GB/s")
        for nodes, run_id in runs:
            mine = [row for row in rows if row["run_id"] == run_id]
            for layout in ("shared", "sharded"):
                of = {row["op"]: row for row in mine if row["layout"] == layout}
                print(f"{nodes} node(s), {int(of['restore']['nranks'])} ranks, {layout}: time to "
                      f"last rank {float(of['restore']['time_to_last_rank_s']) * 1e3:.1f} ms; "
                      f"stat p50 {float(of['stat']['lat_p50_s']) * 1e6:.0f} µs, open p50 "
                      f"{float(of['open']['lat_p50_s']) * 1e6:.0f} µs")
            sidecar = json.loads((archive.with_name("runs.runs") / f"{run_id}.json").read_text())
            ops = sidecar["storage"]["rpcs_per_op"].get("ops", {})
            print("  RPCs per op: " + "; ".join(
                f"{op} {sum(count for count, _ in calls)}" for op, calls in ops.items()))
        projected = subprocess.run([str(VENV_BIN / "stampede"), "project", str(archive),
                                    "--target-ranks", "2048", "--target-ranks-per-node", "8"],
                                   capture_output=True, text=True)
        print("\n".join(line for line in projected.stdout.splitlines()
                        if "ranked at" in line or "residuals" in line or "bound by" in line))
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
