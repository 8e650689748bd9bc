"""AWS Signature Version 4 for S3 requests, computed here: a timed HEAD or GET pays one
SHA-256 and two HMACs (the day's signing key is derived once a day, not per request),
not botocore's request machinery. The result is the same signature botocore computes
(tests/backends/test_sigv4.py checks it against botocore's own signer) and the server
checks every one (SeaweedFS in the tests is started with the dummy keys).

Credentials are botocore's: its chain reads them from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE and the files it names, ...), and
refreshing ones are asked for their current value on every request. A credential never
leaves this module but in the Authorization and token headers it signs.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def canonical_query(query: Iterable[tuple[str, str]]) -> str:
    """The query string as sent and as signed: each name and value percent-encoded
    (RFC 3986 unreserved characters kept), sorted."""
    return "&".join(sorted(f"{quote(name, safe='-_.~')}={quote(value, safe='-_.~')}"
                           for name, value in query))


class Signer:
    """Signs requests for one region with the credentials botocore found."""

    def __init__(self, credentials: Any, region: str) -> None:
        self.region = region
        self._credentials = credentials
        # plain credentials never change: frozen once; refreshing ones are asked each time
        self._refreshing = hasattr(credentials, "refresh_needed")
        self._frozen: Any = None if self._refreshing else credentials.get_frozen_credentials()
        self._day_key: tuple[str, str, bytes] = ("", "", b"")

    def headers(self, method: str, host: str, path: str, query: str,
                headers: dict[str, str], payload_sha256: str = EMPTY_SHA256,
                now_s: float | None = None) -> dict[str, str]:
        """`headers` (lower-case names) plus host, x-amz-date, x-amz-content-sha256, the
        session token if any, and the Authorization that signs them all. `path` is the
        URI-encoded path as sent, `query` the canonical query string."""
        frozen = self._credentials.get_frozen_credentials() if self._refreshing else self._frozen
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
        signed = {**headers, "host": host, "x-amz-date": stamp,
                  "x-amz-content-sha256": payload_sha256}
        if frozen.token:
            signed["x-amz-security-token"] = frozen.token
        names = sorted(signed)
        canonical = "\n".join((
            method, path, query,
            "".join(f"{name}:{' '.join(str(signed[name]).split())}\n" for name in names),
            ";".join(names), payload_sha256))
        scope = f"{stamp[:8]}/{self.region}/{SERVICE}/aws4_request"
        to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._signing_key(frozen.secret_key, stamp[:8]), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        signed["authorization"] = (f"{ALGORITHM} Credential={frozen.access_key}/{scope}, "
                                   f"SignedHeaders={';'.join(names)}, Signature={signature}")
        return signed

    def _signing_key(self, secret_key: str, day: str) -> bytes:
        """HMAC(HMAC(HMAC(HMAC("AWS4" + secret, day), region), "s3"), "aws4_request"),
        kept for the day (and the secret: refreshed credentials bring a new one)."""
        cached_day, cached_secret, key = self._day_key
        if cached_day == day and hmac.compare_digest(cached_secret, secret_key):
            return key
        key = f"AWS4{secret_key}".encode()
        for part in (day, self.region, SERVICE, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._day_key = (day, secret_key, key)
        return key
