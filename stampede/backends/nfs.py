"""NFS targets, `nfs://server[:port]/export/path`, through libnfs (stampede.backends.libnfs):
one user-space NFS client per rank, connected and mounted when the backend is created
(untimed), so the timed ops are each the client's RPCs and nothing else.

What it is, and what it is not: a user-space client has no page cache and no attribute
cache, so every stat is a GETATTR (or a LOOKUP) on the wire and every read a READ, the
cold view of 2,048 nodes' kernel clients meeting the server at once. A kernel mount
(a POSIX target on NFS) caches attributes and pages and hides the storm on one machine:
the sidecar labels this backend so it is never confused with one.

The URL: the export is the path's first component (storage_options.export for a longer
one: `{export = "/srv/nfs"}`), the rest the directory the checkpoint is in. The port is
the NFS server's (libnfs's nfsport); `?version=3` or `4` (default 4; NFSv3 also needs
the server's MOUNT port, `?mountport=P`, where no portmapper answers). Directory changes
(CREATE, MKDIR, RENAME, REMOVE) are synchronous on an NFS server, so the save's
fsync_dir sends nothing; fsync is a COMMIT.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import stat
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from stampede.backends.client_files import DIR_MODE, FILE_MODE, ClientFiles
from stampede.backends.libnfs import Client
from stampede.errors import UsageError
from stampede.ops import RETRY_OPS
from stampede.targets import REGISTRY
from stampede.units import BYTES_PER_MIB
from stampede.values import did_you_mean

if TYPE_CHECKING:
    from stampede.backends.rpc_count import CountingRelay

Result = TypeVar("Result")   # what a probed call returns (a handle), handed back

# libnfs 4.0 (Debian's libnfs13) over NFSv4 reports no rsize or wsize, sends a READ of
# more than the server's maximum (ganesha's default 1 MiB) and fails, and encodes a
# WRITE's data into its 4 KiB request buffer: 3,944 bytes is the most that fits (bisected
# here against ganesha 4.3). Each call is one RPC of at most these.
NFS4_READ_BYTES = BYTES_PER_MIB
LIBNFS4_NFS4_WRITE_BYTES = 3944
DEFAULT_TIMEOUT_MS = 10_000    # a dead server is an error after this, never a hang
NFS_PORT, PORTMAPPER_PORT = 2049, 111
REFUSAL_PROBE_S = 2.0          # a refusal is immediate; silence is the mount's own error
OPTIONS = ("export", "version", "timeout_ms")
# the URL's query: libnfs takes many more keys, and ignores a misspelt one (`?verison=3` was
# a silent NFSv4), so only these pass; the port is the URL's own (server:PORT)
QUERY_KEYS = ("version", "mountport")
LABEL = "user-space NFS client per rank (libnfs): no client page or attribute cache"


def address_of(view: memoryview) -> int:
    """The address of a buffer's first byte, no copy (a writable buffer)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class NfsBackend(ClientFiles):
    client: Client
    name = "nfs"
    capabilities = REGISTRY[name].capabilities
    first_byte_ns = 0

    def __init__(self, target_path: str, storage_options: dict[str, object] | None = None) -> None:
        options = dict(storage_options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise UsageError(f"target.storage_options: {', '.join(unknown)} do not apply to "
                             f"nfs:// (it takes {', '.join(OPTIONS)})")
        self.url, self.export, self.root, self.version = parse_target(target_path, options)
        self.options = options
        timeout_ms = options.get("timeout_ms", DEFAULT_TIMEOUT_MS)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 100:
            raise UsageError(f"target.storage_options.timeout_ms = {timeout_ms!r}: a whole "
                             "number of milliseconds >= 100")
        self.target = target_path
        try:
            self.client = Client(self.url, timeout_ms)
        except OSError:
            # libnfs says EIO ("nfs_service failed") for a port nothing listens on: ask the
            # ports themselves, so a wrong port or a stopped server is said as such
            refused = refusal(self.url, self.version)
            if refused:
                raise UsageError(f"target.path = {target_path!r}: {refused}") from None
            raise
        client = self.client
        self.read_bytes = client.readmax or NFS4_READ_BYTES
        self.write_bytes = client.writemax or LIBNFS4_NFS4_WRITE_BYTES
        self.retries = dict.fromkeys(RETRY_OPS, 0)   # libnfs retries nothing (autoreconnect 0)
        self.throttles, self.backoff_s = dict.fromkeys(RETRY_OPS, 0), dict.fromkeys(RETRY_OPS, 0.0)
        self.stat = client.stat
        self.close = client.close
        self.list = client.listdir
        self.sync = client.fsync
        self.rename = client.rename
        self.unlink = client.unlink
        self.rmdir = client.rmdir

    # --- timed -----------------------------------------------------------------------

    def path(self, relpath: str) -> bytes:
        joined = f"{self.root.rstrip('/')}/{relpath}" if relpath else self.root
        return os.fsencode(joined if joined.startswith("/") else "/" + joined)

    def opener(self, direct: bool, follow_links: bool = True) -> Callable[[bytes], int]:
        def bound(path: bytes, _open: Callable[[bytes, int], int] = self.client.open) -> int:
            return _open(path, os.O_RDONLY)
        return bound   # direct: meaningless, there is no client cache to bypass

    @staticmethod
    def compiled_calls(direct: bool, follow_links: bool = True) -> None:
        """None: libnfs's calls stay in Python (the pattern's Python loops run)."""

    def read_into(self, handle: int, buffer: memoryview, offset: int) -> int:
        """READs of at most rsize each (one RPC per call), until the buffer is full or the
        file ends."""
        address, wanted, done, most = address_of(buffer), buffer.nbytes, 0, self.read_bytes
        pread = self.client.pread
        while done < wanted:
            got = pread(handle, address + done, min(wanted - done, most), offset + done)
            if got == 0:
                break
            done += got
        return done

    def evict(self, path: object, offset: int, length: int) -> None:
        """Nothing cached client-side: every read reaches the server."""

    def fs_type(self) -> str:
        return f"nfs{self.version} (libnfs)"

    # --- timed: the save ---------------------------------------------------------------

    def creator(self, direct: bool) -> Callable[[bytes], int]:
        def bound(path: bytes, _create: Callable[[bytes, int, int], int] = self.client.create,
                  _flags: int = os.O_WRONLY | os.O_CREAT | os.O_EXCL) -> int:
            return _create(path, _flags, FILE_MODE)
        return bound

    def write_opener(self, direct: bool) -> Callable[[bytes], int]:
        def bound(path: bytes, _open: Callable[[bytes, int], int] = self.client.open) -> int:
            return _open(path, os.O_WRONLY)
        return bound

    def write_from(self, handle: int, view: memoryview, offset: int) -> int:
        """WRITEs of at most wsize each (one RPC per call): the count written."""
        data = view.tobytes() if view.readonly else None   # rare: read-only views copied
        address = (ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0) \
            if data is not None else address_of(view)
        wanted, done, most, pwrite = view.nbytes, 0, self.write_bytes, self.client.pwrite
        while done < wanted:
            wrote = pwrite(handle, address + done, min(wanted - done, most), offset + done)
            if wrote <= 0:
                break
            done += wrote
        return done

    def sync_dir(self, path: bytes) -> None:
        """Nothing to send: an NFS server commits CREATE, RENAME and REMOVE before it
        replies."""

    def mkdir(self, path: bytes) -> None:
        self.client.mkdir(path, DIR_MODE)

    # --- untimed ---------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        return {"protocol": f"nfs{self.version}", "client": LABEL, "server": self.client.server,
                "export": self.export, "rsize": self.read_bytes, "wsize": self.write_bytes,
                "client_cache": "none (user-space client)"}

    def rpc_probe(self, relpath: str | None, block_bytes: int, save: bool) -> dict[str, object]:
        """Untimed, on one rank: the RPCs one of each op costs, counted through a relay
        (stampede.backends.rpc_count) by a client of its own: the restore's stat, open,
        read of one block, close and list of `relpath` (None: none to read), or the save's
        ops in a scratch directory made and removed here."""
        from stampede.backends.rpc_count import CountingRelay

        parts = urlsplit(self.url)
        query = dict(parse_qsl(parts.query))   # the NFS port through the relay; the rest
        relay = CountingRelay(parts.hostname or "127.0.0.1", int(query.pop("nfsport", 2049)))
        try:                                    # (NFSv3's MOUNT port) as it was
            probe = NfsBackend(f"nfs://127.0.0.1:{relay.port}{self.export}{self.root}"
                               f"?{urlencode(query)}", {**self.options, "export": self.export})
            try:
                counted = _probe_ops(probe, relay, relpath, block_bytes, save)
            finally:
                probe.client.destroy()
        finally:
            relay.close()
        return {"how": "one of each op through a counting relay, untimed, by a client of "
                       "its own (RPC calls: NFSv4 COMPOUNDs with their operations)",
                "ops": counted}

    def size(self, relpath: str) -> int:
        return int(self.client.stat(self.path(relpath)).size)

    def is_directory(self, path: bytes) -> bool:
        """Whether the path is a directory: one GETATTR (libnfs has no lstat)."""
        return stat.S_ISDIR(int(self.client.stat(path).mode))

    def open_writer(self, path: bytes) -> NfsWriter:
        return NfsWriter(self, path)

    def create_exclusive(self, path: bytes) -> int:
        """One CREATE with O_EXCL (libnfs sends GUARDED on v3, EXCLUSIVE4 on v4: the server
        refuses a second, NFS3ERR_EXIST, whatever client made the first)."""
        return self.client.create(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)


