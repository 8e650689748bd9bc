"""fsspec backends: fsspec's file systems (memory://, file://, gs://, ...) under the same
contract as the POSIX baseline; S3 has a client of its own (stampede.backends.s3) built
on the pieces here (ObjectHandle, ObjectWriter, the option checks).

fsspec's caches suit applications and falsify a benchmark, so every one is off and the
sidecar says so (`describe`): no instance cache (`skip_instance_cache`, one client per
rank, created untimed in __init__), no listings cache, no block cache (every read is one
request for exactly the bytes asked). Credentials are never passed in: the client reads
them from the environment (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...) itself.
"""

from __future__ import annotations

import builtins
import importlib.metadata
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from stampede.errors import UsageError
from stampede.ops import RETRY_OPS
from stampede.targets import REGISTRY
from stampede.values import credential_in

# Storage options that may be shown in the sidecar; every other key (and any credential,
# which the spec refuses anyway) stays out of it.
DESCRIBED_OPTIONS = frozenset({
    "endpoint_url", "region_name", "connect_timeout", "read_timeout", "max_attempts", "retry_mode",
    "block_size", "anon", "use_ssl", "requester_pays", "client_kwargs", "config_kwargs", "s3",
    "addressing_style", "auto_mkdir", "project", "version_aware",
})
FS_TYPES = {"gs": "gcs", "gcs": "gcs"}


class ObjectHandle(NamedTuple):
    """An 'open' object: what one HEAD told (its size), so reads need no more metadata."""

    path: str
    size: int
    bucket: str = ""
    key: str = ""


