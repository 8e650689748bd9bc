"""The storage contract every backend implements, written once.

Paths given to a backend are relative to its target root. The hot-path methods (`stat`,
`open`, `read_into`, `close`, `list`, and the save's `creator` ... `rmdir`) are called
between two clock stamps, so a backend binds them as directly as it can: every Python
frame added here is added to every latency.
They raise OSError and nothing else (FileNotFoundError for a missing file or object): the
pattern counts OSError per op and carries on; any other exception would stop the rank.

The untimed methods (`size`, `handle_size`, `get_bytes`, `put_bytes`, `remove`, `names`, `writer`,
`ensure_root`, `local_path`, `describe`) serve prepare, the manifest, clean and the scan
of an existing checkpoint; they are never called between clock stamps.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from stampede.oploop import Compiled
from stampede.targets import Capabilities


class Writer(Protocol):
    """Writes one file or object, handed out by `Backend.writer` as a context manager."""

    def write_at(self, offset: int, view: memoryview) -> None:
        """Write all of `view` at `offset`. Object stores write an object as one streaming
        upload: there `offset` must equal the bytes written so far (ValueError if not)."""


class Backend(Protocol):
    name: str
    # What it can do (its registry entry's, stampede.targets): callers ask these, never
    # its name. With `ttfb`, read_into sets `first_byte_ns` (perf_counter_ns when the first
    # byte of the response arrived).
    capabilities: Capabilities
    first_byte_ns: int
    # Retries the backend's client made on its own, cumulative per op name (stampede.ops.RETRY_OPS):
    # an op that succeeded after 2 retries is one sample, but 3 requests reached the
    # storage. Zero where the client never retries.
    retries: dict[str, int]
    # Of those requests, the answers that said the storage was throttling (429, 503
    # SlowDown), and the seconds the client waited before retrying or for its own rate
    # limiter, cumulative per op as `retries`. Zero where nothing throttles.
    throttles: dict[str, int]
    backoff_s: dict[str, float]

    # --- timed -----------------------------------------------------------------------

    def path(self, relpath: str) -> str | bytes:
        """The backend's own name for a checkpoint file (resolved once, before timing)."""

    def stat(self, path: Any) -> object:
        """Fetch the file's metadata (stat(2) / one HEAD)."""

    def compiled_calls(self, direct: bool, follow_links: bool = True) -> Compiled | None:
        """The calls a pass of stat, open and close makes in the compiled loop
        (stampede.oploop, stampede.run.metadata_loop): the same calls `stat`, `opener` and
        `close` make, and the OSError each failure becomes; None: the Python loops run."""

    def opener(self, direct: bool, follow_links: bool = True) -> Callable[[Any], object]:
        """A function path -> handle, opened for reading; direct = bypass the page cache
        (meaningless for object stores, which have none client-side); follow_links=False:
        a symbolic link is refused (OSError ELOOP), as a file prepare did not write is.
        Bound once before the timed loop, so each open pays no option handling."""

    def read_into(self, handle: Any, buffer: memoryview, offset: int) -> int:
        """Read len(buffer) bytes at offset into buffer (one pread / one ranged GET);
        return the count read: fewer at the end of the file, 0 at or past it."""

    def close(self, handle: Any) -> None:
        """Release the handle."""

    def list(self, path: Any) -> list[Any]:
        """Names in a directory (readdir / LIST of a prefix), in the backend's form."""

    def evict(self, path: Any, offset: int, length: int) -> None:
        """Drop this range's cached pages so the next read reaches storage (a no-op where
        nothing is cached client-side)."""

    def fs_type(self) -> str:
        """File-system type of the target (ext4, nfs4, lustre, tmpfs, s3, memory, ...)."""

    # --- timed: the save (stampede.run.save_pattern) -----------------------------------
    # Bound once before the timed loop like the reads; each raises OSError only. A backend
    # without `capabilities.saves` has none of them (save refuses it before any I/O).
    # Without `capabilities.has_directories` (object stores: no directories to make, sync
    # or remove, and no rename: an object appears whole when its upload completes, under
    # its final name) one that saves has `unlink` (one DELETE) of the methods below and
    # writes through the ObjectStore methods at the end of this module instead of the others.

    def creator(self, direct: bool) -> Callable[[Any], object]:
        """A function path -> handle that creates a new file for writing, failing if it
        exists (O_CREAT|O_EXCL, never through a link); direct = O_DIRECT."""

    def write_opener(self, direct: bool) -> Callable[[Any], object]:
        """A function path -> handle opening an existing file for writing (a shared file
        another rank created)."""

    def write_from(self, handle: Any, view: memoryview, offset: int) -> int:
        """Write `view` at `offset` (one pwritev); return the count written."""

    def sync(self, handle: Any) -> None:
        """Make the file's bytes durable (fsync)."""

    def sync_dir(self, path: Any) -> None:
        """Make a directory's entries durable (open, fsync, close)."""

    def mkdir(self, path: Any) -> None:
        """Create one directory (mode 0o750); FileExistsError when it exists."""

    def rename(self, source: Any, destination: Any) -> None:
        """Rename within the target, atomically (rename(2))."""

    def unlink(self, path: Any) -> None:
        """Delete a file (an object: one DELETE)."""

    def rmdir(self, path: Any) -> None:
        """Delete an empty directory."""

    # --- untimed: prepare, manifest, clean, sidecar ----------------------------------

    def describe(self) -> dict[str, object]:
        """For the sidecar: what the backend is and how it is configured (client, caches,
        retries, timeouts, library versions). Never a credential."""

    def ensure_root(self) -> None:
        """Make the target root usable for writing: a directory (mode 0o750) or a bucket."""

    def handle_size(self, handle: Any) -> int:
        """The size of an opened file (fstat / what the open's HEAD said): no request."""

    def size(self, relpath: str) -> int:
        """A file's size in bytes (stat(2), following links / one HEAD);
        FileNotFoundError when it does not exist."""

    def get_bytes(self, relpath: str) -> bytes | None:
        """A whole (small) file's bytes; None when it does not exist."""

    def put_bytes(self, relpath: str, data: bytes) -> None:
        """Replace a whole (small) file atomically: readers see the old or the new bytes."""

    def remove(self, relpath: str) -> None:
        """Delete a file (POSIX: or an empty directory); a missing one is not an error."""

    def names(self, relpath: str = "") -> builtins.list[str]:
        """Every file under the root (or its sub-directory / sub-prefix `relpath`),
        recursively, as paths relative to the root, sorted."""

    def writer(self, relpath: str) -> AbstractContextManager[Writer]:
        """A writer for one file; the bytes are durable (fsync / upload completed) when
        the block ends without an exception. On an exception nothing new is committed
        where the store allows it (an object upload is aborted)."""

    def local_path(self, relpath: str) -> str | None:
        """The file's path on a local mount, or None when there is none (object stores)."""