def _probe_ops(probe: NfsBackend, relay: CountingRelay, relpath: str | None, block_bytes: int,
               save: bool) -> dict[str, list[list[object]]]:
    """Each op once through `probe`, in the order a restore (or a save) makes them: op ->
    the calls it sent, runs of the same call as [count, name]."""
    counted: dict[str, list[list[object]]] = {}

    def count(op: str, call: Callable[[], Result]) -> Result:
        start = relay.count()
        result = call()
        runs: list[list[Any]] = []
        for name in relay.since(start):
            if runs and runs[-1][1] == name:
                runs[-1][0] += 1
            else:
                runs.append([1, name])
        counted[op] = runs
        return result

    if save:
        scratch = f".stampede-rpc-probe-{os.getpid()}"
        directory, first, second = (probe.path(scratch), probe.path(f"{scratch}/a"),
                                    probe.path(f"{scratch}/b"))
        data = memoryview(bytearray(block_bytes))
        count("mkdir", lambda: probe.mkdir(directory))
        try:
            handle = count("create", lambda: probe.creator(False)(first))
            count("write", lambda: probe.write_from(handle, data, 0))
            count("fsync", lambda: probe.sync(handle))
            count("close", lambda: probe.close(handle))
            count("rename", lambda: probe.rename(first, second))
            count("unlink", lambda: probe.unlink(second))
        finally:
            for leftover in (first, second):
                with suppress(OSError):
                    probe.unlink(leftover)
            count("rmdir", lambda: probe.rmdir(directory))
        return counted
    if relpath is None:
        return counted
    path = probe.path(relpath)
    count("stat", lambda: probe.stat(path))
    handle = count("open", lambda: probe.opener(False)(path))
    try:
        buffer = memoryview(bytearray(block_bytes))
        count("read", lambda: probe.read_into(handle, buffer, 0))
    finally:
        count("close", lambda: probe.close(handle))
    count("list", lambda: probe.list(probe.path(relpath.rpartition("/")[0])))
    return counted


