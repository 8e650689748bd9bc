"""`stampede emulate-mds`: mount the metadata-server emulator (stampede.emulate.mds) and
serve until unmounted or signalled."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from stampede.commands.outputs import add_output
from stampede.emulate import mds as model
from stampede.emulate import writable
from stampede.emulate.service import LOG_LIMIT

if TYPE_CHECKING:
    from stampede.commands import Subparsers

# libfuse 3 caps its worker threads (10 by default); libfuse 2's pool grew with the
# requests in flight, and so must this one: a request waits in the emulator's queues (its
# slots, its FIFO locks, where it is logged), not unseen in the kernel's
MAX_WORKER_THREADS = 4096
MAX_IDLE_THREADS = 10     # libfuse 2's, fixed there (libfuse 3.14 warns when it is not given)
# fuse_main's status in libfuse 3 once its loop ended on SIGTERM, SIGINT or SIGHUP (libfuse
# 2 said 0): after a mount, the stop asked for, not a failure
STOPPED_BY_SIGNAL = 8


def register(commands: Subparsers, formatter: type[argparse.HelpFormatter]) -> None:
    sub = commands.add_parser(
        "emulate-mds", formatter_class=formatter,
        help="Mount a FUSE pass-through of a directory whose metadata requests (stat, open, "
             "readdir; with --writable also create, mkdir, rename, unlink, rmdir, fsync) are "
             "served by C slots of S seconds each: an overloaded NFS/Lustre metadata server "
             "on a laptop. Root only; runs until unmounted or signalled.",
        description="Mount a FUSE pass-through of --backing at MOUNTPOINT (read-only unless "
                    "--writable) that delays every metadata request by a service time in one "
                    "of C slots.",
        epilog=f"{model.__doc__}\n{writable.__doc__}")
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
    sub.add_argument("--writable", action="store_true",
                     help="serve writes too (what stampede save does): create, mkdir, rename, "
                          "unlink, rmdir and fsync each hold a slot for its own service time "
                          "(below); data written passes straight through")
    for flag, what in (("create", "a new file (open with O_CREAT)"), ("mkdir", "a new directory"),
                     ("rename", "a rename"), ("unlink", "a file's removal"),
                     ("rmdir", "a directory's removal"),
                     ("fsync", "an fsync of a file or a directory")):
        sub.add_argument(f"--{flag}-s", type=float, default=None, metavar="S",
                         help=f"with --writable: seconds {what} holds its slot (default: "
                              "--service-s)")
    sub.add_argument("--serialize-dir", action="store_true",
                     help="with --writable: create, mkdir, rename, unlink and rmdir in one "
                          "directory wait for each other (a lock per parent directory, first "
                          "come first served): the create storm of many files in one directory")
    sub.add_argument("--jitter-s", type=float, default=0.0, metavar="J",
                     help="add a uniform random [0, J) seconds to each service time (default 0)")
    sub.add_argument("--attr-cache-s", type=float, default=0.0, metavar="T",
                     help="the kernel's attribute and entry cache timeouts (default 0: every "
                          "stat reaches the emulator)")
    sub.add_argument("--priority", choices=("realtime", "normal"), default="realtime",
                     help="realtime (default): the server's threads run SCHED_FIFO where "
                          "allowed, so that a busy machine does not stretch the service time; "
                          "normal: as any process")
    add_output(sub, "--summary-json", default=None, metavar="PATH",
               help="at exit, also write the summary (per op: requests, the service time "
                    "asked and held, the time queued) as JSON to PATH")
    add_output(sub, "--log", default=None, metavar="PATH",
               help="at exit, write every request served as JSON lines to PATH: op, "
                    "paths, the locks it queued on, when it arrived, took its slot and "
                    "left it (monotonic clock), the slot")
    sub.add_argument("--log-limit", type=int, default=LOG_LIMIT, metavar="N",
                     help=f"requests the log keeps (in memory until exit; default {LOG_LIMIT:,}); "
                          "the rest are counted")
    sub.set_defaults(func=cmd_emulate_mds)


def cmd_emulate_mds(args: argparse.Namespace) -> int:
    import os
    import threading

    from stampede.emulate.mds import check_arguments, die_with_parent, load_fuse
    from stampede.emulate.service import ServiceLog, precise_timers, realtime_priority
    from stampede.errors import RunFailed

    started_by = os.getppid()     # first: the parent may die while the rest loads
    writable.check_write_flags(args)
    backing, mountpoint = check_arguments(args)
    fuse = load_fuse()
    die_with_parent(started_by)
    precise_timers()              # before FUSE(): its worker threads inherit the timer slack
    priority = realtime_priority() if args.priority == "realtime" else "normal priority"

    mounted = threading.Event()

    def on_mount() -> None:
        mounted.set()
        print(mounted_text(args, backing, mountpoint, priority), file=sys.stderr, flush=True)

    def caller() -> tuple[int, int, int]:
        uid, gid, pid = fuse.fuse_get_context()
        return int(uid), int(gid), int(pid)

    server = new_server(args, backing, caller, on_mount)
    server.log = ServiceLog(args.log_limit) if args.log else None
    timeout = f"{args.attr_cache_s:g}"
    try:
        fuse.FUSE(server, mountpoint, foreground=True, nothreads=False, ro=not args.writable,
                  allow_other=True, attr_timeout=timeout, entry_timeout=timeout,
                  negative_timeout=timeout, max_threads=str(MAX_WORKER_THREADS),
                  max_idle_threads=str(MAX_IDLE_THREADS), fsname="stampede-emulate-mds")
    except RuntimeError as error:   # libfuse printed why (fuse: ...) just above
        if not (mounted.is_set() and error.args == (STOPPED_BY_SIGNAL,)):
            raise RunFailed(f"mounting {mountpoint} failed (libfuse status {error})") from None
    print(f"emulate-mds: unmounted {mountpoint}; {server.summary()}", file=sys.stderr, flush=True)
    if server.log is not None:
        server.log.write(args.log)
        dropped = f" ({server.log.dropped} more not kept: --log-limit)" if server.log.dropped else ""
        print(f"emulate-mds: logged {len(server.log)} request(s) to {args.log}{dropped}",
              file=sys.stderr, flush=True)
    if args.summary_json:
        write_summary(args.summary_json, server, args, priority)
    return 0


def new_server(args: argparse.Namespace, backing: str, caller: Callable[[], tuple[int, int, int]],
               on_mount: Callable[[], None]) -> model.MetadataServer:
    """The read-only server, or with --writable the one that serves the save too."""
    if not args.writable:
        return model.MetadataServer(backing, args.service_s, args.threads, args.serialize_inode,
                                    args.jitter_s, caller, on_mount)
    times = writable.write_times(args)
    return writable.WritableServer(backing, args.service_s, args.threads, args.serialize_inode,
                                   args.jitter_s, caller, on_mount,
                                   op_s={op: times[flag] for op, flag in writable.TIMED_FLAGS.items()},
                                   serialize_dir=args.serialize_dir)


def mounted_text(args: argparse.Namespace, backing: str, mountpoint: str, priority: str) -> str:
    """The line printed once the file system is mounted: what it serves, and how."""
    service = f"{args.service_s:g} s" + (f" + uniform [0, {args.jitter_s:g}) s" if args.jitter_s else "")
    serialized = ", requests on one file serialized" if args.serialize_inode else ""
    writes = ""
    if args.writable:
        times = ", ".join(f"{op} {writable.write_times(args)[op]:g} s" for op in writable.WRITE_FLAGS)
        writes = (f"; writable: {times}"
                  + (", entry changes serialized per directory" if args.serialize_dir else ""))
    return (f"emulate-mds: mounted {backing} at {mountpoint}: {args.threads} slot(s) x {service}"
            f"{serialized}{writes}, kernel caches {args.attr_cache_s:g} s, {priority}; stop with "
            f"Ctrl-C or fusermount -u {mountpoint}")


def write_summary(path: str, server: model.MetadataServer, args: argparse.Namespace,
                  priority: str) -> None:
    import json

    document = {"service_s": args.service_s, "jitter_s": args.jitter_s, "threads": args.threads,
                "serialize_inode": args.serialize_inode, "priority": priority,
                "writable": args.writable, "serialize_dir": args.serialize_dir,
                "write_s": writable.write_times(args) if args.writable else {},
                "peak_in_service": server.tally.peak_in_service, "ops": server.tally.summaries(),
                "log": None if server.log is None else
                {"path": args.log, "requests": len(server.log), "dropped": server.log.dropped}}
    with open(path, "w") as stream:
        json.dump(document, stream, indent=1)
