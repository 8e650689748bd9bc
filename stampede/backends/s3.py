"""S3 (and S3-compatible stores), request by request, on stampede's own lean client
(stampede.backends.s3wire: one kept-alive http.client connection, SigV4 signed here,
bodies read from the socket straight into the caller's buffer): stat and open are one
HEAD each, a read is one ranged GET into the caller's page-aligned buffer (its time to
first byte stamped when the body's first byte is in), a list is one
LIST (one request per 1,000 names). The save's requests are this client's too (timed,
stampede.run.save_objects): CreateMultipartUpload, UploadPart, CompleteMultipartUpload, a
PUT, a DELETE; an upload's body goes from the caller's buffers to the socket (sendall of
each view, no copy), its payload unsigned (x-amz-content-sha256: UNSIGNED-PAYLOAD, as
botocore sends over HTTPS: hashing every byte would cost a core ~2 GB/s; save.validate
re-reads and hashes what was written instead). prepare's uploads (untimed, their retries
counted nowhere) are the same requests (stampede.backends.s3upload).

Why not botocore on the timed path: its request machinery costs about a millisecond of
CPU per request and its body arrives in pieces to be copied; at 0.5 s of client CPU per
GB one core sustains 2 GB/s, so on a 100 Gb/s NIC the benchmark would measure itself
(bench/s3_get.py compares this client with bare boto3, obstore and awscrt loops).

Retrying is here, and nothing else retries: throttling (503 SlowDown, 429, the throttling
codes), other 5xx and transient codes, and transport failures (refused, closed, timed
out) are attempted again up to `max_attempts` in all (default 3) under the retry policy of
stampede.backends.s3retry (AWS's `standard` or `adaptive` mode, from the job's storage
options or the AWS configuration), and every retried attempt is counted under its op in
`retries`; the 429/503 answers per op in `throttles`, the seconds waited in `backoff_s`.
Every failure leaves as an OSError with a short text ("S3 GET 500 InternalError after 2
retries"); one that stayed throttled says so first ("throttled: S3 GET 503 SlowDown after
3 attempts on s3://b/k"), never as a missing object.
Credentials are botocore's chain's (the environment, the profile it names): never in
options, the sidecar or a log.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import os
import random
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any
from xml.sax.saxutils import escape

from stampede.backends import s3retry
from stampede.backends.fsspec import (
    FsspecBackend,
    ObjectHandle,
    ObjectWriter,
    checked_options,
    described_options,
    versions,
    without_userinfo,
)
from stampede.backends.s3upload import Streamed, Upload
from stampede.backends.s3wire import (
    Endpoint,
    S3StatusError,
    S3TransportError,
    Wire,
    error_code,
    parse_list_page,
    parse_uploads_page,
    resolve_endpoint,
    xml_field,
)
from stampede.backends.sigv4 import Signer
from stampede.errors import UsageError
from stampede.units import BYTES_PER_MIB

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0       # per socket read: a slow transfer that keeps moving never trips it
WRITE_BLOCK_BYTES = 16 * BYTES_PER_MIB   # multipart part size of a streaming upload (S3: >= 5 MiB)
LIST_PAGE = "list-type", "2"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


class S3Backend(FsspecBackend):
    """S3 (and S3-compatible stores) through stampede's own client, request by request."""

    def __init__(self, target_path: str, storage_options: dict[str, object] | None = None) -> None:
        options = checked_options(storage_options)
        kwargs = dict(options)
        self.connect_timeout_s = _number(kwargs, "connect_timeout", CONNECT_TIMEOUT_S, float)
        self.read_timeout_s = _number(kwargs, "read_timeout", READ_TIMEOUT_S, float)
        self.write_block_bytes = int(_number(kwargs, "block_size", WRITE_BLOCK_BYTES, int))
        self._setup("s3", target_path.partition("://")[2].strip("/"), options)
        self.bucket, _, self.prefix = self.root.partition("/")
        if not self.bucket:
            raise UsageError(f"target.path = {target_path!r}: an S3 target names a bucket "
                             "(s3://bucket/prefix)")
        import botocore.session

        session = botocore.session.Session()   # the environment's configuration, read once
        self.retry = s3retry.resolve(kwargs, session)
        self.max_attempts = self.retry.max_attempts
        self.endpoint = _endpoint(options, self.bucket, session)
        signer = None if options.get("anon") else \
            Signer(_credentials(session, target_path), self.endpoint.region)
        payer = {"x-amz-request-payer": "requester"} if options.get("requester_pays") else {}
        self._wire = Wire(self.endpoint, signer, self.connect_timeout_s, self.read_timeout_s,
                          payer)

    def _call(self, op: str, verb: str, function: Callable[..., object], *args: object) -> Any:
        """One request (`function` makes exactly one), attempted up to max_attempts times
        while it fails in a retryable way; each retry counted under `op` (timed ops only)
        and backed off first. Every failure leaves as an OSError."""
        retried = 0
        while True:
            self._wait(op, self.retry.before_request(time.monotonic()))
            try:
                return function(*args)
            except (S3StatusError, S3TransportError) as error:
                throttling = isinstance(error, S3StatusError) and error.throttling
                if op and throttling:
                    self.throttles[op] = self.throttles.get(op, 0) + 1
                if not error.retryable or retried + 1 >= self.retry.max_attempts:
                    raise s3_error(verb, error, retried, _named(args)) from error
                retried += 1
                if op:
                    self.retries[op] += 1
                self._wait(op, self.retry.after_failure(retried, throttling, time.monotonic(),
                                                        random.random))

    def _wait(self, op: str, seconds: float) -> None:
        """Back off (or wait for adaptive's token), the time counted under `op`."""
        if seconds > 0:
            time.sleep(seconds)
            if op:
                self.backoff_s[op] = self.backoff_s.get(op, 0.0) + seconds

    # --- timed -----------------------------------------------------------------------

    def stat(self, path: str) -> object:
        bucket, _, key = path.partition("/")
        return self._call("stat", "HEAD", self._head, bucket, key)

    def _open(self, path: str) -> ObjectHandle:
        bucket, _, key = path.partition("/")
        return ObjectHandle(path, self._call("open", "HEAD", self._head, bucket, key), bucket, key)

    def _head(self, bucket: str, key: str) -> int:
        """One HEAD: the object's size."""
        response = self._wire.request("HEAD", bucket, key)
        response.read()   # nothing (a HEAD): the response is done, the connection free
        return int(response.getheader("content-length") or 0)

    def read_into(self, handle: ObjectHandle, buffer: memoryview, offset: int) -> int:
        length = min(len(buffer), handle.size - offset)
        if length <= 0:
            return 0
        return int(self._call("read", "GET", self._get_into, handle.bucket, handle.key,
                              buffer[:length], offset))

    def _get_into(self, bucket: str, key: str, view: memoryview, offset: int) -> int:
        """One ranged GET, its body read from the socket into `view`; first_byte_ns is
        stamped when the body's first byte is in."""
        wire = self._wire
        response = wire.request("GET", bucket, key,
                                headers={"range": f"bytes={offset}-{offset + len(view) - 1}"})
        wire.first_byte(response)
        self.first_byte_ns = time.perf_counter_ns()
        return wire.read_into(response, view)

    def list(self, path: str) -> list[str]:
        bucket, _, key = path.partition("/")
        return self._list_prefix("list", bucket, f"{key}/" if key else "", "/")

    def _list_prefix(self, op: str, bucket: str, prefix: str,
                     delimiter: str) -> builtins.list[str]:
        """Names under a prefix, relative to it, page by page (1,000 per request, each
        request retried on its own)."""
        names: list[str] = []
        token = ""
        while True:
            page, token = self._call(op, "LIST", self._list_page, bucket, prefix, delimiter, token)
            names += page
            if not token:
                return [name for name in names if name and not name.endswith("/")]

    def _list_page(self, bucket: str, prefix: str, delimiter: str,
                   token: str) -> tuple[builtins.list[str], str]:
        query = [LIST_PAGE, ("prefix", prefix), ("encoding-type", "url")]
        query += [("delimiter", delimiter)] if delimiter else []
        query += [("continuation-token", token)] if token else []
        response = self._wire.request("GET", bucket, "", query=tuple(query))
        return parse_list_page(self._wire.read(response), prefix)

    # --- timed: the save on an object store (stampede.backends.base.ObjectStore) --------

    def start_upload(self, path: str, op: str = "create") -> Upload:
        bucket, _, key = path.partition("/")
        return Upload(bucket, key, self._call(op, "POST uploads", self._initiate, bucket, key))

    def _initiate(self, bucket: str, key: str) -> str:
        body = self._wire.read(self._wire.request("POST", bucket, key, query=(("uploads", ""),)))
        upload_id = xml_field(body, "UploadId")
        if not upload_id:
            raise S3TransportError("a CreateMultipartUpload answer without an UploadId",
                                   retryable=False)
        return upload_id

    @staticmethod
    def join_upload(path: str, upload_id: str) -> Upload:
        bucket, _, key = path.partition("/")
        return Upload(bucket, key, upload_id)

    def upload_part(self, upload: Upload, number: int, views: tuple[memoryview, ...],
                    op: str = "write") -> str:
        return str(self._call(op, "PUT part", self._send, upload.bucket, upload.key, views,
                              (("partNumber", str(number)), ("uploadId", upload.upload_id))))

    def put_object(self, path: str, views: tuple[memoryview, ...], op: str = "write") -> None:
        bucket, _, key = path.partition("/")
        self._call(op, "PUT", self._send, bucket, key, views, ())

    def publish(self, path: str, views: tuple[memoryview, ...], replacing: str | None) -> str:
        """Timed (publish): one conditional PUT, so that two writers never both publish:
        it replaces the object only while it is the one read (If-Match: `replacing`, its
        ETag), or creates it only where none is (If-None-Match: *, `replacing` None).
        FileExistsError (412: another writer published first) is not retried; the new
        object's ETag. A server that ignores the condition publishes unconditionally, as a
        plain PUT does."""
        bucket, _, key = path.partition("/")
        condition = {"if-match": replacing} if replacing else {"if-none-match": "*"}
        return str(self._call("publish", "PUT", self._send, bucket, key, views, (), condition))

    def new_phase(self) -> None:
        self.retry.restart()

    def etag(self, path: str) -> str | None:
        """Untimed: one HEAD, the object's ETag (None where there is no object)."""
        bucket, _, key = path.partition("/")
        try:
            return str(self._call("", "HEAD", self._head_etag, bucket, key))
        except FileNotFoundError:
            return None

    def _head_etag(self, bucket: str, key: str) -> str:
        response = self._wire.request("HEAD", bucket, key)
        response.read()
        return response.getheader("etag") or ""

    def _send(self, bucket: str, key: str, views: tuple[memoryview, ...],
              query: tuple[tuple[str, str], ...], condition: dict[str, str] | None = None) -> str:
        """One PUT of the views back to back (payload unsigned), under `condition`'s
        headers where given; the answer's ETag."""
        wire = self._wire
        response = wire.request("PUT", bucket, key, query=query, body=views,
                                headers={"content-length": str(sum(view.nbytes for view in views)),
                                         **(condition or {})},
                                payload_sha256=UNSIGNED_PAYLOAD)
        etag = response.getheader("etag") or ""
        wire.read(response)
        if query and not etag:
            raise S3TransportError("an UploadPart answer without an ETag", retryable=False)
        return etag

    def complete_upload(self, upload: Upload, parts: builtins.list[tuple[int, str]],
                        op: str = "fsync") -> None:
        body = ("<CompleteMultipartUpload>" + "".join(
            f"<Part><PartNumber>{number}</PartNumber><ETag>{escape(etag)}</ETag></Part>"
            for number, etag in parts) + "</CompleteMultipartUpload>").encode()
        self._call(op, "POST complete", self._complete, upload, body)

    def _complete(self, upload: Upload, body: bytes) -> None:
        answer = self._wire.read(self._wire.request(
            "POST", upload.bucket, upload.key, query=(("uploadId", upload.upload_id),), body=body,
            payload_sha256=hashlib.sha256(body).hexdigest()))
        if b"<Error>" in answer:   # S3 may answer 200 and fail in the body
            raise S3StatusError(200, error_code(answer) or "Error")

    def abort_upload(self, upload: Upload) -> None:
        with suppress(FileNotFoundError):   # NoSuchUpload: already aborted or completed
            self._call("", "DELETE upload", self._abort, upload)

    def _abort(self, upload: Upload) -> None:
        self._wire.read(self._wire.request("DELETE", upload.bucket, upload.key,
                                           query=(("uploadId", upload.upload_id),)))

    def unlink(self, path: str) -> None:
        bucket, _, key = path.partition("/")
        self._call("unlink", "DELETE", self._delete, bucket, key)

    def discard_uploads(self, relpath: str) -> builtins.list[str]:
        _, _, key = self.path(relpath).partition("/")
        prefix, found, markers = f"{key}/" if key else "", [], ("", "")
        while True:
            page, markers = self._call("", "LIST uploads", self._uploads_page, prefix, *markers)
            found += page
            if not any(markers):
                break
        for key, upload_id in found:
            self.abort_upload(Upload(self.bucket, key, upload_id))
        root = f"{self.prefix}/" if self.prefix else ""
        return [key[len(root):] for key, _ in found]

    def _uploads_page(self, prefix: str, key_marker: str, id_marker: str
                      ) -> tuple[builtins.list[tuple[str, str]], tuple[str, str]]:
        query = [("uploads", ""), ("prefix", prefix)]
        query += [("key-marker", key_marker), ("upload-id-marker", id_marker)] if key_marker else []
        body = self._wire.read(self._wire.request("GET", self.bucket, "", query=tuple(query)))
        return parse_uploads_page(body)

    # --- untimed ---------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        return {
            "protocol": "s3",
            "client": "stampede's own (http.client, one kept-alive connection per rank, "
                      "SigV4 signed, bodies read from the socket into the buffer, the save's "
                      "sent from the shard's buffer, payload unsigned; prepare's uploads "
                      "the same requests)",
            "endpoint_url": without_userinfo(self.endpoint.url),
            "region": self.endpoint.region,
            "addressing": "virtual-hosted" if self.endpoint.virtual else "path",
            "caches": {"client": "none (every op is its requests, nothing kept)",
                       "blocks": "off (every read is one ranged GET)",
                       "checksums": "off (none computed on reads or the save's uploads: "
                                    "save.validate re-reads and hashes)"},
            "retry": {**self.retry.describe(),
                      "retried": "429, 5xx, throttling and transient codes, transport errors",
                      "hidden_retries": "none (every retried attempt is counted)"},
            "timeouts_s": {"connect": self.connect_timeout_s, "read": self.read_timeout_s},
            "write_block_bytes": self.write_block_bytes,
            "versions": versions("botocore"),
            "storage_options": described_options(self.options),
        }

    def ensure_root(self) -> None:
        """The bucket exists afterwards (created if missing); no prefix objects are made."""
        try:
            self._call("", "HEAD bucket", self._head, self.bucket, "")
        except FileNotFoundError:
            self._call("", "create bucket", self._create_bucket)

    def _create_bucket(self) -> None:
        region = self.endpoint.region
        body = b"" if region == "us-east-1" else (
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
            f"<LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        ).encode()
        self._put(self.bucket, "", body)

    def size(self, relpath: str) -> int:
        bucket, _, key = self.path(relpath).partition("/")
        return int(self._call("", "HEAD", self._head, bucket, key))

    def get_bytes(self, relpath: str) -> bytes | None:
        bucket, _, key = self.path(relpath).partition("/")
        try:
            return bytes(self._call("", "GET", self._get_whole, bucket, key))
        except FileNotFoundError:
            return None

    def _get_whole(self, bucket: str, key: str) -> bytes:
        return self._wire.read(self._wire.request("GET", bucket, key))

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """One PUT: S3 makes the new object visible whole or not at all."""
        bucket, _, key = self.path(relpath).partition("/")
        self._call("", "PUT", self._put, bucket, key, bytes(data))

    def _put(self, bucket: str, key: str, body: bytes) -> None:
        self._wire.read(self._wire.request("PUT", bucket, key, body=body,
                                           payload_sha256=hashlib.sha256(body).hexdigest()))

    def remove(self, relpath: str) -> None:
        bucket, _, key = self.path(relpath).partition("/")
        with suppress(FileNotFoundError):   # S3 answers 204 anyway; S3-compatibles may not
            self._call("", "DELETE", self._delete, bucket, key)

    def _delete(self, bucket: str, key: str) -> None:
        self._wire.read(self._wire.request("DELETE", bucket, key))

    def names(self, relpath: str = "") -> builtins.list[str]:
        root_prefix = f"{self.prefix}/" if self.prefix else ""
        below = f"{root_prefix}{relpath.strip('/')}/" if relpath else root_prefix
        found = self._list_prefix("", self.bucket, below, "")
        return sorted(f"{below[len(root_prefix):]}{name}" for name in found)

    def writer(self, relpath: str) -> ObjectWriter:
        path = self.path(relpath)
        return ObjectWriter(Streamed(self, path), path, "s3")

    def local_path(self, relpath: str) -> str | None:
        return None

    # --- untimed: the target's lock (stampede.checkpoint.lock) ----------------------------

    def create_new(self, relpath: str, data: bytes) -> None:
        """One PUT with `If-None-Match: *`: 412 (an object is there; 409 when another
        conditional PUT of it is under way) is FileExistsError; 501 (a server that
        cannot) an OSError of ENOTSUP."""
        bucket, _, key = self.path(relpath).partition("/")
        try:
            self._call("", "PUT", self._put_new, bucket, key, bytes(data))
        except OSError as error:
            text = str(error)
            if " 412 " in text or "PreconditionFailed" in text or \
                    "ConditionalRequestConflict" in text:   # AWS: two at once, one wins
                raise FileExistsError(errno.EEXIST, text) from None
            if " 501 " in text or "NotImplemented" in text:
                raise OSError(errno.ENOTSUP, "the S3 server does not honour If-None-Match "
                                             "(a conditional create)") from None
            raise

    def _put_new(self, bucket: str, key: str, body: bytes) -> None:
        self._wire.read(self._wire.request("PUT", bucket, key, body=body,
                                           headers={"if-none-match": "*"},
                                           payload_sha256=hashlib.sha256(body).hexdigest()))


def _endpoint(options: dict[str, Any], bucket: str, session: Any) -> Endpoint:
    """Where the requests go: the options (top level or client_kwargs, as fsspec's s3fs
    takes them), then the environment and botocore's configuration (region)."""
    client = options.get("client_kwargs") or {}
    s3_config = (options.get("config_kwargs") or {}).get("s3") or {}
    url = options.get("endpoint_url") or client.get("endpoint_url") or \
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = options.get("region_name") or client.get("region_name") or \
        session.get_config_variable("region")
    addressing = str(s3_config.get("addressing_style") or options.get("addressing_style") or "auto")
    verify = client.get("verify", True)
    try:
        return resolve_endpoint(url, region, addressing, bucket,
                                verify if isinstance(verify, bool | str) else True,
                                bool(options.get("use_ssl", client.get("use_ssl", True))))
    except ValueError as error:
        raise UsageError(f"storage option {error}") from None


def _credentials(session: Any, target_path: str) -> object:
    """botocore's credential chain: the environment, the profile and files it names, ..."""
    found = session.get_credentials()
    if found is None:
        raise UsageError(f"{target_path}: no S3 credentials found (AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, ...)",
                         hint="export them, or set storage option anon = true for a public bucket")
    return found


# --- errors --------------------------------------------------------------------------------

def _named(args: tuple[object, ...]) -> str:
    """s3://bucket/key of a request's arguments (bucket and key first, or an Upload)."""
    if args and isinstance(args[0], Upload):
        return f"s3://{args[0].bucket}/{args[0].key}"
    if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        return f"s3://{args[0]}/{args[1]}"
    return ""


def s3_error(verb: str, error: S3StatusError | S3TransportError, retried: int,
             named: str = "") -> OSError:
    """An S3 failure as an OSError with a short text: status and code for an HTTP error
    ("S3 GET 503 SlowDown after 2 retries"), what happened for a transport one ("S3 HEAD:
    read timeout after 2 retries"). 404 is FileNotFoundError, 403 PermissionError. A
    throttling answer (429, 503 SlowDown and the throttling codes) that outlasted every
    attempt says so first, with the object ("throttled: S3 GET 503 SlowDown after 3
    attempts on s3://b/k"): the object is there, the store refused the rate (never ENOENT)."""
    if isinstance(error, S3StatusError) and error.throttling:
        on = f" on {named}" if named else ""
        attempts = f"{retried + 1} attempt{'s' if retried else ''}"
        return OSError(f"throttled: S3 {verb} {error.status} {error.code or 'SlowDown'} after "
                       f"{attempts}{on}")
    after = f" after {retried} retries" if retried else ""
    if isinstance(error, S3TransportError):
        return OSError(f"S3 {verb}: {error.text}{after}")
    text = f"S3 {verb} {error.status} {error.code}{after}"
    if error.bucket_region and error.status in (301, 307, 400):
        text += f" (the bucket is in {error.bucket_region}: set region_name)"
    if error.status == 404 or error.code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        return FileNotFoundError(errno.ENOENT, text)
    if error.status == 403:
        return PermissionError(errno.EACCES, text)
    if error.status == 412 or error.code in CONDITION_FAILED:   # a conditional write lost
        return FileExistsError(errno.EEXIST, f"{text}: another writer wrote it first")
    return OSError(text)


# A conditional PUT refused: the object is not the one named (412), or another conditional
# write of it is under way (AWS's 409): either way another writer got there first.
CONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict")


def _number(options: dict[str, object], key: str, default: float, kind: type) -> float:
    value = options.pop(key, default)
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"storage option {key} = {value!r}: must be a number") from None
    if number <= 0:
        raise UsageError(f"storage option {key} = {value!r}: must be positive")
    return float(number)
