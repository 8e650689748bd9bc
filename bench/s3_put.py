"""S3 write throughput: `stampede save` versus the fastest bare client loop, one run, the
same bytes to the same server, one PUT per object and multipart uploads both.

The script starts its own S3 server (SeaweedFS `weed mini` on 127.0.0.1,
tests/helpers/s3server.py) and writes --objects objects of --size bytes per round, one
request at a time, in each mode: put (one PUT per object) and multipart (CreateMultipart-
Upload, one UploadPart per --part bytes, CompleteMultipartUpload). The bytes are a save's
(stampede.checkpoint.content, one page-aligned buffer), the same for every side:

  stampede save  the command itself: `mpiexec -n 1 stampede save` of a job whose one
                 rank writes one object per save (layout sharded, iterations = --objects,
                 1 warmup dropped, validate none, keep 1); its GB/s = the bytes of a rank /
                 its archived save op (phase start -> object durable: the PUT answered,
                 or the upload completed), median over the saves; client CPU not measured.
  stampede       the save's own timed calls, in this process, as a rank makes them:
                 S3Backend.put_object, or start_upload + upload_part per part +
                 complete_upload, each body sent from the buffer (no copy, payload unsigned).
  boto3          client.put_object, or create_multipart_upload + upload_part +
                 complete_multipart_upload, from a bytes copy of the buffer; flexible
                 checksums off (when_required). Over http:// botocore signs every payload
                 (SHA-256 of the body): that is boto3 as users run it here.
  boto3-unsigned the same, its payload unsigned (s3 = {payload_signing_enabled: false}:
                 x-amz-content-sha256 = UNSIGNED-PAYLOAD, as botocore sends over https
                 with a checksum): boto3 at its fastest.
  http.client    the floor of Python: a kept-alive http.client connection, each request
                 signed by stampede.backends.sigv4 (payload unsigned), the buffer given to
                 sendall as it is.

A side's GB/s in a round = the bytes it wrote / the wall time of its own writes
(perf_counter around each object's requests); client CPU = this process's CPU time per GB
written (the server runs on the same cores and competes for them). Every object is
deleted, untimed, once written (as the command's keep = 1 releases the version before),
so the server holds the same amount throughout. One
untimed pass first checks that every side's objects read back as the buffer's bytes. In
each of --rounds rounds, every side writes --objects objects per mode, the in-process
sides taking turns object by object in an order rotated at every object, the command
once per round at a rotated place among them. The table shows the median (min-max) over
rounds; a ratio is the median over rounds of the two sides' ratio in the same round
(paired). GB = 1e9 bytes. Target: stampede save / the fastest bare loop >= 0.9 in both
modes (and stampede's own calls alike). The verdict is printed, never an exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    VENV_BIN,
    MedianMinMax,
    add_scratch_parent_option,
    archive_rows,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    mpiexec_command,
    ratio_verdict,
    run_checked,
    scratch_directory,
    write_job_toml,
)
from s3_get import REGION, weed_version

from stampede.backends import open_backend
from stampede.backends.sigv4 import Signer
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.content import ContentSource
from stampede.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.s3server import S3Server, running_server  # noqa: E402

TARGET_RATIO = 0.9
MODES = ("put", "multipart")
SIDES = ("stampede save", "stampede", "boto3", "boto3-unsigned", "http.client")
CLI = "stampede save"
UNSIGNED = "UNSIGNED-PAYLOAD"
# (key, view) -> None: one object written, every request answered
Writer = Callable[[str, memoryview], None]


def parse_args() -> argparse.Namespace:
    """Command-line options; --help prints the module docstring (what is compared, how)."""
    parser = docstring_parser(__doc__)
    parser.add_argument("--objects", type=int, default=4, help="objects per round (default 4)")
    parser.add_argument("--size", default="64MiB", help="bytes per object (default 64MiB)")
    parser.add_argument("--part", default="16MiB", help="multipart part size (default 16MiB)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    add_scratch_parent_option(parser)
    args = parser.parse_args()
    try:
        args.size_bytes, args.part_bytes = parse_size(args.size), parse_size(args.part)
    except ValueError as error:
        parser.error(str(error))
    if args.objects < 1 or args.rounds < 1 or args.part_bytes < 5 * 2**20 or \
            args.size_bytes % 4096:
        parser.error("--objects and --rounds >= 1, --part >= 5MiB, --size a multiple of 4KiB")
    return args


def parts_of(size_bytes: int, part_bytes: int) -> list[tuple[int, int]]:
    return [(offset, min(part_bytes, size_bytes - offset))
            for offset in range(0, size_bytes, part_bytes)]


# --- the in-process sides ----------------------------------------------------------------

def stampede_writer(server: S3Server, mode: str, part_bytes: int) -> Writer:
    backend: Any = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    put, start, send, complete = backend.put_object, backend.start_upload, \
        backend.upload_part, backend.complete_upload

    def write(key: str, view: memoryview) -> None:
        path = backend.path(key)
        if mode == "put":
            put(path, (view,))
            return
        upload = start(path)
        sent = [(number, send(upload, number, (view[offset:offset + length],)))
                for number, (offset, length) in enumerate(parts_of(len(view), part_bytes), 1)]
        complete(upload, sent)

    return write


def boto3_writer(server: S3Server, mode: str, part_bytes: int, unsigned: bool,
                 data: bytes) -> Writer:
    """`data`: the buffer's bytes, copied once, untimed (boto3 takes bytes, not a view)."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=server.endpoint_url, region_name=REGION,
                          config=Config(request_checksum_calculation="when_required",
                                        response_checksum_validation="when_required",
                                        retries={"max_attempts": 1},
                                        s3={"payload_signing_enabled": not unsigned}))
    bucket = server.bucket

    def write(key: str, view: memoryview) -> None:
        if mode == "put":
            client.put_object(Bucket=bucket, Key=key, Body=data)
            return
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        sent = [{"PartNumber": number, "ETag": client.upload_part(
                    Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                    Body=data[offset:offset + length])["ETag"]}
                for number, (offset, length) in enumerate(parts_of(len(data), part_bytes), 1)]
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                         MultipartUpload={"Parts": sent})

    return write