class Upload(Protocol):
    """An unfinished multipart upload, as ObjectStore hands it out and takes it back."""

    @property
    def upload_id(self) -> str: ...


class ObjectStore(Backend, Protocol):
    """The timed save on an object store (`capabilities.object_store`;
    stampede.run.save_objects). An object is written under its final name and appears
    whole when its upload completes: no temporary name, rename or directory. Each timed
    method is one request (retried, each retry counted under its op in `retries`) and
    raises OSError only; a body is sent straight from the caller's buffers, no copy."""

    def new_phase(self) -> None:
        """Untimed, before each timed phase: the client forgets what a restarted job's
        would not have (the adaptive retry mode's rate limiter, engaged by an earlier
        phase's 503s), so that no phase or layout runs under another's throttling."""

    def start_upload(self, path: Any) -> Upload:
        """Timed (create): CreateMultipartUpload; its handle (`handle.upload_id`: str)."""

    def join_upload(self, path: Any, upload_id: str) -> Upload:
        """Untimed, no request: a handle on an upload another rank started."""

    def upload_part(self, handle: Upload, number: int, views: tuple[memoryview, ...]) -> str:
        """Timed (write): one UploadPart of the views sent back to back; its ETag."""

    def complete_upload(self, handle: Upload, parts: builtins.list[tuple[int, str]]) -> None:
        """Timed (fsync): CompleteMultipartUpload of (number, ETag), ascending: the
        object durable and visible."""

    def abort_upload(self, handle: Upload) -> None:
        """Untimed: AbortMultipartUpload (its parts dropped); an upload already gone is
        not an error."""

    def put_object(self, path: Any, views: tuple[memoryview, ...], op: str = "write") -> None:
        """Timed (write; publish for the pointer): one PUT of the whole object; its
        retries counted under `op`."""

    def publish(self, path: str, views: tuple[memoryview, ...], replacing: str | None) -> str:
        """Timed (publish): one conditional PUT of the pointer: it replaces the object
        only while it is the one `replacing` names (its ETag), or creates it only where
        none is (None); FileExistsError when another writer published first. Its ETag."""

    def etag(self, path: str) -> str | None:
        """Untimed: the object's ETag (one HEAD), None where there is none."""

    def discard_uploads(self, relpath: str) -> builtins.list[str]:
        """Untimed: abort every unfinished upload under `relpath` (a killed save's, which
        no LIST shows); the objects they were for, relative to the root."""


