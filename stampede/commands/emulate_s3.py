"""`stampede emulate-s3`: a throttling S3 front on loopback (stampede.emulate.s3front) in
front of a real S3 server; serve until signalled."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, NoReturn

from stampede.commands.outputs import add_output
from stampede.emulate import throttle as rule

if TYPE_CHECKING:
    from stampede.commands import Subparsers

LOG_LIMIT = 200_000     # requests kept by default (about 30 MiB); the rest only counted
# what `emulate-cluster --s3-throttle` sets itself: the storage host's S3, its address
CLUSTER_SETS = ("--upstream", "--host", "--port")


def register(commands: Subparsers,
             formatter: type[argparse.HelpFormatter]) -> argparse.ArgumentParser:
    sub = commands.add_parser(
        "emulate-s3", formatter_class=formatter,
        help="Serve an S3 endpoint on 127.0.0.1 that forwards to a real S3 server (e.g. "
             "SeaweedFS) under per-prefix request-rate limits, answering 503 SlowDown "
             "beyond them and splitting a prefix that stays hot: S3's throttling on a "
             "laptop. Runs until signalled.",
        description="Forward S3 requests to --upstream, each first taking a token of its "
                    "prefix partition's read, write or list bucket; with none left, answer "
                    "503 SlowDown (S3's XML error, Retry-After).",
        epilog=rule.__doc__)
    sub.add_argument("--upstream", required=True, metavar="URL",
                     help="the S3 server to forward to (http://HOST:PORT; path-style)")
    sub.add_argument("--host", default="127.0.0.1", metavar="ADDRESS",
                     help="the IPv4 address to listen on (default 127.0.0.1; emulate-cluster's "
                          "storage host gives its own)")
    sub.add_argument("--port", type=int, default=0,
                     help="port to listen on (default 0: any free one, printed)")
    for flag, kind, what in (("get", "read", "GET/HEAD of objects (reads)"),
                             ("put", "write", "PUT/POST/DELETE (writes)"),
                             ("list", "list", "LISTs (GETs of the bucket)")):
        default = rule.S3_RATES_PER_S[kind] / rule.DEFAULT_SCALE
        sub.add_argument(f"--{flag}-rate", dest=f"{flag}_rate", type=float, default=default,
                         metavar="R",
                         help=f"{what} per second per prefix partition (default {default:g}: "
                              f"S3's {rule.S3_RATES_PER_S[kind]:,.0f} / "
                              f"{rule.DEFAULT_SCALE:g})")
    sub.add_argument("--burst", type=float, default=rule.DEFAULT_BURST, metavar="B",
                     help=f"requests a full bucket admits at once (default {rule.DEFAULT_BURST:g})")
    sub.add_argument("--split-delay-s", type=float, default=rule.DEFAULT_SPLIT_DELAY_S,
                     metavar="S",
                     help="a partition throttled this long splits by the next character of "
                          f"its keys (default {rule.DEFAULT_SPLIT_DELAY_S:g}; 0: at the "
                          "first 503; inf: never)")
    sub.add_argument("--partitioned", action="append", default=[], metavar="BUCKET/PREFIX",
                     help="start with this prefix split (as S3 partitions ahead of a load "
                          "when asked): each key under it counts against the partition of "
                          "one more character (BUCKET/ck/copy- gives copy-0/, copy-1/ their "
                          "own; BUCKET/ck/ gives hashed keys theirs); repeatable")
    add_output(sub, "--log", default=None, metavar="PATH",
               help="at exit, write every request as JSON lines to PATH: time_s (since "
                    "start), method, partition, kind, key, status, prefix (a LIST's), client "
                    "(the address it came from)")
    sub.add_argument("--log-limit", type=int, default=LOG_LIMIT, metavar="N",
                     help=f"requests the log keeps (in memory until exit; default {LOG_LIMIT:,})")
    add_output(sub, "--summary-json", default=None, metavar="PATH",
               help="at exit, also write the tally (per kind and partition: admitted, "
                    "denied) and the splits as JSON to PATH")
    sub.set_defaults(func=cmd_emulate_s3)
    return sub


def check_arguments(args: argparse.Namespace) -> str:
    """Every refusal before anything listens: the upstream's host:port."""
    import ipaddress
    from urllib.parse import urlsplit

    from stampede.errors import UsageError

    for flag, name in (("get", "get_rate"), ("put", "put_rate"), ("list", "list_rate")):
        value = getattr(args, name)
        if not 0 < value < float("inf"):
            raise UsageError(f"--{flag}-rate {value}: must be a finite number > 0")
    if not 1 <= args.burst < float("inf"):
        raise UsageError(f"--burst {args.burst}: must be a finite number >= 1")
    if not args.split_delay_s >= 0:
        raise UsageError(f"--split-delay-s {args.split_delay_s}: must be >= 0 (inf: never split)")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port}: must be 0-65535")
    try:
        ipaddress.IPv4Address(args.host)
    except ValueError:
        raise UsageError(f"--host {args.host!r}: must be an IPv4 address (127.0.0.1, or an "
                         "address of this host's)") from None
    for name in args.partitioned:
        if "/" not in name or not name.partition("/")[0]:
            raise UsageError(f"--partitioned {name!r}: must be BUCKET/PREFIX (a bucket, then "
                             "the key prefix; BUCKET/ alone splits the bucket's first "
                             "character)")
    if args.log_limit < 0:
        raise UsageError(f"--log-limit {args.log_limit}: must be >= 0")
    upstream = urlsplit(args.upstream)
    if upstream.scheme != "http" or not upstream.hostname or upstream.path not in ("", "/"):
        raise UsageError(f"--upstream {args.upstream!r}: must be http://HOST:PORT (plain HTTP, "
                         "no path)")
    return upstream.netloc