class FsspecBackend:
    """An fsspec file system, whichever (memory://, file://, gs://, ...); S3 has its own class."""


    def __init__(self, target_path: str, storage_options: dict[str, object] | None = None) -> None:
        import fsspec

        scheme = target_path.partition("://")[0]
        options = checked_options(storage_options)
        if scheme == "file":
            options.setdefault("auto_mkdir", True)
        cls = fsspec.get_filesystem_class(scheme)
        self.fs = cls(**{**options, "skip_instance_cache": True, "use_listings_cache": False})
        self._setup(scheme, cls._strip_protocol(target_path), options)

    def _setup(self, scheme: str, root: str, options: dict[str, object]) -> None:
        self.name = scheme
        # fsspec's generic calls return whole ranges (no first-byte stamp) and write whole
        # objects (no timed save): S3's own client adds both
        self.capabilities = REGISTRY[scheme].capabilities
        self.protocol = FS_TYPES.get(scheme, scheme)
        self.root = root.rstrip("/") if root != "/" else root
        self.options = options
        self.first_byte_ns = 0
        self.retries = dict.fromkeys(RETRY_OPS, 0)
        self.throttles, self.backoff_s = dict.fromkeys(RETRY_OPS, 0), dict.fromkeys(RETRY_OPS, 0.0)

    # --- timed -----------------------------------------------------------------------

    def path(self, relpath: str) -> str:
        if not relpath:
            return self.root
        return f"{self.root}/{relpath}" if self.root not in ("", "/") else f"{self.root}{relpath}"

    def stat(self, path: str) -> object:
        try:
            return self.fs.info(path, refresh=True)
        except OSError:
            raise
        except Exception as error:
            raise generic_error(self.protocol, "stat", error) from error

    def opener(self, direct: bool, follow_links: bool = True) -> Callable[[str], ObjectHandle]:
        return self._open   # direct: no client-side cache to bypass; objects have no links

    @staticmethod
    def compiled_calls(direct: bool, follow_links: bool = True) -> None:
        """None: a HEAD is Python's HTTP client, so the pattern's Python loops run."""

    def _open(self, path: str) -> ObjectHandle:
        try:
            info = self.fs.info(path, refresh=True)
        except OSError:
            raise
        except Exception as error:
            raise generic_error(self.protocol, "open", error) from error
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
            raise generic_error(self.protocol, "read", error) from error
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
            raise generic_error(self.protocol, "list", error) from error
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

    def describe(self) -> dict[str, object]:
        package = type(self.fs).__module__.partition(".")[0]
        return {
            "protocol": self.protocol,
            "client": f"fsspec {type(self.fs).__name__}",
            "caches": {"instance": "off (skip_instance_cache)",
                       "listings": "off (use_listings_cache=False)",
                       "blocks": "off (every read is one cat_file of the range)"},
            "retry": "left to the fsspec implementation (not counted)",
            "versions": versions("fsspec", package),
            "storage_options": described_options(self.options),
        }

    def ensure_root(self) -> None:
        with errors(self.protocol, "mkdir"):
            self.fs.makedirs(self.root, exist_ok=True)

    @staticmethod
    def handle_size(handle: ObjectHandle) -> int:
        return handle.size

    def size(self, relpath: str) -> int:
        with errors(self.protocol, "size"):
            return int(self.fs.info(self.path(relpath), refresh=True)["size"])

    def get_bytes(self, relpath: str) -> bytes | None:
        with errors(self.protocol, "get"):
            try:
                return bytes(self.fs.cat_file(self.path(relpath)))
            except FileNotFoundError:
                return None

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """Written beside, then moved over: readers never see a partial file."""
        path = self.path(relpath)
        temporary = f"{path}.tmp-{os.getpid()}"
        with errors(self.protocol, "put"):
            self.fs.pipe_file(temporary, data)
            self.fs.mv(temporary, path)

    def remove(self, relpath: str) -> None:
        path = self.path(relpath)
        with errors(self.protocol, "remove"):
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                self.fs.rmdir(path)

    def names(self, relpath: str = "") -> builtins.list[str]:
        prefix = self.path("") + ("/" if self.root not in ("", "/") else "")
        with errors(self.protocol, "find"):
            found = self.fs.find(self.path(relpath), withdirs=False)
        return sorted(path[len(prefix):] if path.startswith(prefix) else path for path in found)

    def writer(self, relpath: str) -> ObjectWriter:
        path = self.path(relpath)
        with errors(self.protocol, "open for writing"):
            stream = self.fs.open(path, "wb")
        return ObjectWriter(stream, path, self.protocol, partial_remover=self.remove, relpath=relpath)

    def local_path(self, relpath: str) -> str | None:
        return self.path(relpath) if self.protocol == "file" else None


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
        with errors(self.protocol, "write"):
            self.stream.write(view)
        self.written += len(view)

    def __enter__(self) -> ObjectWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            with errors(self.protocol, "complete upload"):
                self.stream.close()
            return
        abort = getattr(self.stream, "abort", None)
        if abort is not None:   # stampede's own S3 upload (stampede.backends.s3upload.Streamed)
            abort()
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



# --- errors and options -------------------------------------------------------------

def generic_error(protocol: str, op: str, error: BaseException) -> OSError:
    return OSError(f"{protocol} {op}: {type(error).__name__}")


@contextmanager
def errors(protocol: str, op: str) -> Iterator[None]:
    """Untimed calls: an OSError passes as it is, any other failure becomes one."""
    try:
        yield
    except OSError:
        raise
    except Exception as error:
        raise generic_error(protocol, op, error) from error


def checked_options(storage_options: dict[str, object] | None) -> dict[str, object]:
    """A copy, refused if a key looks like a credential (the spec refuses them first;
    this keeps a backend opened from code just as clean). The value is never shown."""
    options = dict(storage_options or {})
    found = credential_in(options)
    if found:
        raise UsageError(f"storage option {found}: credentials come from the environment only")
    return options


def described_options(options: dict[str, object]) -> dict[str, object]:
    """The storage options allowed into the sidecar: allow-listed keys only, recursively;
    an endpoint URL without any user:password part."""
    shown: dict[str, object] = {}
    for key, value in options.items():
        if key not in DESCRIBED_OPTIONS:
            continue
        if isinstance(value, dict):
            shown[key] = described_options(value)
        elif key == "endpoint_url":
            shown[key] = without_userinfo(str(value))
        elif isinstance(value, str | int | float | bool):
            shown[key] = value
    return shown


def without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def versions(*packages: str) -> dict[str, str]:
    found = {}
    for package in dict.fromkeys(packages):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "?"
    return found
