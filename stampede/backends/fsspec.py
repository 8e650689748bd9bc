"""fsspec backends: object stores (s3://, gs://) and fsspec's other file systems
(memory://, file://) under the same contract as the POSIX baseline.

fsspec's caches suit applications and falsify a benchmark, so every one is off and the
sidecar says so (`describe`): no instance cache (`skip_instance_cache`, one client per
rank, created untimed in __init__), no listings cache, no block cache (every read is one
request for exactly the bytes asked). Credentials are never passed in: the client reads
them from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) itself.

S3 (`S3Backend`) goes past s3fs's file layer to the aiobotocore client s3fs creates, run
on s3fs's event loop: stat and open are one HEAD each, a read is one ranged GET streamed
into the caller's buffer (its time to first byte stamped), a list is one LIST (one request
per 1,000 names). botocore does the retrying ("standard" mode, `max_attempts`), s3fs's own
retry loop is off so no retry is hidden, and every retried request is counted per op in
`retries`. Every client error leaves as an OSError with a short text
("S3 GET 503 SlowDown after 2 retries"); connect and read timeouts make a dead server an
error within seconds, never a hang.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import importlib.metadata
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from stampede.backends.base import RETRY_OPS
from stampede.errors import UsageError

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0       # per socket read: a slow transfer that keeps moving never trips it
MAX_ATTEMPTS = 3            # botocore's "standard" default: 1 request + 2 retries
WRITE_BLOCK_BYTES = 16 * 2**20   # multipart part size of a streaming upload (S3: >= 5 MiB)
# Storage options that may be shown in the sidecar; every other key (and any credential,
# which the spec refuses anyway) stays out of it.
DESCRIBED_OPTIONS = frozenset({
    "endpoint_url", "region_name", "connect_timeout", "read_timeout", "max_attempts",
    "block_size", "anon", "use_ssl", "requester_pays", "client_kwargs", "config_kwargs", "s3",
    "addressing_style", "auto_mkdir", "project", "version_aware",
})
SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth")
SECRET_EXCEPTIONS = frozenset({"sse_kms_key_id"})
FS_TYPES = {"gs": "gcs", "gcs": "gcs"}


class ObjectHandle(NamedTuple):
    """An 'open' object: what one HEAD told (its size), so reads need no more metadata."""

    path: str
    size: int
    bucket: str = ""
    key: str = ""


class FsspecBackend:
    """Any fsspec file system (memory://, file://, gs://, ...); S3 has its own class."""

    ttfb = False        # fsspec's generic calls return whole ranges: no first-byte stamp

    def __init__(self, target_path: str, storage_options: dict[str, Any] | None = None) -> None:
        import fsspec

        scheme = target_path.partition("://")[0]
        options = _checked_options(storage_options)
        if scheme == "file":
            options.setdefault("auto_mkdir", True)
        cls = fsspec.get_filesystem_class(scheme)
        self.fs = cls(**{**options, "skip_instance_cache": True, "use_listings_cache": False})
        self._setup(scheme, cls._strip_protocol(target_path), options)

    def _setup(self, scheme: str, root: str, options: dict[str, Any]) -> None:
        self.name = scheme
        self.protocol = FS_TYPES.get(scheme, scheme)
        self.root = root.rstrip("/") if root != "/" else root
        self.options = options
        self.first_byte_ns = 0
        self.retries = dict.fromkeys(RETRY_OPS, 0)

    # --- timed -----------------------------------------------------------------------

    def path(self, relpath: str) -> str:
        if not relpath:
            return self.root
        return f"{self.root}/{relpath}" if self.root not in ("", "/") else f"{self.root}{relpath}"

    def stat(self, path: str) -> Any:
        try:
            return self.fs.info(path, refresh=True)
        except OSError:
            raise
        except Exception as error:
            raise _generic_error(self.protocol, "stat", error) from error

    def opener(self, direct: bool) -> Callable[[str], ObjectHandle]:
        return self._open   # direct: no client-side cache to bypass

    def _open(self, path: str) -> ObjectHandle:
        try:
            info = self.fs.info(path, refresh=True)
        except OSError:
            raise
        except Exception as error:
            raise _generic_error(self.protocol, "open", error) from error
        return ObjectHandle(path, int(info["size"]))

    def read_into(self, handle: ObjectHandle, buffer: memoryview, offset: int) -> int:
        length = min(len(buffer), handle.size - offset)
        if length <= 0:
            return 0
        try:
            data = self.fs.cat_file(handle.path, start=offset, end=offset + length)
        except OSError:
            raise
        except Exception as error:
            raise _generic_error(self.protocol, "read", error) from error
        count = len(data)
        buffer[:count] = data
        return count

    @staticmethod
    def close(handle: ObjectHandle) -> None:
        """Nothing to release: an object handle holds no connection."""

    def list(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(path, detail=False, refresh=True)
        except OSError:
            raise
        except Exception as error:
            raise _generic_error(self.protocol, "list", error) from error
        return [os.path.basename(entry.rstrip("/")) for entry in entries]

    def evict(self, path: str, offset: int, length: int) -> None:
        """Nothing is cached client-side (every fsspec cache is off), except the kernel's
        page cache under file://, dropped as the POSIX backend does."""
        if self.protocol == "file":
            from stampede.backends.posix import PosixBackend

            PosixBackend.evict(path, offset, length)

    def fs_type(self) -> str:
        return self.protocol

    # --- untimed ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        package = type(self.fs).__module__.partition(".")[0]
        return {
            "protocol": self.protocol,
            "client": f"fsspec {type(self.fs).__name__}",
            "caches": {"instance": "off (skip_instance_cache)",
                       "listings": "off (use_listings_cache=False)",
                       "blocks": "off (every read is one cat_file of the range)"},
            "retry": "left to the fsspec implementation (not counted)",
            "versions": _versions("fsspec", package),
            "storage_options": described_options(self.options),
        }

    def ensure_root(self) -> None:
        with _errors(self.protocol, "mkdir"):
            self.fs.makedirs(self.root, exist_ok=True)

    def get_bytes(self, relpath: str) -> bytes | None:
        with _errors(self.protocol, "get"):
            try:
                return bytes(self.fs.cat_file(self.path(relpath)))
            except FileNotFoundError:
                return None

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """Written beside, then moved over: readers never see a partial file."""
        path = self.path(relpath)
        temporary = f"{path}.tmp-{os.getpid()}"
        with _errors(self.protocol, "put"):
            self.fs.pipe_file(temporary, data)
            self.fs.mv(temporary, path)

    def remove(self, relpath: str) -> None:
        path = self.path(relpath)
        with _errors(self.protocol, "remove"):
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                self.fs.rmdir(path)

    def names(self, relpath: str = "") -> builtins.list[str]:
        prefix = self.path("") + ("/" if self.root not in ("", "/") else "")
        with _errors(self.protocol, "find"):
            found = self.fs.find(self.path(relpath), withdirs=False)
        return sorted(path[len(prefix):] if path.startswith(prefix) else path for path in found)

    def writer(self, relpath: str) -> ObjectWriter:
        path = self.path(relpath)
        with _errors(self.protocol, "open for writing"):
            stream = self.fs.open(path, "wb")
        return ObjectWriter(stream, path, self.protocol, partial_remover=self.remove, relpath=relpath)

    def local_path(self, relpath: str) -> str | None:
        return self.path(relpath) if self.protocol == "file" else None


class S3Backend(FsspecBackend):
    """S3 (and S3-compatible stores) through s3fs's aiobotocore client, request by request."""

    ttfb = True

    def __init__(self, target_path: str, storage_options: dict[str, Any] | None = None) -> None:
        import s3fs
        from fsspec.asyn import sync

        options = _checked_options(storage_options)
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
            "endpoint_url": _without_userinfo(str(self._client.meta.endpoint_url)),
            "region": self._client.meta.region_name,
            "caches": {"instance": "off (skip_instance_cache)",
                       "listings": "off (use_listings_cache=False)",
                       "blocks": "off (default_cache_type=none; every read is one ranged GET)",
                       "checksums": "off (when_required)"},
            "retry": {"mode": "standard (botocore)", "max_attempts": self.max_attempts,
                      "s3fs_retries": "1 (its own retry loop off)"},
            "timeouts_s": {"connect": self.connect_timeout_s, "read": self.read_timeout_s},
            "write_block_bytes": self.write_block_bytes,
            "versions": _versions("fsspec", "s3fs", "aiobotocore", "botocore", "aiohttp"),
            "storage_options": described_options(self.options),
        }

    def ensure_root(self) -> None:
        """The bucket exists afterwards (created if missing); no prefix objects are made."""
        try:
            self._call("", "HEAD bucket", self._client.head_bucket, Bucket=self.bucket)
        except FileNotFoundError:
            self._call("", "create bucket", self._client.create_bucket, Bucket=self.bucket)

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
        with _errors("s3", "open for writing"):
            stream = self.fs.open(path, "wb", block_size=self.write_block_bytes)
        return ObjectWriter(stream, path, "s3")

    def local_path(self, relpath: str) -> str | None:
        return None


class ObjectWriter:
    """An object written front to back in one streaming upload (multipart past one
    block), completed when the block ends; on an exception the upload is aborted (or,
    where the file system cannot abort, the partial file removed)."""

    def __init__(self, stream: Any, path: str, protocol: str,
                 partial_remover: Callable[[str], None] | None = None, relpath: str = "") -> None:
        self.stream, self.path, self.protocol = stream, path, protocol
        self.written = 0
        self._remove, self._relpath = partial_remover, relpath

    def write_at(self, offset: int, view: memoryview) -> None:
        if offset != self.written:
            raise ValueError(f"object stores are written sequentially: {self.path} has "
                             f"{self.written} bytes, a write at {offset} cannot land")
        with _errors(self.protocol, "write"):
            self.stream.write(view)
        self.written += len(view)

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            with _errors(self.protocol, "complete upload"):
                self.stream.close()
            return
        discard = getattr(self.stream, "discard", None)
        if discard is not None and hasattr(self.stream, "forced"):   # an fsspec buffered file
            try:
                discard()
            finally:
                self.stream.closed = True
        else:
            self.stream.close()
            if self._remove is not None:
                self._remove(self._relpath)


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


def _generic_error(protocol: str, op: str, error: BaseException) -> OSError:
    return OSError(f"{protocol} {op}: {type(error).__name__}")


@contextmanager
def _errors(protocol: str, op: str) -> Iterator[None]:
    """Untimed calls: an OSError passes as it is, any other failure becomes one."""
    try:
        yield
    except OSError:
        raise
    except Exception as error:
        raise _generic_error(protocol, op, error) from error


# --- options ---------------------------------------------------------------------------------

def _checked_options(storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """A copy, refused if a key looks like a credential (the spec refuses them first;
    this keeps a backend opened from code just as clean). The value is never shown."""
    options = dict(storage_options or {})

    def check(table: dict[str, Any], where: str) -> None:
        for key, value in table.items():
            lowered = str(key).lower()
            if lowered not in SECRET_EXCEPTIONS and any(word in lowered for word in SECRET_WORDS):
                raise UsageError(f"storage option {where}{key} looks like a credential: "
                                 "credentials come from the environment only")
            if isinstance(value, dict):
                check(value, f"{where}{key}.")

    check(options, "")
    return options


def _number(options: dict[str, Any], key: str, default: float, kind: type) -> float:
    value = options.pop(key, default)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"storage option {key} = {value!r}: must be a number") from None
    if number <= 0:
        raise UsageError(f"storage option {key} = {value!r}: must be positive")
    return float(number)


def described_options(options: dict[str, Any]) -> dict[str, Any]:
    """The storage options allowed into the sidecar: allow-listed keys only, recursively;
    an endpoint URL without any user:password part."""
    shown: dict[str, Any] = {}
    for key, value in options.items():
        if key not in DESCRIBED_OPTIONS:
            continue
        if isinstance(value, dict):
            shown[key] = described_options(value)
        elif key == "endpoint_url":
            shown[key] = _without_userinfo(str(value))
        elif isinstance(value, str | int | float | bool):
            shown[key] = value
    return shown


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _versions(*packages: str) -> dict[str, str]:
    found = {}
    for package in dict.fromkeys(packages):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "?"
    return found
