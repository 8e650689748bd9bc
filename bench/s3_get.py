"""S3 ranged-GET throughput: stampede's S3 backend versus bare boto3 and bare s3fs, one run.

The script starts its own S3 server (SeaweedFS `weed mini` on 127.0.0.1, tests/s3server.py),
uploads --objects objects of --size random bytes, then reads every object front to back
in --block ranged GETs, one request at a time, three ways on the SAME objects:

  stampede  the backend's timed path, as a rank runs it: open (one HEAD), then
            read_into(handle, buffer, offset) per block into one page-aligned buffer
            (each block one ranged GET streamed into the buffer), close.
  boto3     a bare loop: client.get_object(Bucket, Key, Range="bytes=a-b")["Body"].read()
            per block (boto3's default client: urllib3, its own retries).
  s3fs      a bare loop: fs.cat_file(path, start, end) per block (an S3FileSystem with
            skip_instance_cache; cat_file is one ranged GET).

GB/s of a pass = bytes read / wall time of the pass (perf_counter), over all objects;
client CPU = this process's CPU time (every thread: s3fs's event loop too) per GB read,
what the client itself costs (the server runs on the same cores).
One untimed pass of each side first checks that every side reads the bytes uploaded.
Then --rounds rounds, the sides in a rotating order each round so load from other work on
the machine, which comes and goes, falls on all sides alike; the table shows the median
(min-max) over rounds. GB = 1e9 bytes. Target: stampede / boto3 and stampede / s3fs, as
ratios of medians, >= 0.9. The verdict is printed, never an exit status.
"""

from __future__ import annotations

import argparse
import hashlib
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/s3server.py
from tests.s3server import S3Server, running_server  # noqa: E402

TARGET_RATIO = 0.9
PREFIX = "bench"
SIDES = ("stampede", "boto3", "s3fs")
# (pass over every object) -> bytes read; `check` also hashes what each object's read gave
Reader = Callable[[bool], int]


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--objects", type=int, default=4, help="objects (default 4)")
    parser.add_argument("--size", default="64MiB", help="bytes per object (default 64MiB)")
    parser.add_argument("--block", default="8MiB", help="bytes per ranged GET (default 8MiB)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timed rounds, each side once per round (default 5)")
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


def blocks(size_bytes: int, block_bytes: int) -> list[tuple[int, int]]:
    return [(offset, min(block_bytes, size_bytes - offset))
            for offset in range(0, size_bytes, block_bytes)]


def stampede_reader(server: S3Server, digests: dict[str, str], size_bytes: int,
                    block_bytes: int) -> Reader:
    backend = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    buffer = AlignedBuffer(block_bytes, populate=True)
    paths = {key: backend.path(key) for key in digests}
    ranges = [(offset, buffer.prefix(length)) for offset, length in blocks(size_bytes, block_bytes)]
    open_, read_into, close = backend.opener(False), backend.read_into, backend.close

    def one_pass(check: bool) -> int:
        total = 0
        for key, path in paths.items():
            digest = hashlib.sha256() if check else None
            handle = open_(path)
            for offset, view in ranges:
                count = read_into(handle, view, offset)
                total += count
                if digest is not None:
                    digest.update(view[:count])
            close(handle)
            if digest is not None and digest.hexdigest() != digests[key]:
                raise SystemExit(f"stampede read wrong bytes from {key}")
        return total

    return one_pass


def boto3_reader(server: S3Server, digests: dict[str, str], size_bytes: int,
                 block_bytes: int) -> Reader:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint_url)
    ranges = [f"bytes={offset}-{offset + length - 1}" for offset, length in blocks(size_bytes, block_bytes)]

    def one_pass(check: bool) -> int:
        total = 0
        for key in digests:
            digest = hashlib.sha256() if check else None
            for byte_range in ranges:
                data = client.get_object(Bucket=server.bucket, Key=key, Range=byte_range)["Body"].read()
                total += len(data)
                if digest is not None:
                    digest.update(data)
            if digest is not None and digest.hexdigest() != digests[key]:
                raise SystemExit(f"boto3 read wrong bytes from {key}")
        return total

    return one_pass