class NfsWriter:
    """pwrite at any offset into one file (created 0o640 if missing, never truncated);
    COMMITted and closed when the block ends."""

    def __init__(self, backend: NfsBackend, path: bytes) -> None:
        self.backend = backend
        try:
            self.handle = backend.client.create(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                                FILE_MODE)
        except FileExistsError:
            self.handle = backend.client.open(path, os.O_WRONLY)

    def write_at(self, offset: int, view: memoryview) -> None:
        while view.nbytes:
            written = self.backend.write_from(self.handle, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "the NFS server wrote nothing")
            view, offset = view[written:], offset + written

    def __enter__(self) -> NfsWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.backend.client.fsync(self.handle)
        finally:
            self.backend.client.close(self.handle)


def refusal(url: str, version: int) -> str | None:
    """Why a mount of libnfs's `url` failed, where the reason is that nothing listens on
    a port it needs (NFSv3's MOUNT port or portmapper, then the NFS port); None where
    each answers, or is silent (a hung server: the mount's own timeout error stands)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    host = parts.hostname or ""
    ports = [int(query.get("mountport", PORTMAPPER_PORT))] if version == 3 else []
    ports.append(int(query.get("nfsport", NFS_PORT)))
    for port in ports:
        try:
            socket.create_connection((host, port), timeout=REFUSAL_PROBE_S).close()
        except ConnectionRefusedError:
            return (f"connection refused by {host}:{port}: nothing listens there (is the NFS "
                    "server running, and on that port?)")
        except TimeoutError:
            return None
        except OSError as error:   # no route, no such host
            return f"cannot reach {host}:{port}: {error.strerror or error}"
    return None


def parse_target(target_path: str, options: dict[str, object]) -> tuple[str, str, str, int]:
    """(libnfs's URL of the export, the export, the directory within it, the version)
    of `nfs://server[:port]/export/path[?version=V&…]`."""
    parts = urlsplit(target_path)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key, value in query.items():
        if key not in QUERY_KEYS:
            raise UsageError(f"target.path = {target_path!r}: the query key {key!r} is not "
                             f"one of {', '.join(QUERY_KEYS)}{did_you_mean(key, QUERY_KEYS)}")
        if key == "mountport" and not (value.isdigit() and 0 < int(value) < 65536):
            raise UsageError(f"target.path = {target_path!r}: mountport = {value!r}: a port "
                             "number, 1 to 65535")
    if not parts.hostname:
        raise UsageError(f"target.path = {target_path!r}: names no server "
                         "(nfs://SERVER[:PORT]/EXPORT/PATH)")
    version_text = str(options.get("version", query.pop("version", "4")))
    if version_text not in ("3", "4"):
        raise UsageError(f"target.path = {target_path!r}: NFS version {version_text!r}: 3 or 4")
    path = "/" + parts.path.strip("/")
    export = str(options.get("export", "/" + path.strip("/").split("/")[0]))
    export = "/" + export.strip("/")
    if path != export and not path.startswith(export.rstrip("/") + "/"):
        raise UsageError(f"target.path = {target_path!r}: not under the export {export!r}")
    if path == "/" or export == "/":
        raise UsageError(f"target.path = {target_path!r}: names no export "
                         "(nfs://SERVER[:PORT]/EXPORT/PATH)")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"target.path = {target_path!r}: the port is not a number") from None
    if port:
        query["nfsport"] = str(port)
    query["version"] = version_text
    url = f"nfs://{parts.hostname}{export}?{urlencode(query)}"
    return url, export, path[len(export):] or "/", int(version_text)