def cmd_emulate_s3(args: argparse.Namespace) -> int:
    import json
    import os
    import signal
    import threading

    from stampede.emulate.mds import die_with_parent
    from stampede.emulate.s3front import RequestLog, ThrottlingFront
    from stampede.errors import RunFailed

    started_by = os.getppid()
    upstream = check_arguments(args)
    die_with_parent(started_by)
    throttle = rule.Throttle({"read": args.get_rate, "write": args.put_rate,
                              "list": args.list_rate}, args.burst, args.split_delay_s)
    for name in args.partitioned:
        throttle.partitioned(*name.split("/", 1))
    log = RequestLog(args.log_limit) if args.log else None
    try:
        front = ThrottlingFront(upstream, throttle, host=args.host, port=args.port, log=log)
    except OSError as error:
        raise RunFailed(f"emulate-s3: cannot listen on {args.host}:{args.port}: "
                        f"{error.strerror or error}") from None
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda *_: stop.set())
    front.start()
    print(f"emulate-s3: serving {front.endpoint_url} -> http://{upstream}: per prefix "
          f"partition GET/HEAD {args.get_rate:g}/s, PUT/POST/DELETE {args.put_rate:g}/s, LIST "
          f"{args.list_rate:g}/s, burst {args.burst:g}, split after {args.split_delay_s:g} s "
          f"throttled{''.join(f', {name!r} partitioned' for name in args.partitioned)}; stop "
          "with Ctrl-C or SIGTERM", file=sys.stderr, flush=True)
    while not stop.wait(0.5):
        pass
    front.stop()
    splits = ", ".join(f"{name!r} at {when - front.started_s:.1f} s"
                       for when, name in throttle.splits) or "none"
    print(f"emulate-s3: stopped; {front.tally.text()}; splits: {splits}", file=sys.stderr,
          flush=True)
    if log is not None:
        log.write(args.log)
        dropped = f" ({log.dropped} more not kept: --log-limit)" if log.dropped else ""
        print(f"emulate-s3: logged {len(log)} request(s) to {args.log}{dropped}",
              file=sys.stderr, flush=True)
    if args.summary_json:
        document = {"get_rate": args.get_rate, "put_rate": args.put_rate,
                    "list_rate": args.list_rate, "burst": args.burst,
                    "split_delay_s": args.split_delay_s, "kinds": front.tally.summary(),
                    "partitions": {f"{name}|{verdict}": n for (name, verdict), n
                                   in sorted(front.tally.by_partition.items())},
                    "splits": [{"time_s": round(when - front.started_s, 6), "partition": name}
                               for when, name in throttle.splits]}
        with open(args.summary_json, "w") as stream:
            json.dump(document, stream, indent=1)
    return 0


def parse_for_cluster(text: str) -> tuple[list[str], argparse.Namespace]:
    """`emulate-cluster --s3-throttle FLAGS`: FLAGS (emulate-s3's own, as one string) split,
    parsed and checked as `stampede emulate-s3` checks them, outputs included, before the
    cluster is built; every refusal one UsageError naming --s3-throttle. The cluster sets
    --upstream, --host and --port itself (its storage host's S3 and address)."""
    import shlex

    from stampede.commands.outputs import check_outputs
    from stampede.errors import UsageError

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise UsageError(f"--s3-throttle {text!r}: {message}")

    try:
        words = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--s3-throttle {text!r}: {error}") from None
    taken = [word.partition("=")[0] for word in words if word.partition("=")[0] in CLUSTER_SETS]
    if taken:
        raise UsageError(f"--s3-throttle {text!r}: {taken[0]} is the cluster's to set (its "
                         "storage host's S3 and address)", hint="give the rates, burst, "
                         "split delay, --partitioned and --log only")
    top = Parser(prog="stampede", add_help=False)
    sub = register(top.add_subparsers(parser_class=Parser), argparse.HelpFormatter)
    args = top.parse_args(["emulate-s3", "--upstream", "http://127.0.0.1:1", *words])
    try:
        check_arguments(args)
        check_outputs(sub, args)
    except UsageError as error:
        raise UsageError(f"--s3-throttle: {error.message}", hint=error.hint) from None
    return words, args
