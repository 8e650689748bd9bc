"""S3 on the wire, as lean as Python allows: one kept-alive http.client connection, each
request signed here (stampede.backends.sigv4), a response's body read straight from the
socket into the caller's buffer (recv_into: no bytes object in between, no copy). One
call is one attempt: retrying, and counting the retries, is the caller's
(stampede.backends.s3), so no request is ever hidden.

The connect timeout bounds the TCP connect (and the TLS handshake); the read timeout is
set on the socket, so it bounds every wait for bytes: a stalled server trips it, a slow
transfer that keeps moving never does. A kept-alive connection the server closed while
idle is noticed before a request is sent (poll(2), as urllib3 does) and replaced; every
failure closes the connection, so an attempt never inherits a broken one.

Where the requests go is resolved once (`Endpoint`): `endpoint_url` (a storage option,
else AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL), path-style addressing there unless
`addressing_style = "virtual"`; AWS's regional endpoint otherwise, virtual-hosted where the
bucket name allows it. HTTP(S)_PROXY and NO_PROXY are honoured.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import select
import socket
import ssl
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import quote, unquote_plus, urlsplit
from xml.etree import ElementTree
from xml.sax.saxutils import unescape

from stampede.backends.sigv4 import EMPTY_SHA256, Signer, canonical_query
from stampede.units import BYTES_PER_KIB

ERROR_BODY_MAX_BYTES = 64 * BYTES_PER_KIB   # an error's XML is small; more is not read
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
THROTTLING_CODES = frozenset({   # botocore's list: these back off from 1 s, others 50 ms
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "RequestThrottled", "SlowDown", "PriorRequestNotComplete"})
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "InternalError"})


class S3StatusError(Exception):
    """The server answered with an error status (its XML error code, if it sent one)."""

    def __init__(self, status: int, code: str, bucket_region: str = "") -> None:
        super().__init__(status, code)
        self.status, self.code, self.bucket_region = status, code, bucket_region

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUSES or self.code in THROTTLING_CODES \
            or self.code in TRANSIENT_CODES

    @property
    def throttling(self) -> bool:
        """429, a throttling code, or any 503: S3's 503 is SlowDown (or Service Unavailable,
        "reduce your request rate"), and a HEAD's 503 has no body to name its code."""
        return self.status in (429, 503) or self.code in THROTTLING_CODES


class S3TransportError(Exception):
    """No whole answer: what happened, in a few words ("read timeout", "connection
    refused", ...); worth another attempt but where the answer was of the wrong shape."""

    throttling = False

    def __init__(self, text: str, retryable: bool = True) -> None:
        super().__init__(text)
        self.text, self.retryable = text, retryable


