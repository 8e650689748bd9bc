"""`stampede rejoin`: a save in tiers (node-local, a peer on another node, storage), nodes
lost, hot spares in their place, and the rejoin from the tiers measured beside a full
restart from storage, in one run and one report (stampede.run.rejoin)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from stampede.commands.flags import add_job_arguments, job_world, overrides
from stampede.errors import UsageError

if TYPE_CHECKING:
    from stampede.commands import Subparsers

EPILOG = """\
The ranks on the last tiers.spare_nodes nodes are hot spares: idle through the save, they
take the places of the ranks of the tiers.lost_nodes lost nodes (the last working ones).
Archived as six layouts of one run: save/tier-local, save/tier-peer, save/tier-storage
(time to last rank = from the save's start until every shard is durable on its node, on a
peer, on storage), startup/spare-start (the spare ranks' own start-up after the loss: each
starts a process of stampede's own, launch -> MPI ready, as `stampede startup` times it:
the rejoin's T_pod_init), restore/rejoin and restore/restart (time to last rank of the
restored job: survivors from their local tier, spares from a peer or storage; or everyone
from storage). --sizes A,B: one run per shard size, from which `mttr` fits the rejoin's
fixed cost. The report's notes say the bytes from each tier and the tier of each rank.
The storage copy drains in a thread of each rank while it goes on (tiers.drain): blocked
= until the rank's local and peer copies are done; published (tiers.publish) = once every
shard is on that tier; each tier's unprotected = how long the published version was not
yet on it. With tiers.versions > 1 each tier keeps its own number of versions
(tiers.keep_local, keep_peer, keep_storage), the last one restored. `stampede mttr`,
`project` and `report --html` on the archive: T_MTTR of the rejoin and of the full restart
side by side, as measured and at the target (--target-ranks, default 16,384).

  mpiexec -hosts node0:2,node1:2,node2:2 -n 6 stampede rejoin jobs/rejoin.toml
  stampede emulate-cluster --nodes 3 --ranks-per-node 1 --no-storage -- \\
      sh -c '$STAMPEDE_CLUSTER_MPIEXEC -n 3 stampede rejoin jobs/rejoin.toml'

Everything the run writes (every node's local tier, the storage tier under the target:
tiers-JOB/) is removed when it ends; what a run that did not finish left is refused, and
--clean (launched on the same nodes) removes it."""


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    from stampede.commands.job import job_keys_help

    sub = commands.add_parser(
        "rejoin", formatter_class=formatter, epilog=EPILOG + "\n\n" + job_keys_help(),
        help="Save in tiers (node-local, peer, storage), lose nodes, rejoin with hot spares "
             "from the tiers, and restart from storage beside it: timed, archived, reported.",
        description="A node lost and a hot spare in its place: the restore from node-local "
                    "and peer tiers measured against the full restart from storage, with "
                    "the same bytes in the same run. Launch with mpiexec/srun on several "
                    "nodes (at least: one survivor, one lost, one spare).")
    add_job_arguments(sub, access="write")
    sub.add_argument("--damage", choices=("none", "missing", "corrupt"), default="none",
                     help="after the loss, the surviving replicas of the lost shards are "
                          "deleted (missing) or have a byte flipped (corrupt): the spares "
                          "must fall back to storage and say so (default none; corrupt "
                          "needs run.verify to check the bytes)")
    sub.add_argument("--sizes", default="", metavar="SIZES",
                     help="comma-separated shard sizes, e.g. 8MiB,16MiB: one rejoin run per "
                          "size (checkpoint.size_per_rank), one after the other, in one launch; "
                          "from two sizes `mttr` and `project` fit the rejoin's fixed cost and "
                          "B_node (time = fixed + bytes / B) instead of one size's bytes / time")
    sub.add_argument("--clean", action="store_true",
                     help="measure nothing: remove what a rejoin of this job that did not "
                          "finish left (its shards and replicas on every node's local tier, "
                          "its storage tier); launch it as the rejoin was, on the same nodes")
    sub.set_defaults(func=cmd_rejoin)


def cmd_rejoin(args: argparse.Namespace) -> int:
    from functools import partial

    from stampede.backends import backend_name_for
    from stampede.commands.job import measure
    from stampede.results.tiers import SPARE_START, TIER_RESTORES, TIER_SAVES
    from stampede.run.rejoin import check_damage, rejoin_job
    from stampede.run.tier_dirs import check_local_dir
    from stampede.spec import load_job

    # every size's job validated before MPI and any I/O
    specs = [load_job(args.job, overrides(args) + sized) for sized in _sizes(args.sizes)]
    spec = specs[0]
    backend_name_for(spec.target_path)
    for each in specs:
        check_damage(each, args.damage)
    if not args.clean:
        check_local_dir(spec)
    comm = job_world(args, spec)   # the target held for the whole command
    if args.clean:
        from stampede.run.tier_dirs import clean_job
        removed = clean_job(comm, spec)
        if comm.Get_rank() == 0:
            print(f"stampede rejoin --clean {spec.name}: {removed} file(s) removed from the "
                  f"local tiers under {spec.tier_dir} and from {spec.target_path}")
        return 0
    if comm.Get_rank() == 0 and args.damage != "none":
        print(f"stampede rejoin: --damage {args.damage}: the lost shards' replicas are "
              f"{'deleted' if args.damage == 'missing' else 'corrupted'} after the loss",
              file=sys.stderr)
    for each in specs:   # one run per size, each archived whole before the next
        measure(comm, each, "rejoin", (*TIER_SAVES, SPARE_START, *TIER_RESTORES),
                f"{each.tier_peers} peer replica(s) ({each.tier_placement}), "
                f"{each.spare_nodes} spare node(s), {each.lost_nodes} lost, "
                f"{each.warmup} warmup + {each.iterations} iterations of each restore, cache "
                f"{each.cache}", partial(rejoin_job, damage=args.damage))
    return 0


def _sizes(text: str) -> list[list[str]]:
    """--sizes as the --set overrides of each run ([[]]: the job's own size); exit 2 on a
    size that is not one, or one given twice."""
    from stampede.units import parse_size

    if not text:
        return [[]]
    found: list[int] = []
    for item in text.split(","):
        try:
            size = parse_size(item.strip())
        except ValueError as error:
            raise UsageError(f"--sizes {text}: {item!r}: {error}") from None
        if size <= 0 or size in found:
            raise UsageError(f"--sizes {text}: {item!r}: each size must be > 0 and given once")
        found.append(size)
    return [[f"checkpoint.size_per_rank={size}"] for size in found]