def object_store(backend: Backend) -> ObjectStore | None:
    """The backend as an object store that saves (stampede.run.save_objects), else None."""
    if backend.capabilities.object_store:
        return backend   # type: ignore[return-value]
    return None


class RpcProber(Backend, Protocol):
    """A backend that counts what each op costs on the wire (`capabilities.rpc_probe`)."""

    def rpc_probe(self, relpath: str | None, block_bytes: int, save: bool) -> dict[str, object]:
        """Untimed, on one rank: the RPCs one of each op costs, on `relpath` (None: none to
        read), or the save's in a scratch directory."""


def rpc_prober(backend: Backend) -> RpcProber | None:
    """The backend as one that counts RPCs per op, else None."""
    return backend if backend.capabilities.rpc_probe else None   # type: ignore[return-value]


class MdsCounter(Backend, Protocol):
    """A backend that asks its metadata server for its own counters
    (`capabilities.mds_counters`; stampede.run.mds_counts)."""

    def mds_perf(self) -> dict[str, object]:
        """Untimed: the MDS's perf dump (its sections: mds_server's req_<op>_latency with
        avgcount and sum, mds's request and capability counts); OSError where it does not
        answer."""


def mds_counter(backend: Backend) -> MdsCounter | None:
    """The backend as one that reads its MDS's counters, else None."""
    return backend if backend.capabilities.mds_counters else None   # type: ignore[return-value]


class Exclusive(Backend, Protocol):
    """A backend that creates a small file or object only where none is
    (`capabilities.exclusive_create`): the target's lock where there is no flock
    (stampede.checkpoint.lock)."""

    def create_new(self, relpath: str, data: bytes) -> None:
        """Untimed: create `relpath` holding `data`, durable, only if nothing is there
        (one NFS CREATE, GUARDED or EXCLUSIVE; one PUT with If-None-Match: *), making its
        directory where there are directories; FileExistsError when something is there,
        an OSError of errno ENOTSUP when the server cannot create exclusively."""


def exclusive(backend: Backend) -> Exclusive | None:
    """The backend as one that creates exclusively, else None."""
    return backend if backend.capabilities.exclusive_create else None   # type: ignore[return-value]


def missing_root(backend: Backend) -> bool:
    """The target's root directory does not exist yet (so whoever creates it may remove
    it): a local path, or a server's directory (NFS); an object store's prefix never is."""
    local = backend.local_path("")
    if local is not None:
        return not os.path.exists(local)
    if not backend.capabilities.has_directories:
        return False
    try:
        backend.list(backend.path(""))
    except FileNotFoundError:
        return True
    return False
