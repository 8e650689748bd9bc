"""CephFS targets, `cephfs://[user@]mon-host[:port]/path`, through libcephfs
(stampede.libcephfs): one CephFS client per rank, mounted when the backend is
created (untimed), so the timed ops are each the client's requests and nothing else.

What it is: each rank is a client of its own to the MDS, with its own session and its own
capabilities, the view of 2,048 nodes meeting one metadata server (a kernel or ceph-fuse
mount shares one client among a node's ranks, and their caps). Its object cacher is off
(`client_oc = false`): every read is a read from the OSDs and every write is sent before
the call returns, never a page of the client's memory; what a client keeps is what every
CephFS client keeps, the metadata its capabilities cover (a stat or an open of a file
whose caps it holds asks the MDS nothing: the honest cost of a second open on CephFS).

The URL: the host and port are a monitor's (no port: Ceph's defaults, 3300 and 6789);
the user is the client's name (`cephfs://admin@mon/ck` is client.admin); the path is the
directory in the file system. `?fs=NAME` (or storage_options.fs) picks a file system where
the cluster has several. Without `conf` or `keyring` the client asks for no
authentication (a cluster with `auth_client_required = none`); `conf` reads a ceph.conf
(its keyring and auth settings), `keyring` names the user's keyring (cephx). The monitors
of the URL always stand over the conf's. A dead cluster is an error after `timeout_s`
(the mount, the monitors' and OSDs' ops), never a hang; so is a dead MDS: a call with no
answer after `timeout_s` ends the rank with one line (stampede.libcephfs's watchdog).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from functools import partial
from pathlib import PurePath, PurePosixPath
from urllib.parse import parse_qsl, unquote, urlsplit

from stampede import oploop
from stampede.backends.client_files import DIR_MODE, FILE_MODE, ClientFiles
from stampede.cephmds import perf_dump
from stampede.errors import UsageError
from stampede.filesystems import Striper, ceph_striper
from stampede.libcephfs import CEPH_STATX_BASIC_STATS, MOST_BYTES_PER_CALL, Mount, failed, version
from stampede.oploop import Calls, Compiled
from stampede.ops import RETRY_OPS
from stampede.targets import REGISTRY
from stampede.values import did_you_mean

DEFAULT_TIMEOUT_S = 20
OPTIONS = ("conf", "keyring", "fs", "timeout_s")
QUERY_KEYS = ("fs",)
LABEL = "a libcephfs client per rank (own MDS session and caps), its object cacher off"


def address_of(view: memoryview) -> int:
    """The address of a buffer's first byte, no copy (a writable buffer)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class CephfsBackend(ClientFiles):
    client: Mount
    name = "cephfs"
    capabilities = REGISTRY[name].capabilities
    first_byte_ns = 0

    def __init__(self, target_path: str, storage_options: dict[str, object] | None = None) -> None:
        options = dict(storage_options or {})
        target = parse_target(target_path, options)
        self.mon_host, self.user, self.root, self.fs_name = target
        self.target = target_path
        timeout_s = options.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
            raise UsageError(f"target.storage_options.timeout_s = {timeout_s!r}: a whole "
                             "number of seconds >= 1")
        conf, keyring = (_option_file(options, key) for key in ("conf", "keyring"))
        self.timeout_s = timeout_s
        self.authenticated = bool(conf or keyring)
        settings = {
            # a dead monitor, OSD or mount is an error after timeout_s, never a wait
            "client_mount_timeout": str(timeout_s), "rados_mon_op_timeout": str(timeout_s),
            "rados_osd_op_timeout": str(timeout_s),
            # a process's exit (its caps given back) waits this long for a dead MDS at most
            "client_shutdown_timeout": str(timeout_s),
            # every read reaches the OSDs, every write leaves before the call returns
            "client_oc": "false",
            # its errors are stampede's OSErrors, not lines on the rank's stderr
            "err_to_stderr": "false", "log_to_stderr": "false",
            "mon_host": self.mon_host,
        }
        if keyring:
            settings["keyring"] = keyring
        elif not conf:
            # no keyring looked for (its absence is said on stderr) and none asked for
            settings.update({"keyring": "/dev/null", "auth_client_required": "none"})
        self.client = Mount(settings, conf, self.fs_name, self.user, timeout_s)
        client = self.client
        self.retries = dict.fromkeys(RETRY_OPS, 0)   # the client retries nothing it tells
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
        flags = os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW)
        # direct: meaningless, the client caches no data to bypass
        return partial(self.client.open, flags=flags)   # no Python frame of its own

    def compiled_calls(self, direct: bool, follow_links: bool = True) -> Compiled:
        """The metadata loop's calls (stampede.oploop): ceph_statx, ceph_open and
        ceph_close on this rank's mount, as Mount.stat, open and close make them; the
        mount's watchdog reads the loop's progress."""
        client, lib, pointer = self.client, self.client.lib, ctypes.c_void_p
        calls = Calls(kind=oploop.CEPHFS, stat_want=CEPH_STATX_BASIC_STATS, stat_flags=0,
                      open_flags=os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW),
                      context=client.cmount.value,
                      open_fn=ctypes.cast(lib.ceph_open, pointer).value,
                      close_fn=ctypes.cast(lib.ceph_close, pointer).value,
                      stat_fn=ctypes.cast(lib.ceph_statx, pointer).value)
        return Compiled(calls, _ceph_error, client)

    def read_into(self, handle: int, buffer: memoryview, offset: int) -> int:
        """Reads from the OSDs until the buffer is full or the file ends (one call for a
        block below 1 GiB: the client splits it into the objects' reads itself)."""
        address, wanted, done = address_of(buffer), buffer.nbytes, 0
        pread = self.client.pread
        while done < wanted:
            got = pread(handle, address + done, min(wanted - done, MOST_BYTES_PER_CALL),
                        offset + done)
            if got == 0:
                break
            done += got
        return done

    def evict(self, path: object, offset: int, length: int) -> None:
        """Nothing cached client-side (client_oc off): every read reaches the OSDs."""

    def fs_type(self) -> str:
        return "cephfs (libcephfs)"

    # --- timed: the save ---------------------------------------------------------------

    def creator(self, direct: bool) -> Callable[[bytes], int]:
        def bound(path: bytes, _open: Callable[[bytes, int, int], int] = self.client.open,
                  _flags: int = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW) -> int:
            return _open(path, _flags, FILE_MODE)
        return bound

    def write_opener(self, direct: bool) -> Callable[[bytes], int]:
        def bound(path: bytes, _open: Callable[[bytes, int], int] = self.client.open) -> int:
            return _open(path, os.O_WRONLY)
        return bound

    def write_from(self, handle: int, view: memoryview, offset: int) -> int:
        """Writes to the OSDs (sent before the call returns: client_oc off): the count."""
        data = view.tobytes() if view.readonly else None   # rare: read-only views copied
        address = (ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0) \
            if data is not None else address_of(view)
        wanted, done, pwrite = view.nbytes, 0, self.client.pwrite
        while done < wanted:
            wrote = pwrite(handle, address + done, min(wanted - done, MOST_BYTES_PER_CALL),
                           offset + done)
            if wrote <= 0:
                break
            done += wrote
        return done

    def sync_dir(self, path: bytes) -> None:
        """The directory opened and fsynced: the client waits until the MDS has journaled
        its changes to the directory (the safe replies of its creates and renames)."""
        handle = self.client.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.client.fsync(handle)
        finally:
            self.client.close(handle)

    def mkdir(self, path: bytes) -> None:
        self.client.mkdir(path, DIR_MODE)

    # --- untimed ---------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        return {"protocol": "cephfs", "client": LABEL, "monitors": self.mon_host,
                "file_system": self.fs_name or "(the cluster's default)",
                "user": self.user or "(libcephfs's default, client.admin)",
                "authentication": "from conf/keyring" if self.authenticated else "none",
                "library": f"libcephfs {version()}", "client_oc": False,
                "timeout_s": self.timeout_s, "client_cache": "metadata under caps only"}

    def mds_perf(self, mds_spec: str = "*") -> dict[str, object]:
        """Untimed: the MDS's `perf dump` over the wire through this rank's client
        (stampede.cephmds.perf_dump), TimeoutError after timeout_s."""
        return perf_dump(self.client, self.timeout_s, mds_spec)

    def striper(self) -> Striper:
        """target.stripe_* through this rank's client: the striper a CephFS mount's
        directories get (stampede.filesystems), its xattrs libcephfs's."""
        return ceph_striper(self._getxattr, self._setxattr)

    def fs_path(self, relpath: str) -> PurePosixPath:
        return PurePosixPath(os.fsdecode(self.path(relpath)))

    def _getxattr(self, path: PurePath, name: str) -> bytes:
        return self.client.getxattr(os.fsencode(str(path)), name)

    def _setxattr(self, path: PurePath, name: str, value: bytes) -> None:
        self.client.setxattr(os.fsencode(str(path)), name, value)

    def size(self, relpath: str) -> int:
        return int(self.client.stat(self.path(relpath)).size)

    def is_directory(self, path: bytes) -> bool:
        """Whether the path is a directory (a link not followed)."""
        return stat.S_ISDIR(int(self.client.lstat(path).mode))

    def open_writer(self, path: bytes) -> CephfsWriter:
        return CephfsWriter(self, path)

    def create_exclusive(self, path: bytes) -> int:
        """One open with O_CREAT|O_EXCL (the MDS refuses a second, whatever client made the
        first)."""
        return self.client.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)


