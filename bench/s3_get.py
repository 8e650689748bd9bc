"""S3 ranged-GET throughput and client CPU: stampede's S3 backend versus the fastest bare
client loop, one run, the same objects on the same server.

The script starts its own S3 server (SeaweedFS `weed mini` on 127.0.0.1,
tests/helpers/s3server.py), uploads --objects objects of --size random bytes, then reads
every object front to back in --block ranged GETs, one request at a time, each way:

  stampede     the backend's timed path, as a rank runs it: open (one HEAD), then
               read_into(handle, buffer, offset) per block into one page-aligned buffer
               (one ranged GET each, its body read from the socket into the buffer), close.
  boto3        client.get_object(Bucket, Key, Range=...)["Body"].read() per block.
  obstore      obstore.get_range(store, key, start=, length=) per block (Rust's
               object_store; its bytes stay in Rust's buffer, not copied anywhere: the
               cheapest use of it), retries off.
  awscrt       the CRT's S3Client.make_request(GET_OBJECT) with the Range header,
               part_size = --block, retries off; on_body counts the chunks (no copy).
  http.client  the floor of Python: a kept-alive http.client connection, each request
               signed by botocore's S3SigV4Auth, the body readinto() one buffer.

obstore and awscrt are optional: a side whose package is missing is left out, and said so.

A side's GB/s in a round = the bytes it read / the wall time of its own reads
(perf_counter); client CPU = this process's CPU time (every thread: the CRT's event loop
too) per GB read, what the client itself costs (the server runs on the same cores and
competes for them: on loopback a cheaper client is also a faster one). One untimed pass of
each side first checks that every side reads the bytes uploaded. Then --rounds rounds;
in each, every object is read once by every side, the sides taking turns object by object
in an order rotated at every object, so load from other work on the machine, which comes
and goes, falls on all sides alike. The table shows the median (min-max) over rounds;
a ratio is the median over rounds of the two sides' ratio in the same round (paired: a
slow round is slow for both), the ratio of the medians beside it. GB = 1e9 bytes.
Target: stampede / the fastest bare loop (the one whose ratio is lowest) >= 0.95. The
verdict is printed, never an exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    MedianMinMax,
    add_scratch_parent_option,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    ratio_verdict,
)

from stampede.backends import open_backend
from stampede.buffers import AlignedBuffer
from stampede.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.s3server import S3Server, running_server, weed_binary  # noqa: E402

TARGET_RATIO = 0.95
PREFIX = "bench"
REGION = "us-east-1"
ALL_SIDES = ("stampede", "boto3", "obstore", "awscrt", "http.client")
OPTIONAL = {"obstore": "obstore", "awscrt": "awscrt"}   # side -> the package it needs
# (object key, check) -> bytes read of that object, front to back; with check, hashed and
# compared with what was uploaded
Reader = Callable[[str, bool], int]
Ranges = list[tuple[int, int]]


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--objects", type=int, default=4, help="objects (default 4)")
    parser.add_argument("--size", default="64MiB", help="bytes per object (default 64MiB)")
    parser.add_argument("--block", default="8MiB", help="bytes per ranged GET (default 8MiB)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="timed rounds, each side once per round (default 7)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes, args.block_bytes = parse_size(args.size), parse_size(args.block)
    except ValueError as error:
        parser.error(str(error))
    if args.objects < 1 or args.rounds < 1 or args.block_bytes > args.size_bytes:
        parser.error("--objects and --rounds must be >= 1, --block at most --size")
    return args


def upload(server: S3Server, count: int, size_bytes: int) -> dict[str, str]:
    """count objects of random bytes through stampede's writer; key -> sha256."""
    backend = open_backend(f"s3://{server.bucket}/{PREFIX}", {"endpoint_url": server.endpoint_url})
    digests = {}
    piece = 8 * 2**20
    for index in range(count):
        relpath = f"object-{index:04d}.bin"
        digest = hashlib.sha256()
        with backend.writer(relpath) as writer:
            for offset in range(0, size_bytes, piece):
                data = os.urandom(min(piece, size_bytes - offset))
                digest.update(data)
                writer.write_at(offset, memoryview(data))
        digests[f"{PREFIX}/{relpath}"] = digest.hexdigest()
    return digests


def blocks(size_bytes: int, block_bytes: int) -> Ranges:
    return [(offset, min(block_bytes, size_bytes - offset))
            for offset in range(0, size_bytes, block_bytes)]


def looped(side: str, digests: dict[str, str], ranges: Ranges,
           read: Callable[[str, int, int], Any]) -> Reader:
    """One object: read(key, offset, length) per block, in order; what read returns is
    the block's bytes (a buffer) or, where it keeps none, its length."""
    def one_object(key: str, check: bool) -> int:
        total = 0
        digest = hashlib.sha256() if check else None
        for offset, length in ranges:
            got = read(key, offset, length)
            total += got if isinstance(got, int) else len(got)
            if digest is not None:
                digest.update(b"" if isinstance(got, int) else got)
        if digest is not None and digest.hexdigest() != digests[key]:
            raise SystemExit(f"{side} read wrong bytes from {key}")
        return total

    return one_object