def s3fs_reader(server: S3Server, digests: dict[str, str], size_bytes: int,
                block_bytes: int) -> Reader:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=server.endpoint_url, skip_instance_cache=True)
    ranges = blocks(size_bytes, block_bytes)

    def one_pass(check: bool) -> int:
        total = 0
        for key in digests:
            path = f"{server.bucket}/{key}"
            digest = hashlib.sha256() if check else None
            for offset, length in ranges:
                data = fs.cat_file(path, start=offset, end=offset + length)
                total += len(data)
                if digest is not None:
                    digest.update(data)
            if digest is not None and digest.hexdigest() != digests[key]:
                raise SystemExit(f"s3fs read wrong bytes from {key}")
        return total

    return one_pass


def timed_pass(reader: Reader, expected_bytes: int) -> tuple[float, float]:
    """(GB/s, client CPU seconds per GB) of one pass over every object."""
    start, cpu_start = time.perf_counter(), time.process_time()
    nbytes = reader(False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if nbytes != expected_bytes:
        raise SystemExit(f"a pass read {nbytes} bytes, not {expected_bytes}")
    return nbytes / seconds / 1e9, cpu_seconds / (nbytes / 1e9)


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("boto3", "botocore", "s3fs", "aiobotocore"))


def weed_version(server: S3Server) -> str:
    import subprocess

    from tests.s3server import weed_binary

    output = subprocess.run([weed_binary() or "weed", "version"], capture_output=True, text=True).stdout
    return " ".join(output.split()[:3]) or "weed ?"


def measure(server: S3Server, args: argparse.Namespace) -> dict[str, tuple[MedianMinMax, float]]:
    """side -> ((median, min, max) GB/s, median client CPU s/GB) over the rounds."""
    os.environ.update(server.env)   # the dummy keys: clients read them from the environment
    digests = upload(server, args.objects, args.size_bytes)
    factories: dict[str, Callable[..., Reader]] = {
        "stampede": stampede_reader, "boto3": boto3_reader, "s3fs": s3fs_reader}
    readers: dict[str, Any] = {side: factories[side](server, digests, args.size_bytes, args.block_bytes)
                               for side in SIDES}
    expected = args.objects * args.size_bytes
    for side in SIDES:   # untimed: every side reads the right bytes (and warms the server)
        if readers[side](True) != expected:
            raise SystemExit(f"{side} read the wrong number of bytes")
    gbps: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    for round_number in range(args.rounds):
        order = SIDES[round_number % len(SIDES):] + SIDES[:round_number % len(SIDES)]
        for side in order:
            rate, cpu_per_gb = timed_pass(readers[side], expected)
            gbps[side].append(rate)
            cpu[side].append(cpu_per_gb)
        print(f"  round {round_number + 1}: " + ", ".join(
            f"{side} {gbps[side][-1]:.3f}" for side in SIDES) + " GB/s", flush=True)
    return {side: (median_min_max(gbps[side]), statistics.median(cpu[side])) for side in SIDES}


def print_table(summary: dict[str, tuple[MedianMinMax, float]]) -> None:
    print(f"{'side':<9} {'GB/s median':>11} {'(min-max)':>16} {'client CPU s/GB':>16}")
    for side in SIDES:
        (median, low, high), cpu_per_gb = summary[side]
        print(f"{side:<9} {median:>11.3f} ({low:6.3f}-{high:6.3f}) {cpu_per_gb:>16.3f}")
    for other in ("boto3", "s3fs"):
        ratio = summary["stampede"][0][0] / summary[other][0][0]
        verdict = ratio_verdict(ratio, TARGET_RATIO, (summary["stampede"][0], summary[other][0]))
        print(f"stampede / {other}: {ratio:.3f}  {verdict}")


def main() -> int:
    args = parse_args()
    with running_server(args.dir) as server:
        print(f"{machine_text(with_ram=True)}; load average {load_average_text()}")
        print(f"server: {weed_version(server)} at {server.endpoint_url} (loopback); clients: "
              f"{versions()}")
        print(f"s3_get: {args.objects} objects x {args.size}, {args.block} ranged GETs, one at a "
              f"time, {args.rounds} rounds", flush=True)
        summary = measure(server, args)
    print()
    print_table(summary)
    print("GB = 1e9 B; medians (min-max) over rounds; ratios are of the GB/s medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