@dataclass(frozen=True)
class Endpoint:
    """Where one bucket's requests go."""

    scheme: str          # http or https
    host: str            # the server's host name (for virtual-hosted: without the bucket)
    port: int
    region: str
    virtual: bool        # bucket.host/key rather than host/bucket/key
    verify: bool | str = True   # TLS: verify (True), don't (False), or a CA bundle path

    @property
    def url(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{self.host}" + (f":{self.port}" if self.port != default else "")

    def locate(self, bucket: str, key: str) -> tuple[str, str]:
        """(the Host header, the URI-encoded path) of an object (key "" = the bucket)."""
        default = 443 if self.scheme == "https" else 80
        host = self.host if self.port == default else f"{self.host}:{self.port}"
        encoded = quote(key, safe="/~")
        if self.virtual:
            return f"{bucket}.{host}", f"/{encoded}"
        return host, f"/{bucket}/{encoded}" if key else f"/{bucket}"


def resolve_endpoint(endpoint_url: str | None, region: str | None, addressing: str,
                     bucket: str, verify: bool | str = True, use_ssl: bool = True) -> Endpoint:
    """The endpoint for `bucket`: the URL given, else AWS's regional one (us-east-1
    when no region is configured anywhere)."""
    region = region or "us-east-1"
    if endpoint_url:
        parts = urlsplit(endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint_url = {endpoint_url!r}: an http:// or https:// URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        virtual = addressing == "virtual" and _dns_bucket(bucket) and not _is_ip(parts.hostname)
        return Endpoint(parts.scheme, parts.hostname, port, region, virtual, verify)
    scheme = "https" if use_ssl else "http"
    virtual = addressing != "path" and _dns_bucket(bucket) and "." not in bucket
    return Endpoint(scheme, f"s3.{region}.amazonaws.com", 443 if use_ssl else 80, region,
                    virtual, verify)


def _dns_bucket(bucket: str) -> bool:
    return 3 <= len(bucket) <= 63 and bucket == bucket.lower() and \
        all(label and label[0].isalnum() and label[-1].isalnum() for label in bucket.split("."))


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Wire:
    """One connection to one endpoint, used by one caller at a time (a rank)."""

    def __init__(self, endpoint: Endpoint, signer: Signer | None, connect_timeout_s: float,
                 read_timeout_s: float, extra_headers: dict[str, str] | None = None) -> None:
        self.endpoint, self.signer = endpoint, signer
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.extra_headers = dict(extra_headers or {})
        self._connection: http.client.HTTPConnection | None = None
        self._proxy = _proxy_for(endpoint)

    def request(self, method: str, bucket: str, key: str = "",
                query: tuple[tuple[str, str], ...] = (), headers: dict[str, str] | None = None,
                body: bytes | tuple[memoryview, ...] = b"",
                payload_sha256: str = EMPTY_SHA256) -> http.client.HTTPResponse:
        """Send one request; its response once the status line and headers are in (the
        body still unread). An error status raises S3StatusError (its body read and the
        connection kept), no whole answer S3TransportError (the connection closed).
        A body of views (an upload) is sent view by view with sendall, straight from the
        caller's buffers; the caller gives its content-length."""
        host, path = self.endpoint.locate(bucket, key)
        query_text = canonical_query(query)
        sent = {**self.extra_headers, **(headers or {})}
        if self.signer is not None:
            sent = self.signer.headers(method, host, path, query_text, sent, payload_sha256)
        else:
            sent["host"] = host
        target = f"{path}?{query_text}" if query_text else path
        if self._proxy and self.endpoint.scheme == "http":
            target = f"http://{host}{target}"   # through an HTTP proxy: the absolute URI
        connection = self._connected()
        try:
            connection.request(method, target, body=body or None, headers=sent)
            response = connection.getresponse()
        except Exception as error:
            self.close()
            raise S3TransportError(transport_text(error, "answer")) from error
        if response.status >= 300:
            raise self._status_error(response)
        return response

    def first_byte(self, response: http.client.HTTPResponse) -> None:
        """Return when the body's first byte is in (at once where it came with the
        headers; one socket read otherwise, into http.client's small buffer)."""
        if not response.length and response.length is not None:
            return   # no body to wait for
        try:
            response.fp.peek(1)
        except Exception as error:
            self.close()
            raise S3TransportError(transport_text(error, "body")) from error

    def read_into(self, response: http.client.HTTPResponse, view: memoryview) -> int:
        """The response's body into `view`, straight from the socket; the bytes read: all
        of the body, or S3TransportError (a body that ends early is an error, not a
        count; one longer than `view` too: the server ignored the Range)."""
        expected = response.length   # None: chunked, read until its end
        if expected is not None and expected > len(view):
            self.close()
            raise S3TransportError(f"{expected} bytes sent for a range of {len(view)} (Range "
                                   "ignored by the server?)", retryable=False)
        count = 0
        try:
            while not response.isclosed() and count < len(view):
                got = response.readinto(view[count:] if count else view)
                if not got:
                    break
                count += got
            if expected is not None and count < expected:   # EOF before Content-Length
                raise S3TransportError("response body ended early")
            if expected is None and not response.isclosed() and response.read(1):
                raise S3TransportError(f"more bytes sent than the range of {len(view)}",
                                       retryable=False)
        except S3TransportError:
            self.close()
            raise
        except Exception as error:
            self.close()
            raise S3TransportError(transport_text(error, "body")) from error
        return count

    def read(self, response: http.client.HTTPResponse) -> bytes:
        """A (small) response's whole body (b"" for a HEAD's: the response is done)."""
        try:
            return response.read()
        except Exception as error:
            self.close()
            raise S3TransportError(transport_text(error, "body")) from error

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # --- connections ---------------------------------------------------------------------

    def _connected(self) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is not None and (connection.sock is None or _dropped(connection.sock)):
            self.close()   # closed by the server while idle, or after a Connection: close
            connection = None
        if connection is None:
            connection = self._connection = self._connect()
        return connection

    def _connect(self) -> http.client.HTTPConnection:
        endpoint = self.endpoint
        host, port = (self._proxy or (endpoint.host, endpoint.port))
        connection: http.client.HTTPConnection
        if endpoint.scheme == "https":
            connection = http.client.HTTPSConnection(host, port, timeout=self.connect_timeout_s,
                                                     context=_tls_context(endpoint.verify))
            if self._proxy:
                connection.set_tunnel(endpoint.host, endpoint.port)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=self.connect_timeout_s)
        try:
            connection.connect()
        except Exception as error:
            connection.close()
            # a certificate that does not verify will not verify on the next attempt
            raise S3TransportError(transport_text(error, "connect"), retryable=not isinstance(
                error, ssl.SSLCertVerificationError)) from error
        assert connection.sock is not None
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.sock.settimeout(self.read_timeout_s)
        return connection

    def _status_error(self, response: http.client.HTTPResponse) -> S3StatusError:
        try:
            body = response.read(ERROR_BODY_MAX_BYTES)
        except Exception:
            body = b""
        if not response.isclosed():
            self.close()
        region = response.getheader("x-amz-bucket-region", "") or ""
        return S3StatusError(response.status, error_code(body) or _reason(response.status), region)


def _dropped(sock: socket.socket) -> bool:
    """An idle kept-alive socket with something to read has been closed by the peer (or
    holds bytes no request asked for): either way it cannot carry the next request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _tls_context(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    bundle = verify if isinstance(verify, str) else os.environ.get("AWS_CA_BUNDLE")
    return ssl.create_default_context(cafile=bundle or None)


def _proxy_for(endpoint: Endpoint) -> tuple[str, int] | None:
    """(host, port) of the HTTP(S)_PROXY for this endpoint, None where NO_PROXY or no
    proxy applies."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(endpoint.scheme)
    if not url or urllib.request.proxy_bypass(endpoint.host):
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return (parts.hostname or "", parts.port or 80) if parts.hostname else None


# --- what went wrong, in a few words ------------------------------------------------------

def error_code(body: bytes) -> str:
    """<Code> of an S3 XML error body ("" when there is none)."""
    return xml_field(body, "Code")


def xml_field(body: bytes, name: str) -> str:
    """The text of the first <name> element of a small S3 XML answer ("" when none)."""
    opening, closing = f"<{name}>".encode(), f"</{name}>".encode()
    start = body.find(opening)
    end = body.find(closing, start)
    if start < 0 or end < 0:
        return ""
    return unescape(body[start + len(opening):end].decode("utf-8", "replace").strip(),
                    {"&quot;": '"', "&apos;": "'"})


def transport_text(error: BaseException, phase: str) -> str:
    """A transport failure in a few words; `phase` is connect, answer or body."""
    if isinstance(error, TimeoutError):   # socket.timeout is TimeoutError
        return "connect timeout" if phase == "connect" else "read timeout"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "could not resolve the endpoint's host"
    if isinstance(error, http.client.IncompleteRead):
        return "response body ended early"
    if isinstance(error, ConnectionError | http.client.RemoteDisconnected):
        return "connection lost during the body" if phase == "body" else \
            "connection closed by the server"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed ({error.verify_message})"
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or type(error).__name__}"
    if isinstance(error, http.client.HTTPException):
        return f"bad HTTP answer ({type(error).__name__})"
    if isinstance(error, OSError) and error.errno:
        return os.strerror(error.errno)
    return type(error).__name__


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


