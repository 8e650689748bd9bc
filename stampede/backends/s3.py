"""S3 (and S3-compatible stores) through the aiobotocore client s3fs creates, request by
request, run on s3fs's event loop: stat and open are one HEAD each, a read is one ranged
GET streamed into the caller's buffer (its time to first byte stamped), a list is one LIST
(one request per 1,000 names). botocore does the retrying ("standard" mode,
`max_attempts`), s3fs's own retry loop is off so no retry is hidden, and every retried
request is counted per op in `retries`. Every client error leaves as an OSError with a
short text ("S3 GET 503 SlowDown after 2 retries"); connect and read timeouts make a dead
server an error within seconds, never a hang. Caches are off as in every fsspec backend
(stampede.backends.fsspec), and the sidecar says so.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import os
import time
from collections.abc import Callable
from contextlib import suppress
from http import HTTPStatus
from typing import Any

from stampede.backends.fsspec import (
    FsspecBackend,
    ObjectHandle,
    ObjectWriter,
    checked_options,
    described_options,
    errors,
    versions,
    without_userinfo,
)
from stampede.errors import UsageError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0       # per socket read: a slow transfer that keeps moving never trips it
MAX_ATTEMPTS = 3            # botocore's "standard" default: 1 request + 2 retries
WRITE_BLOCK_BYTES = 16 * 2**20   # multipart part size of a streaming upload (S3: >= 5 MiB)


class S3Backend(FsspecBackend):
    """S3 (and S3-compatible stores) through s3fs's aiobotocore client, request by request."""

    ttfb = True

    def __init__(self, target_path: str, storage_options: dict[str, Any] | None = None) -> None:
        import s3fs
        from fsspec.asyn import sync

        options = checked_options(storage_options)
        kwargs = dict(options)
        self.connect_timeout_s = _number(kwargs, "connect_timeout", CONNECT_TIMEOUT_S, float)
        self.read_timeout_s = _number(kwargs, "read_timeout", READ_TIMEOUT_S, float)
        self.max_attempts = int(_number(kwargs, "max_attempts", MAX_ATTEMPTS, int))
        self.write_block_bytes = int(_number(kwargs, "block_size", WRITE_BLOCK_BYTES, int))
        config = {**kwargs.pop("config_kwargs", {}),
                  "connect_timeout": self.connect_timeout_s, "read_timeout": self.read_timeout_s,
                  # total_max_attempts counts the first request ("max_attempts" here would not)
                  "retries": {"total_max_attempts": self.max_attempts, "mode": "standard"},
                  # no client-side CRCs: a checksum would be timed as storage latency
                  "request_checksum_calculation": "when_required",
                  "response_checksum_validation": "when_required"}
        self.fs = s3fs.S3FileSystem(**{**kwargs, "skip_instance_cache": True,
                                       "use_listings_cache": False, "default_cache_type": "none",
                                       "default_block_size": self.write_block_bytes,
                                       "config_kwargs": config})
        self.fs.retries = 1   # s3fs's own retry loop off: botocore retries, and counts them
        self._setup("s3", self.fs._strip_protocol(target_path), options)
        self.bucket, _, self.prefix = self.root.partition("/")
        if not self.bucket:
            raise UsageError(f"target.path = {target_path!r}: an S3 target names a bucket "
                             "(s3://bucket/prefix)")
        self._sync, self._loop = sync, self.fs.loop
        self._attempts = 0
        self._client = self._call("", "connect", self.fs.set_session)
        # Every HTTP attempt, retries included, passes here (botocore emits before-send
        # per attempt): attempts - 1 = retries of that call, whatever the error was.
        self._client.meta.events.register("before-send.s3", self._count_attempt)

    def _count_attempt(self, **_: Any) -> None:
        self._attempts += 1

    def _call(self, op: str, verb: str, function: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
        """Run one client call on s3fs's loop; count its retries under `op` (timed ops
        only); turn any failure into an OSError."""
        before = self._attempts
        try:
            result = self._sync(self._loop, function, *args, **kwargs)
        except Exception as error:
            retried = max(self._attempts - before - 1, 0)
            if op:
                self.retries[op] += retried
            raise s3_error(verb, error, retried) from error
        if op:
            self.retries[op] += max(self._attempts - before - 1, 0)
        return result

    def _split(self, path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    # --- timed -----------------------------------------------------------------------

    def stat(self, path: str) -> Any:
        bucket, _, key = path.partition("/")
        return self._call("stat", "HEAD", self._client.head_object, Bucket=bucket, Key=key)

    def _open(self, path: str) -> ObjectHandle:
        bucket, _, key = path.partition("/")
        head = self._call("open", "HEAD", self._client.head_object, Bucket=bucket, Key=key)
        return ObjectHandle(path, head["ContentLength"], bucket, key)

    def read_into(self, handle: ObjectHandle, buffer: memoryview, offset: int) -> int:
        length = min(len(buffer), handle.size - offset)
        if length <= 0:
            return 0
        return int(self._call("read", "GET", self._get_into, handle.bucket, handle.key,
                              buffer[:length], offset))

    async def _get_into(self, bucket: str, key: str, view: memoryview, offset: int) -> int:
        """One ranged GET, its body copied into `view` chunk by chunk as the socket hands
        them over (no whole-body bytes object, no joined chunks); stamps first_byte_ns
        when the first chunk is in."""
        response = await self._client.get_object(
            Bucket=bucket, Key=key, Range=f"bytes={offset}-{offset + len(view) - 1}")
        body = response["Body"]
        try:
            if response.get("ContentLength", 0) > len(view):
                raise OSError(f"S3 GET: {response['ContentLength']} bytes sent for a range of "
                              f"{len(view)} (Range ignored by the server?)")
            content = getattr(body._raw_stream, "content", None)   # aiohttp's StreamReader
            if content is None:
                return await self._readinto_body(body, view)
            count = 0
            while True:
                chunk, chunk_boundary = await content.readchunk()
                if not chunk:
                    if chunk_boundary:
                        continue
                    return count
                if not count:
                    self.first_byte_ns = time.perf_counter_ns()
                view[count:count + len(chunk)] = chunk
                count += len(chunk)
        finally:
            body.close()

    async def _readinto_body(self, body: Any, view: memoryview) -> int:
        """The same through aiobotocore's body API (its other HTTP backends)."""
        count = await body.readinto(view)
        self.first_byte_ns = time.perf_counter_ns()
        while count < len(view):
            chunk = await body.readinto(view[count:])
            if not chunk:
                break
            count += chunk
        return count

    def list(self, path: str) -> list[str]:
        bucket, key = self._split(path)
        return list(self._call("list", "LIST", self._list_prefix, bucket,
                               f"{key}/" if key else "", "/"))

    async def _list_prefix(self, bucket: str, prefix: str, delimiter: str) -> builtins.list[str]:
        """Names under a prefix, relative to it, page by page (1,000 per request)."""
        names: list[str] = []
        kwargs = {"Bucket": bucket, "Prefix": prefix, "Delimiter": delimiter}
        while True:
            page = await self._client.list_objects_v2(**kwargs)
            names += [item["Key"][len(prefix):] for item in page.get("Contents", ())]
            names += [item["Prefix"][len(prefix):].rstrip("/")
                      for item in page.get("CommonPrefixes", ())]
            if not page.get("IsTruncated"):
                return [name for name in names if name and not name.endswith("/")]
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    # --- untimed ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "protocol": "s3",
            "client": "s3fs's aiobotocore client, called directly (one request per op)",
            "endpoint_url": without_userinfo(str(self._client.meta.endpoint_url)),
            "region": self._client.meta.region_name,
            "caches": {"instance": "off (skip_instance_cache)",
                       "listings": "off (use_listings_cache=False)",
                       "blocks": "off (default_cache_type=none; every read is one ranged GET)",
                       "checksums": "off (when_required)"},
            "retry": {"mode": "standard (botocore)", "max_attempts": self.max_attempts,
                      "s3fs_retries": "1 (its own retry loop off)"},
            "timeouts_s": {"connect": self.connect_timeout_s, "read": self.read_timeout_s},
            "write_block_bytes": self.write_block_bytes,
            "versions": versions("fsspec", "s3fs", "aiobotocore", "botocore", "aiohttp"),
            "storage_options": described_options(self.options),
        }

    def ensure_root(self) -> None:
        """The bucket exists afterwards (created if missing); no prefix objects are made."""
        try:
            self._call("", "HEAD bucket", self._client.head_bucket, Bucket=self.bucket)
        except FileNotFoundError:
            self._call("", "create bucket", self._client.create_bucket, Bucket=self.bucket)

    def size(self, relpath: str) -> int:
        bucket, key = self._split(self.path(relpath))
        head = self._call("", "HEAD", self._client.head_object, Bucket=bucket, Key=key)
        return int(head["ContentLength"])

    def get_bytes(self, relpath: str) -> bytes | None:
        bucket, key = self._split(self.path(relpath))
        try:
            return bytes(self._call("", "GET", self._get_whole, bucket, key))
        except FileNotFoundError:
            return None

    async def _get_whole(self, bucket: str, key: str) -> bytes:
        response = await self._client.get_object(Bucket=bucket, Key=key)
        async with response["Body"] as body:
            return bytes(await body.read())

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """One PUT: S3 makes the new object visible whole or not at all."""
        bucket, key = self._split(self.path(relpath))
        self._call("", "PUT", self._client.put_object, Bucket=bucket, Key=key, Body=data)

    def remove(self, relpath: str) -> None:
        bucket, key = self._split(self.path(relpath))
        with suppress(FileNotFoundError):   # S3 answers 204 anyway; S3-compatibles may not
            self._call("", "DELETE", self._client.delete_object, Bucket=bucket, Key=key)

    def names(self, relpath: str = "") -> builtins.list[str]:
        root_prefix = f"{self.prefix}/" if self.prefix else ""
        below = f"{root_prefix}{relpath.strip('/')}/" if relpath else root_prefix
        found = self._call("", "LIST", self._list_prefix, self.bucket, below, "")
        return sorted(f"{below[len(root_prefix):]}{name}" for name in found)

    def writer(self, relpath: str) -> ObjectWriter:
        path = self.path(relpath)
        with errors("s3", "open for writing"):
            stream = self.fs.open(path, "wb", block_size=self.write_block_bytes)
        return ObjectWriter(stream, path, "s3")

    def local_path(self, relpath: str) -> str | None:
        return None


# --- errors --------------------------------------------------------------------------------

TRANSPORT_ERRORS = (   # botocore / aiohttp class name -> what happened, in a few words
    ("EndpointConnectionError", "could not connect"),
    ("ConnectTimeoutError", "connect timeout"),
    ("ReadTimeoutError", "read timeout"),
    ("ConnectionClosedError", "connection closed by the server"),
    ("ResponseStreamingError", "connection lost during the body"),
    ("IncompleteReadError", "response body ended early"),
    ("ServerDisconnectedError", "connection closed by the server"),
    ("ClientPayloadError", "connection lost during the body"),
    ("FSTimeoutError", "timeout"),
    ("TimeoutError", "timeout"),
)


def s3_error(verb: str, error: BaseException, retried: int) -> OSError:
    """An S3 client failure as an OSError with a short text: status and code for an HTTP
    error ("S3 GET 503 SlowDown after 2 retries"), what happened for a transport one.
    404 is FileNotFoundError, 403 PermissionError."""
    after = f" after {retried} retries" if retried else ""
    if isinstance(error, OSError) and str(error).startswith("S3 "):   # said here already
        return error
    response = getattr(error, "response", None)
    if isinstance(response, dict) and "Error" in response:
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = str(response["Error"].get("Code") or "")
        if not code or code.isdigit():   # a HEAD error has no body: only its status
            code = _reason(status)
        text = f"S3 {verb} {status} {code}{after}"
        if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
            return FileNotFoundError(errno.ENOENT, text)
        if status == 403:
            return PermissionError(errno.EACCES, text)
        return OSError(text)
    return OSError(f"S3 {verb}: {_transport_text(error)}{after}")


def _transport_text(error: BaseException) -> str:
    names = {cls.__name__ for cls in type(error).__mro__}
    for name, text in TRANSPORT_ERRORS:
        if name in names:
            if name == "EndpointConnectionError" and "refused" in _chain_text(error):
                return "connection refused"
            return text
    if isinstance(error, asyncio.TimeoutError):
        return "timeout"
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno)
    return type(error).__name__


def _chain_text(error: BaseException) -> str:
    parts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__} {current}")
        current = current.__cause__ or current.__context__
    return " ".join(parts).lower()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _number(options: dict[str, Any], key: str, default: float, kind: type) -> float:
    value = options.pop(key, default)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"storage option {key} = {value!r}: must be a number") from None
    if number <= 0:
        raise UsageError(f"storage option {key} = {value!r}: must be positive")
    return float(number)