def stampede_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    backend = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    buffer = AlignedBuffer(max(length for _, length in ranges), populate=True)
    paths = {key: backend.path(key) for key in digests}
    views = [(offset, buffer.prefix(length)) for offset, length in ranges]
    open_, read_into, close = backend.opener(False), backend.read_into, backend.close

    def one_object(key: str, check: bool) -> int:
        total = 0
        digest = hashlib.sha256() if check else None
        handle = open_(paths[key])
        for offset, view in views:
            count = read_into(handle, view, offset)
            total += count
            if digest is not None:
                digest.update(view[:count])
        close(handle)
        if digest is not None and digest.hexdigest() != digests[key]:
            raise SystemExit(f"stampede read wrong bytes from {key}")
        return total

    return one_object


def boto3_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=REGION)

    def read(key: str, offset: int, length: int) -> bytes:
        return client.get_object(Bucket=server.bucket, Key=key,
                                 Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()

    return looped("boto3", digests, ranges, read)


def obstore_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    import obstore
    from obstore.store import S3Store

    store = S3Store(server.bucket, endpoint=server.endpoint_url, region=REGION,
                    client_options={"allow_http": True}, retry_config={"max_retries": 0})

    def read(key: str, offset: int, length: int) -> Any:
        return obstore.get_range(store, key, start=offset, length=length)

    return looped("obstore", digests, ranges, read)


def awscrt_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import (
        S3Client,
        S3RequestTlsMode,
        S3RequestType,
        S3RetryConfig,
        S3RetryMode,
        create_default_s3_signing_config,
    )

    loops = EventLoopGroup(1)
    client = S3Client(
        bootstrap=ClientBootstrap(loops, DefaultHostResolver(loops)), region=REGION,
        tls_mode=S3RequestTlsMode.DISABLED, part_size=max(length for _, length in ranges),
        signing_config=create_default_s3_signing_config(
            region=REGION, credential_provider=AwsCredentialsProvider.new_environment()),
        retry_config=S3RetryConfig(retry_mode=S3RetryMode.NONE))
    host = server.endpoint_url.removeprefix("http://")
    checking: list[bool] = [False]

    def read(key: str, offset: int, length: int) -> Any:
        pieces: list[bytes] = []
        counted = [0]

        def on_body(chunk: bytes, **_: Any) -> None:
            counted[0] += len(chunk)
            if checking[0]:
                pieces.append(chunk)

        request = HttpRequest("GET", f"/{server.bucket}/{key}", HttpHeaders(
            [("Host", host), ("Range", f"bytes={offset}-{offset + length - 1}")]))
        client.make_request(type=S3RequestType.GET_OBJECT, request=request,
                            on_body=on_body).finished_future.result()
        return b"".join(pieces) if checking[0] else counted[0]

    plain = looped("awscrt", digests, ranges, read)

    def one_object(key: str, check: bool) -> int:
        checking[0] = check
        return plain(key, check)

    return one_object


def http_client_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    import botocore.session
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest

    credentials = botocore.session.Session().get_credentials().get_frozen_credentials()
    signer = S3SigV4Auth(credentials, "s3", REGION)
    host = server.endpoint_url.removeprefix("http://")
    connection = http.client.HTTPConnection(host, timeout=30)
    buffer = AlignedBuffer(max(length for _, length in ranges), populate=True)

    def read(key: str, offset: int, length: int) -> memoryview:
        request = AWSRequest("GET", f"{server.endpoint_url}/{server.bucket}/{key}",
                             headers={"Range": f"bytes={offset}-{offset + length - 1}"})
        signer.add_auth(request)
        connection.request("GET", f"/{server.bucket}/{key}", headers=dict(request.headers.items()))
        response = connection.getresponse()
        view = buffer.prefix(length)
        count = response.readinto(view)
        while count < length:
            more = response.readinto(view[count:])
            if not more:
                raise SystemExit(f"http.client: {key} at {offset}: the body ended early")
            count += more
        return view

    return looped("http.client", digests, ranges, read)


FACTORIES: dict[str, Callable[[S3Server, dict[str, str], Ranges], Reader]] = {
    "stampede": stampede_reader, "boto3": boto3_reader, "obstore": obstore_reader,
    "awscrt": awscrt_reader, "http.client": http_client_reader}


def timed_read(reader: Reader, key: str, expected_bytes: int) -> tuple[float, float]:
    """(wall seconds, client CPU seconds) of one side reading one object."""
    start, cpu_start = time.perf_counter(), time.process_time()
    nbytes = reader(key, False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if nbytes != expected_bytes:
        raise SystemExit(f"a read of {key} gave {nbytes} bytes, not {expected_bytes}")
    return seconds, cpu_seconds


def available_sides() -> tuple[tuple[str, ...], list[str]]:
    """(the sides whose packages are installed, what is left out and why)."""
    missing = [side for side, package in OPTIONAL.items()
               if importlib.util.find_spec(package) is None]
    return (tuple(side for side in ALL_SIDES if side not in missing),
            [f"{side} left out: pip install {OPTIONAL[side]}" for side in missing])


def versions(sides: tuple[str, ...]) -> str:
    from importlib.metadata import version

    packages = ["botocore", "boto3"] + [OPTIONAL[side] for side in sides if side in OPTIONAL]
    return ", ".join(f"{name} {version(name)}" for name in packages) + \
        f", Python {sys.version.split()[0]}"


def weed_version() -> str:
    import subprocess

    output = subprocess.run([weed_binary() or "weed", "version"], capture_output=True,
                            text=True).stdout
    return " ".join(output.split()[:3]) or "weed ?"


@dataclass(frozen=True)
class Summary:
    """Per side, over the rounds: GB/s (median, min, max) and median client CPU s/GB; and
    per bare side, the median over rounds of stampede's GB/s / its GB/s in that round."""

    gbps: dict[str, MedianMinMax]
    cpu_s_per_gb: dict[str, float]
    paired_ratio: dict[str, float]


def measure(server: S3Server, args: argparse.Namespace, sides: tuple[str, ...]) -> Summary:
    """Every round reads every object once per side, the sides taking turns object by
    object (in an order rotated each time), so a burst of load elsewhere on the machine
    falls on all sides alike; a side's round GB/s = its bytes / its own seconds."""
    os.environ.update(server.env)   # the dummy keys: clients read them from the environment
    digests = upload(server, args.objects, args.size_bytes)
    ranges = blocks(args.size_bytes, args.block_bytes)
    readers = {side: FACTORIES[side](server, digests, ranges) for side in sides}
    for side in sides:   # untimed: every side reads the right bytes (and warms the server)
        for key in digests:
            readers[side](key, True)
    gbps: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    turn = 0
    for round_number in range(args.rounds):
        seconds = dict.fromkeys(sides, 0.0)
        cpu_seconds = dict.fromkeys(sides, 0.0)
        for key in digests:
            shift = turn % len(sides)
            turn += 1
            for side in sides[shift:] + sides[:shift]:
                wall, used = timed_read(readers[side], key, args.size_bytes)
                seconds[side] += wall
                cpu_seconds[side] += used
        gb = args.objects * args.size_bytes / 1e9
        for side in sides:
            gbps[side].append(gb / seconds[side])
            cpu[side].append(cpu_seconds[side] / gb)
        print(f"  round {round_number + 1}: " + ", ".join(
            f"{side} {gbps[side][-1]:.3f}" for side in sides) + " GB/s", flush=True)
    paired = {side: statistics.median(ours / theirs for ours, theirs in
                                      zip(gbps["stampede"], gbps[side], strict=True))
              for side in sides if side != "stampede"}
    return Summary({side: median_min_max(gbps[side]) for side in sides},
                   {side: statistics.median(cpu[side]) for side in sides}, paired)


def print_table(summary: Summary) -> None:
    print(f"{'side':<12} {'GB/s median':>11} {'(min-max)':>16} {'client CPU s/GB':>16}")
    for side, (median, low, high) in summary.gbps.items():
        print(f"{side:<12} {median:>11.3f} ({low:6.3f}-{high:6.3f}) "
              f"{summary.cpu_s_per_gb[side]:>16.3f}")
    bare = [side for side in summary.gbps if side != "stampede"]
    # the fastest bare loop is the one stampede compares worst with, round by round
    fastest = min(bare, key=lambda side: summary.paired_ratio[side])
    for side in [fastest] + [other for other in bare if other != fastest]:
        ratio = summary.paired_ratio[side]
        of_medians = summary.gbps["stampede"][0] / summary.gbps[side][0]
        cpu_ratio = summary.cpu_s_per_gb["stampede"] / summary.cpu_s_per_gb[side]
        label = f"fastest bare loop ({side})" if side == fastest else side
        verdict = ratio_verdict(ratio, TARGET_RATIO, (summary.gbps["stampede"],
                                                      summary.gbps[side])) \
            if side == fastest else ""
        print(f"stampede / {label}: {ratio:.3f} GB/s (of the medians {of_medians:.3f}), "
              f"{cpu_ratio:.3f} CPU per GB  {verdict}".rstrip())


def main() -> int:
    args = parse_args()
    sides, left_out = available_sides()
    with running_server(args.dir) as server:
        print(f"{machine_text(with_ram=True)}; load average {load_average_text()}")
        print(f"server: {weed_version()} at {server.endpoint_url} (loopback); clients: "
              f"{versions(sides)}")
        for line in left_out:
            print(line)
        print(f"s3_get: {args.objects} objects x {args.size}, {args.block} ranged GETs, one at a "
              f"time, {args.rounds} rounds", flush=True)
        summary = measure(server, args, sides)
    print()
    print_table(summary)
    print("GB = 1e9 B; medians (min-max) over rounds; a GB/s ratio is the median over rounds "
          "of the two sides' ratio in that round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