def http_client_writer(server: S3Server, mode: str, part_bytes: int) -> Writer:
    import botocore.session

    signer = Signer(botocore.session.Session().get_credentials(), REGION)
    host = server.endpoint_url.removeprefix("http://")
    connection = http.client.HTTPConnection(host, timeout=60)

    def request(method: str, key: str, query: str, body: Any, length: int,
                payload: str = UNSIGNED) -> http.client.HTTPResponse:
        path = f"/{server.bucket}/{key}"
        headers = signer.headers(method, host, path, query, {"content-length": str(length)},
                                 payload)
        connection.request(method, f"{path}?{query}" if query else path, body=body,
                           headers=headers)
        response = connection.getresponse()
        if response.status >= 300:
            raise SystemExit(f"http.client: {method} {key}: {response.status} {response.read()!r}")
        return response

    def write(key: str, view: memoryview) -> None:
        if mode == "put":
            request("PUT", key, "", view, len(view)).read()
            return
        answer = request("POST", key, "uploads=", None, 0,
                         hashlib.sha256(b"").hexdigest()).read()
        upload_id = answer.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
        etags = []
        for number, (offset, length) in enumerate(parts_of(len(view), part_bytes), 1):
            response = request("PUT", key, f"partNumber={number}&uploadId={upload_id}",
                               view[offset:offset + length], length)
            response.read()
            etags.append((number, response.getheader("etag")))
        body = ("<CompleteMultipartUpload>" + "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>" for n, etag in etags)
            + "</CompleteMultipartUpload>").encode()
        request("POST", key, f"uploadId={upload_id}", body, len(body),
                hashlib.sha256(body).hexdigest()).read()

    return write


def writers(server: S3Server, mode: str, part_bytes: int, view: memoryview) -> dict[str, Writer]:
    data = bytes(view)
    return {"stampede": stampede_writer(server, mode, part_bytes),
            "boto3": boto3_writer(server, mode, part_bytes, False, data),
            "boto3-unsigned": boto3_writer(server, mode, part_bytes, True, data),
            "http.client": http_client_writer(server, mode, part_bytes)}


# --- the command --------------------------------------------------------------------------

def save_job(scratch: Path, server: S3Server, args: argparse.Namespace, mode: str) -> Path:
    return write_job_toml(scratch / f"save-{mode}.toml", {
        "target": {"path": f"s3://{server.bucket}/cli-{mode}"},
        "target.storage_options": {"endpoint_url": server.endpoint_url},
        "checkpoint": {"size": args.size, "layout": ["sharded"]},
        "run": {"iterations": args.objects, "warmup": 1},
        "save": {"validate": "none", "keep": 1,
                 **({"part_size": args.part} if mode == "multipart" else {})},
        "archive": {"path": str(scratch / f"save-{mode}.csv")},
    })


def cli_round(job: Path) -> float:
    """One `stampede save` run; the GB/s of its rank's saves (median), from the archive."""
    run_checked(mpiexec_command(1, str(VENV_BIN / "stampede"), "save", str(job)),
                env=dict(os.environ))
    rows = archive_rows(job.with_suffix(".csv"))
    last = [row for row in rows if row["run_id"] == rows[-1]["run_id"] and row["op"] == "save"]
    if len(last) != 1 or last[0]["valid"] != "true":
        raise SystemExit(f"stampede save {job}: no valid save row")
    return float(last[0]["slowest_rank_gbps"])


# --- measuring -----------------------------------------------------------------------------