class CephfsWriter:
    """pwrite at any offset into one file (created 0o640 if missing, never truncated);
    fsynced and closed when the block ends."""

    def __init__(self, backend: CephfsBackend, path: bytes) -> None:
        self.backend = backend
        self.handle = backend.client.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)

    def write_at(self, offset: int, view: memoryview) -> None:
        while view.nbytes:
            written = self.backend.write_from(self.handle, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "the CephFS client wrote nothing")
            view, offset = view[written:], offset + written

    def __enter__(self) -> CephfsWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.backend.client.fsync(self.handle)
        finally:
            self.backend.client.close(self.handle)


def _option_file(options: dict[str, object], key: str) -> str | None:
    """storage_options.conf or .keyring: a path to a regular file (UsageError if not)."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not os.path.isfile(value):
        raise UsageError(f"target.storage_options.{key} = {value!r}: the path of a readable "
                         f"file ({'a ceph.conf' if key == 'conf' else 'the user’s keyring'})")
    return value


def parse_target(target_path: str, options: dict[str, object]
                 ) -> tuple[str, str | None, str, str | None]:
    """(the monitor address, the client's user or None, the directory in the file system,
    the file system's name or None) of `cephfs://[user@]host[:port]/path[?fs=NAME]`; a
    storage option that is not one of OPTIONS refused."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"target.storage_options: {', '.join(unknown)} do not apply to "
                         f"cephfs:// (it takes {', '.join(OPTIONS)})"
                         f"{did_you_mean(unknown[0], OPTIONS)}")
    parts = urlsplit(target_path)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    for key in query:
        if key not in QUERY_KEYS:
            raise UsageError(f"target.path = {target_path!r}: the query key {key!r} is not "
                             f"one of {', '.join(QUERY_KEYS)}{did_you_mean(key, QUERY_KEYS)}")
    if not parts.hostname:
        raise UsageError(f"target.path = {target_path!r}: names no monitor "
                         "(cephfs://[USER@]MON-HOST[:PORT]/PATH)")
    try:
        port = parts.port
    except ValueError:
        raise UsageError(f"target.path = {target_path!r}: the port is not a number "
                         "(1 to 65535)") from None
    if parts.password is not None:
        raise UsageError(f"target.path = {target_path!r}: a secret in the URL is refused "
                         "(name the user's keyring: target.storage_options.keyring)")
    path = "/" + unquote(parts.path).strip("/")
    if path == "/":
        raise UsageError(f"target.path = {target_path!r}: names no directory (a directory "
                         "below the file system's root: cephfs://MON-HOST[:PORT]/PATH)")
    fs_name = options.get("fs", query.get("fs"))
    if fs_name is not None and (not isinstance(fs_name, str) or not fs_name):
        raise UsageError(f"target.path = {target_path!r}: fs = {fs_name!r}: a file "
                         "system's name")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"   # an IPv6 address
    mon_host = f"{host}:{port}" if port else host
    return mon_host, unquote(parts.username) if parts.username else None, path, fs_name


def _ceph_error(op: int, code: int, path: bytes) -> OSError:
    """The OSError Mount.stat, open and close raise for -errno `code`."""
    return failed(code, "close" if op == oploop.CLOSE else path.decode(errors="replace"))