# --- answers' bodies --------------------------------------------------------------------

def parse_list_page(body: bytes, prefix: str) -> tuple[list[str], str]:
    """(names relative to `prefix`, the continuation token or "") of a ListObjectsV2 page:
    its objects' keys and its common prefixes (the sub-"directories" of a delimited list)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise S3TransportError(f"a LIST answer that is not XML ({error})", retryable=False) from None
    fields: dict[str, list[ElementTree.Element]] = {}
    for child in root:   # the namespace (S3's, or none) left aside
        fields.setdefault(child.tag.rpartition("}")[2], []).append(child)

    def text(name: str, default: str = "") -> str:
        return (fields[name][0].text or default) if name in fields else default

    def inner(element: ElementTree.Element, name: str) -> str:
        found = [item.text or "" for item in element if item.tag.rpartition("}")[2] == name]
        return decode(found[0]) if found else ""

    decode: Callable[[str], str] = unquote_plus if text("EncodingType") == "url" else str
    names = [inner(item, "Key")[len(prefix):] for item in fields.get("Contents", ())]
    names += [inner(item, "Prefix")[len(prefix):].rstrip("/")
              for item in fields.get("CommonPrefixes", ())]
    token = text("NextContinuationToken") if text("IsTruncated").strip() == "true" else ""
    if text("IsTruncated").strip() == "true" and not token:
        raise S3TransportError("a truncated LIST page without a continuation token",
                               retryable=False)
    return names, token


def parse_uploads_page(body: bytes) -> tuple[list[tuple[str, str]], tuple[str, str]]:
    """((key, UploadId) of each upload, the (key, upload-id) markers of the next page or
    ("", "")) of a ListMultipartUploads answer."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise S3TransportError(f"a LIST uploads answer that is not XML ({error})",
                               retryable=False) from None

    def field(element: ElementTree.Element, name: str) -> str:
        found = [item.text or "" for item in element if item.tag.rpartition("}")[2] == name]
        return found[0] if found else ""

    uploads = [(field(item, "Key"), field(item, "UploadId")) for item in root
               if item.tag.rpartition("}")[2] == "Upload"]
    if field(root, "IsTruncated").strip() != "true":
        return uploads, ("", "")
    return uploads, (field(root, "NextKeyMarker"), field(root, "NextUploadIdMarker"))
