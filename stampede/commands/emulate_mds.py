"""`stampede emulate-mds`: mount the metadata-server emulator (stampede.emulate.mds) and
serve until unmounted or signalled."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stampede.emulate import mds as model


def register(commands: Any, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "emulate-mds", formatter_class=formatter,
        help="Mount a FUSE pass-through of a directory whose metadata requests (stat, open, "
             "readdir) are served by C slots of S seconds each: an overloaded NFS/Lustre "
             "metadata server on a laptop. Root only; runs until unmounted or signalled.",
        description="Mount a read-only FUSE pass-through of --backing at MOUNTPOINT that "
                    "delays every metadata request by a service time in one of C slots.",
        epilog=model.__doc__)
    sub.add_argument("mountpoint", metavar="MOUNTPOINT", help="an empty directory to mount on")
    sub.add_argument("--backing", required=True, metavar="DIR",
                     help="the directory whose files are shown (prepare the checkpoint here)")
    sub.add_argument("--service-s", type=float, default=0.005, metavar="S",
                     help="seconds each metadata request holds its slot (default 0.005)")
    sub.add_argument("--threads", type=int, default=4, metavar="C",
                     help="service slots: metadata requests served at once (default 4)")
    sub.add_argument("--serialize-inode", action="store_true",
                     help="requests on the same file wait for each other (a lock per path, "
                          "first come first served): the shared-file hot spot")
    sub.add_argument("--jitter-s", type=float, default=0.0, metavar="J",
                     help="add a uniform random [0, J) seconds to each service time (default 0)")
    sub.add_argument("--attr-cache-s", type=float, default=0.0, metavar="T",
                     help="the kernel's attribute and entry cache timeouts (default 0: every "
                          "stat reaches the emulator)")
    sub.add_argument("--priority", choices=("realtime", "normal"), default="realtime",
                     help="realtime (default): the server's threads run SCHED_FIFO where "
                          "allowed, so that a busy machine does not stretch the service time; "
                          "normal: as any process")
    sub.add_argument("--summary-json", default=None, metavar="PATH",
                     help="at exit, also write the summary (per op: requests, the service time "
                          "asked and held, the time queued) as JSON to PATH")
    sub.set_defaults(func=cmd_emulate_mds)


def cmd_emulate_mds(args: argparse.Namespace) -> int:
    import os

    from stampede.emulate.mds import MetadataServer, check_arguments, die_with_parent, load_fuse
    from stampede.emulate.service import precise_timers, realtime_priority
    from stampede.errors import RunFailed

    started_by = os.getppid()     # first: the parent may die while the rest loads
    backing, mountpoint = check_arguments(args)
    fuse = load_fuse()
    die_with_parent(started_by)
    precise_timers()              # before FUSE(): its worker threads inherit the timer slack
    priority = realtime_priority() if args.priority == "realtime" else "normal priority"

    def on_mount() -> None:
        print(mounted_text(args, backing, mountpoint, priority), file=sys.stderr, flush=True)

    def caller() -> tuple[int, int, int]:
        uid, gid, pid = fuse.fuse_get_context()
        return int(uid), int(gid), int(pid)

    server = MetadataServer(backing, args.service_s, args.threads, args.serialize_inode,
                            args.jitter_s, caller, on_mount)
    timeout = f"{args.attr_cache_s:g}"
    try:
        fuse.FUSE(server, mountpoint, foreground=True, nothreads=False, ro=True, allow_other=True,
                  attr_timeout=timeout, entry_timeout=timeout, negative_timeout=timeout,
                  fsname="stampede-emulate-mds")
    except RuntimeError as error:   # libfuse printed why (fuse: ...) just above
        raise RunFailed(f"mounting {mountpoint} failed (libfuse status {error})") from None
    print(f"emulate-mds: unmounted {mountpoint}; {server.summary()}", file=sys.stderr, flush=True)
    if args.summary_json:
        write_summary(args.summary_json, server, args, priority)
    return 0


def mounted_text(args: argparse.Namespace, backing: str, mountpoint: str, priority: str) -> str:
    """The line printed once the file system is mounted: what it serves, and how."""
    service = f"{args.service_s:g} s" + (f" + uniform [0, {args.jitter_s:g}) s" if args.jitter_s else "")
    serialized = ", requests on one file serialized" if args.serialize_inode else ""
    return (f"emulate-mds: mounted {backing} at {mountpoint}: {args.threads} slot(s) x {service}"
            f"{serialized}, kernel caches {args.attr_cache_s:g} s, {priority}; stop with Ctrl-C "
            f"or fusermount -u {mountpoint}")


def write_summary(path: str, server: model.MetadataServer, args: argparse.Namespace,
                  priority: str) -> None:
    import json

    document = {"service_s": args.service_s, "jitter_s": args.jitter_s, "threads": args.threads,
                "serialize_inode": args.serialize_inode, "priority": priority,
                "peak_in_service": server.tally.peak_in_service, "ops": server.tally.summaries()}
    with open(path, "w") as stream:
        json.dump(document, stream, indent=1)
