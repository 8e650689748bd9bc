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

GB/s of a pass = bytes read / wall time of the pass (perf_counter), over all objects;
client CPU = this process's CPU time (every thread: the CRT's event loop too) per GB read,
what the client itself costs (the server runs on the same cores and competes for them:
on loopback a cheaper client is also a faster one). One untimed pass of each side first
checks that every side reads the bytes uploaded. Then --rounds rounds, the sides in a
rotating order each round so load from other work on the machine, which comes and goes,
falls on all sides alike; the table shows the median (min-max) over rounds. GB = 1e9
bytes. Target: stampede / the fastest bare loop, as a ratio of GB/s medians, >= 0.95.
The verdict is printed, never an exit status.
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
# (pass over every object, check) -> bytes read; with check, each object's bytes hashed
Reader = Callable[[bool], int]
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
    """A pass: read(key, offset, length) per block of every object, in order; what it
    returns is the block's bytes (a buffer) or its length."""
    def one_pass(check: bool) -> int:
        total = 0
        for key in digests:
            digest = hashlib.sha256() if check else None
            for offset, length in ranges:
                got = read(key, offset, length)
                count = got if isinstance(got, int) else len(got)
                total += count
                if digest is not None:
                    digest.update(got if not isinstance(got, int) else b"")
            if digest is not None and digest.hexdigest() != digests[key]:
                raise SystemExit(f"{side} read wrong bytes from {key}")
        return total

    return one_pass


def stampede_reader(server: S3Server, digests: dict[str, str], ranges: Ranges) -> Reader:
    backend = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    buffer = AlignedBuffer(max(length for _, length in ranges), populate=True)
    paths = {key: backend.path(key) for key in digests}
    views = [(offset, buffer.prefix(length)) for offset, length in ranges]
    open_, read_into, close = backend.opener(False), backend.read_into, backend.close

    def one_pass(check: bool) -> int:
        total = 0
        for key, path in paths.items():
            digest = hashlib.sha256() if check else None
            handle = open_(path)
            for offset, view in views:
                count = read_into(handle, view, offset)
                total += count
                if digest is not None:
                    digest.update(view[:count])
            close(handle)
            if digest is not None and digest.hexdigest() != digests[key]:
                raise SystemExit(f"stampede read wrong bytes from {key}")
        return total

    return one_pass


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

    def one_pass(check: bool) -> int:
        checking[0] = check
        return plain(check)

    return one_pass


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


def timed_pass(reader: Reader, expected_bytes: int) -> tuple[float, float]:
    """(GB/s, client CPU seconds per GB) of one pass over every object."""
    start, cpu_start = time.perf_counter(), time.process_time()
    nbytes = reader(False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if nbytes != expected_bytes:
        raise SystemExit(f"a pass read {nbytes} bytes, not {expected_bytes}")
    return nbytes / seconds / 1e9, cpu_seconds / (nbytes / 1e9)


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


Summary = dict[str, tuple[MedianMinMax, float]]


def measure(server: S3Server, args: argparse.Namespace, sides: tuple[str, ...]) -> Summary:
    """side -> ((median, min, max) GB/s, median client CPU s/GB) over the rounds."""
    os.environ.update(server.env)   # the dummy keys: clients read them from the environment
    digests = upload(server, args.objects, args.size_bytes)
    ranges = blocks(args.size_bytes, args.block_bytes)
    readers = {side: FACTORIES[side](server, digests, ranges) for side in sides}
    expected = args.objects * args.size_bytes
    for side in sides:   # untimed: every side reads the right bytes (and warms the server)
        if readers[side](True) != expected:
            raise SystemExit(f"{side} read the wrong number of bytes")
    gbps: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for round_number in range(args.rounds):
        shift = round_number % len(sides)
        for side in sides[shift:] + sides[:shift]:
            rate, cpu_per_gb = timed_pass(readers[side], expected)
            gbps[side].append(rate)
            cpu[side].append(cpu_per_gb)
        print(f"  round {round_number + 1}: " + ", ".join(
            f"{side} {gbps[side][-1]:.3f}" for side in sides) + " GB/s", flush=True)
    return {side: (median_min_max(gbps[side]), statistics.median(cpu[side])) for side in sides}


def print_table(summary: Summary) -> None:
    print(f"{'side':<12} {'GB/s median':>11} {'(min-max)':>16} {'client CPU s/GB':>16}")
    for side, ((median, low, high), cpu_per_gb) in summary.items():
        print(f"{side:<12} {median:>11.3f} ({low:6.3f}-{high:6.3f}) {cpu_per_gb:>16.3f}")
    bare = {side: result for side, result in summary.items() if side != "stampede"}
    fastest = max(bare, key=lambda side: bare[side][0][0])
    ours, theirs = summary["stampede"], bare[fastest]
    ratio = ours[0][0] / theirs[0][0]
    verdict = ratio_verdict(ratio, TARGET_RATIO, (ours[0], theirs[0]))
    print(f"stampede / fastest bare loop ({fastest}): {ratio:.3f} GB/s, "
          f"{ours[1] / theirs[1]:.3f} CPU per GB  {verdict}")
    for side in bare:
        if side != fastest:
            print(f"stampede / {side}: {ours[0][0] / bare[side][0][0]:.3f} GB/s, "
                  f"{ours[1] / bare[side][1]:.3f} CPU per GB")


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
    print("GB = 1e9 B; medians (min-max) over rounds; ratios are of the medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