def checked(server: S3Server, sides: dict[str, Writer], view: memoryview) -> None:
    """Untimed: every side's object reads back as the buffer (and the server is warm)."""
    backend = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    for side, write in sides.items():
        key = f"check/{side}"
        write(key, view)
        if backend.get_bytes(key) != bytes(view):
            raise SystemExit(f"{side} wrote other bytes than the buffer's")
        backend.remove(key)


def measure_mode(server: S3Server, args: argparse.Namespace, scratch: Path, mode: str,
                 view: memoryview) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per side, GB/s and client CPU s/GB per round."""
    sides = writers(server, mode, args.part_bytes, view)
    checked(server, sides, view)
    job = save_job(scratch, server, args, mode)
    remover = open_backend(f"s3://{server.bucket}", {"endpoint_url": server.endpoint_url})
    names = list(sides)
    gbps: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[float]] = {side: [] for side in names}
    gb, turn = args.objects * args.size_bytes / 1e9, 0
    for round_number in range(args.rounds):
        seconds, cpu_seconds = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
        for index in range(args.objects):
            if index == round_number % args.objects:   # the command's turn, rotated
                gbps[CLI].append(cli_round(job))
            shift = turn % len(names)
            turn += 1
            for side in names[shift:] + names[:shift]:
                # a key of the save's shape: a new version's directory each time (the
                # server's filer makes it), released once written as keep = 1 does
                key = f"{mode}/{side}/v{round_number:03d}{index:03d}/sharded/shard-00000.raw"
                start, cpu_start = time.perf_counter(), time.process_time()
                sides[side](key, view)
                seconds[side] += time.perf_counter() - start
                cpu_seconds[side] += time.process_time() - cpu_start
                remover.remove(key)
        for side in names:
            gbps[side].append(gb / seconds[side])
            cpu[side].append(cpu_seconds[side] / gb)
        print(f"  {mode} round {round_number + 1}: " + ", ".join(
            f"{side} {gbps[side][-1]:.3f}" for side in SIDES) + " GB/s", flush=True)
    return gbps, cpu


def paired(gbps: dict[str, list[float]], ours: str, theirs: str) -> float:
    return statistics.median(a / b for a, b in zip(gbps[ours], gbps[theirs], strict=True))


def print_mode(mode: str, gbps: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    summaries: dict[str, MedianMinMax] = {side: median_min_max(gbps[side]) for side in SIDES}
    print(f"{mode}: {'side':<15} {'GB/s median':>11} {'(min-max)':>16} {'client CPU s/GB':>16}")
    for side, (median, low, high) in summaries.items():
        used = f"{statistics.median(cpu[side]):16.3f}" if side in cpu else f"{'-':>16}"
        print(f"{'':<{len(mode) + 2}}{side:<15} {median:>11.3f} ({low:6.3f}-{high:6.3f}) {used}")
    bare = ("boto3", "boto3-unsigned", "http.client")
    fastest = min(bare, key=lambda side: paired(gbps, CLI, side))
    for ours in (CLI, "stampede"):
        ratio = paired(gbps, ours, fastest)
        verdict = ratio_verdict(ratio, TARGET_RATIO, (summaries[ours], summaries[fastest]))
        others = ", ".join(f"{side} {paired(gbps, ours, side):.3f}" for side in bare
                           if side != fastest)
        print(f"{mode}: {ours} / fastest bare loop ({fastest}): {ratio:.3f} "
              f"(of the medians {summaries[ours][0] / summaries[fastest][0]:.3f})  {verdict}; "
              f"vs {others}")


def main() -> int:
    args = parse_args()
    content = AlignedBuffer(args.size_bytes, populate=True)
    source, block = ContentSource(4 * 2**20), 4 * 2**20
    for offset in range(0, args.size_bytes, block):   # a save's bytes (content.py)
        source.fill(content.view[offset:offset + block], "bench/object", offset)
    with scratch_directory("stampede-s3-put-", args.dir) as scratch, \
            running_server(scratch) as server:
        os.environ.update(server.env)   # the dummy keys: every client reads the environment
        from importlib.metadata import version
        print(f"{machine_text(with_ram=True)}; load average {load_average_text()}")
        print(f"server: {weed_version()} at {server.endpoint_url} (loopback); clients: botocore "
              f"{version('botocore')}, boto3 {version('boto3')}, Python {sys.version.split()[0]}")
        print(f"s3_put: {args.objects} objects x {args.size} per round and side, parts of "
              f"{args.part}, one request at a time, {args.rounds} rounds", flush=True)
        results = {mode: measure_mode(server, args, scratch, mode, content.view)
                   for mode in MODES}
    print()
    for mode, (gbps, cpu) in results.items():
        print_mode(mode, gbps, cpu)
    print("GB = 1e9 B; medians (min-max) over rounds; a ratio is the median over rounds of "
          "the two sides' ratio in that round")
    content.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
