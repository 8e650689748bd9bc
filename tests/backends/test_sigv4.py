"""stampede's SigV4 signer gives the signature botocore's own S3 signer gives, for the
requests stampede sends (HEAD, ranged GET, LIST with an odd prefix, PUT with a body, a
session token). The server checks signatures too (every S3 test); this pins the cases
a server might be lenient about."""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

import pytest

from stampede.backends.sigv4 import EMPTY_SHA256, Signer, canonical_query

botocore_auth = pytest.importorskip("botocore.auth")
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

NOW_S = datetime.datetime(2026, 3, 14, 15, 9, 26, tzinfo=datetime.UTC).timestamp()
HOST = "127.0.0.1:8333"


def botocore_authorization(monkeypatch: pytest.MonkeyPatch, credentials: Any, method: str,
                           path: str, query: str, headers: dict[str, str],
                           body: bytes) -> dict[str, str]:
    """botocore's S3SigV4Auth on the same request at the same instant: its headers."""
    monkeypatch.setattr(botocore_auth, "get_current_datetime",
                        lambda: datetime.datetime.fromtimestamp(NOW_S, datetime.UTC)
                        .replace(tzinfo=None))
    url = f"http://{HOST}{path}" + (f"?{query}" if query else "")
    request = AWSRequest(method, url, headers={"host": HOST, **headers}, data=body or None)
    botocore_auth.S3SigV4Auth(credentials.get_frozen_credentials(), "s3", "eu-west-3").add_auth(request)
    return {name.lower(): value for name, value in request.headers.items()}


@pytest.mark.parametrize(("method", "path", "query", "headers", "body"), [
    ("HEAD", "/bucket/prefix/shard-0000.safetensors", (), {}, b""),
    ("GET", "/bucket/prefix/a%20b/%C3%BC%2Bx.bin", (), {"range": "bytes=1048576-2097151"}, b""),
    ("GET", "/bucket", (("list-type", "2"), ("prefix", "run 1/ü+x/"), ("delimiter", "/"),
                        ("encoding-type", "url"), ("continuation-token", "1/a==")), {}, b""),
    ("PUT", "/bucket/prefix/stampede-manifest.json", (), {}, b'{"v": 1}'),
])
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEBYaDFAKESESSIONTOKEN"])
def test_the_signature_is_botocores(monkeypatch: pytest.MonkeyPatch, method: str, path: str,
                                    query: tuple[tuple[str, str], ...], headers: dict[str, str],
                                    body: bytes, token: str | None) -> None:
    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    query_text = canonical_query(query)
    payload = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
    ours = Signer(credentials, "eu-west-3").headers(method, HOST, path, query_text, dict(headers),
                                                   payload, now_s=NOW_S)
    theirs = botocore_authorization(monkeypatch, credentials, method, path, query_text, headers,
                                    body)
    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-date"] == theirs["x-amz-date"] == "20260314T150926Z"
    assert ours["x-amz-content-sha256"] == theirs["x-amz-content-sha256"]
    assert ours.get("x-amz-security-token") == theirs.get("x-amz-security-token") == token


def test_refreshing_credentials_are_asked_every_time() -> None:
    class Rotating:
        """botocore's RefreshableCredentials' shape: a new secret after each refresh."""

        def __init__(self) -> None:
            self.secrets = iter(["first-secret", "second-secret"])

        def refresh_needed(self) -> bool:
            return True

        def get_frozen_credentials(self) -> Any:
            return Credentials("AKIDEXAMPLE", next(self.secrets)).get_frozen_credentials()

    signer = Signer(Rotating(), "us-east-1")
    first = signer.headers("HEAD", HOST, "/b/k", "", {}, now_s=NOW_S)["authorization"]
    second = signer.headers("HEAD", HOST, "/b/k", "", {}, now_s=NOW_S)["authorization"]
    assert first != second   # the second secret signed the second request


def test_the_canonical_query_is_sorted_and_encoded() -> None:
    assert canonical_query((("prefix", "a b/ü"), ("list-type", "2"), ("delimiter", "/"))) == \
        "delimiter=%2F&list-type=2&prefix=a%20b%2F%C3%BC"
