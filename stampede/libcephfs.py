"""libcephfs (the CephFS client library distributions package: Debian's libcephfs2) through
ctypes: one mount (a client of the MDS, with its own session and capabilities) per
instance, its synchronous calls, each error an OSError.

libcephfs returns -errno. Reads and writes go straight from and to the caller's buffer
(its address, no copy), at an offset (pread/pwrite: no file position is used). The
library must not be used across a fork: a rank creates its own client after MPI started
it, and nothing forks after that but to exec.

No call waits for a dead MDS without end: libcephfs has no per-request timeout (a request
waits until an MDS answers, as every CephFS client's does), and a thread blocked in a C
call cannot be interrupted. So a mount made with a bound (`timeout_s`) notes each call as
it starts (what, when: two stores, nothing added to a timed op beyond them; the compiled
metadata loop, stampede.oploop, notes its own steps in C, read through a Progress), and one
watchdog thread per process looks every WATCH_PERIOD_S: a call past its bound ends the
process with one line on stderr naming the call, the MDS and the bound, exit status 1.
Whatever the command archived before stays archived; the launcher ends the other ranks.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import json
import os
import threading
import time
import weakref
from collections.abc import Callable

from stampede.clibrary import Prototypes, load
from stampede.errors import UsageError
from stampede.launcher import launcher_rank

INSTALL_HINT = "apt-get install libcephfs2 (Debian/Ubuntu; dnf install libcephfs2 on RHEL)"
LIBRARY_NAMES = ("libcephfs.so.2", "libcephfs.so")

# ceph_statx's want mask (ceph_statx.h): every basic field (mode ... size, blocks)
CEPH_STATX_BASIC_STATS = 0x7FF
AT_SYMLINK_NOFOLLOW = 0x100
# one read or write call moves at most this (the library's return is an int)
MOST_BYTES_PER_CALL = 1 << 30
# an xattr's value read back (a layout's is about 80 bytes; a longer one is ERANGE)
XATTR_BYTES = 4096
WATCH_PERIOD_S = 0.5      # how often the watchdog looks at the calls in progress
GAVE_UP_STATUS = 1        # a run that could not finish: RunFailed's status
# the unmount has its own bound (client_shutdown_timeout = timeout_s): watched at twice it
UNMOUNT_FACTOR = 2


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Statx(ctypes.Structure):
    """struct ceph_statx (libcephfs's own statx: the fields `want` asked for)."""

    _fields_ = [("mask", ctypes.c_uint32), ("blksize", ctypes.c_uint32),
                ("nlink", ctypes.c_uint32), ("uid", ctypes.c_uint32), ("gid", ctypes.c_uint32),
                ("mode", ctypes.c_uint16), ("ino", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("blocks", ctypes.c_uint64), ("dev", ctypes.c_uint64), ("rdev", ctypes.c_uint64),
                ("atime", Timespec), ("ctime", Timespec), ("mtime", Timespec),
                ("btime", Timespec), ("version", ctypes.c_uint64)]


class Dirent(ctypes.Structure):
    """Linux's struct dirent, as ceph_readdir returns it."""

    _fields_ = [("ino", ctypes.c_uint64), ("off", ctypes.c_int64), ("reclen", ctypes.c_uint16),
                ("type", ctypes.c_uint8), ("name", ctypes.c_char * 256)]


_lib: ctypes.CDLL | None = None


def library() -> ctypes.CDLL:
    """The loaded libcephfs with its prototypes (once per process); UsageError where none."""
    global _lib
    if _lib is not None:
        return _lib
    p, i, s, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_size_t
    u = ctypes.c_uint
    prototypes: Prototypes = {
        "ceph_version": (s, [ctypes.POINTER(i)] * 3),
        "ceph_create": (i, [ctypes.POINTER(p), s]), "ceph_release": (i, [p]),
        "ceph_conf_read_file": (i, [p, s]), "ceph_conf_set": (i, [p, s, s]),
        "ceph_select_filesystem": (i, [p, s]), "ceph_mount": (i, [p, s]),
        "ceph_unmount": (i, [p]), "ceph_statx": (i, [p, s, ctypes.POINTER(Statx), u, u]),
        "ceph_fstatx": (i, [p, i, ctypes.POINTER(Statx), u, u]),
        "ceph_open": (i, [p, s, i, ctypes.c_uint32]), "ceph_close": (i, [p, i]),
        "ceph_read": (i, [p, i, p, i64, i64]), "ceph_write": (i, [p, i, p, i64, i64]),
        "ceph_fsync": (i, [p, i, i]), "ceph_mkdir": (i, [p, s, ctypes.c_uint32]),
        "ceph_rmdir": (i, [p, s]), "ceph_unlink": (i, [p, s]), "ceph_rename": (i, [p, s, s]),
        "ceph_opendir": (i, [p, s, ctypes.POINTER(p)]),
        "ceph_readdir": (ctypes.POINTER(Dirent), [p, p]), "ceph_closedir": (i, [p, p]),
        "ceph_mds_command": (i, [p, s, ctypes.POINTER(s), sz, s, sz,
                                 ctypes.POINTER(p), ctypes.POINTER(sz),
                                 ctypes.POINTER(p), ctypes.POINTER(sz)]),
        "ceph_buffer_free": (None, [p]),
        "ceph_getxattr": (i, [p, s, s, p, sz]), "ceph_setxattr": (i, [p, s, s, p, sz, i]),
    }
    lib = load(LIBRARY_NAMES, prototypes, "cephfs:// targets need libcephfs, the CephFS "
               "client library, and it is not installed", "Ceph 14 or later", INSTALL_HINT)
    _lib = lib
    return lib


def version() -> str:
    return (library().ceph_version(None, None, None) or b"").decode()


ERROR_CLASSES = {errno.ENOENT: FileNotFoundError, errno.EEXIST: FileExistsError,
                 errno.EACCES: PermissionError, errno.EPERM: PermissionError,
                 errno.ENOTDIR: NotADirectoryError, errno.EISDIR: IsADirectoryError,
                 errno.ETIMEDOUT: TimeoutError, errno.ECONNREFUSED: ConnectionRefusedError}


# What an errno means when CephFS returns it, said after the system's words (in a phase's
# message, a refused lock): the three a cluster gives a client that did nothing wrong
MEANINGS = {
    errno.ENOSPC: "the cluster is full: an OSD past its full ratio, or the file's data "
                  "pool at its quota (`ceph health detail` says which); nothing more can be "
                  "written until space is freed or the limit raised",
    errno.EDQUOT: "a CephFS quota is reached (ceph.quota.max_bytes or max_files of this "
                  "directory or one above it)",
    # libcephfs's EBLOCKLISTED
    errno.ESHUTDOWN: "this client was evicted by the MDS (`ceph tell mds.* client evict`, "
                     "or its session went stale): its session is closed and its address "
                     "blocklisted on the OSDs, so it can do nothing more",
}


def failed(code: int, what: str) -> OSError:
    """An OSError for libcephfs's -errno `code` (its subclass, as os.* raises), its words
    the system's and, for a full cluster, a quota or an eviction, what that means."""
    number = -code if code < 0 else errno.EIO
    words = os.strerror(number)
    if number in MEANINGS:
        words += f": {MEANINGS[number]}"
    return ERROR_CLASSES.get(number, OSError)(number, words, what)


class Mount:
    """One CephFS client mounted at the file system's root: every call synchronous, paths
    absolute in the file system ("/dir/file"). Not thread-safe: one per rank."""

    def __init__(self, settings: dict[str, str], conf_file: str | None, fs_name: str | None,
                 user: str | None, timeout_s: float | None = None) -> None:
        lib = library()
        self.lib = lib
        self.cmount = ctypes.c_void_p()
        self.mounted = False
        # the call in progress: (what, its path, when it began); None between calls; or,
        # while the compiled metadata loop runs, its progress, which says the same
        self.calling: tuple[str, bytes, float] | Callable[[], tuple[str, bytes, float] | None] \
            | None = None
        self.timeout_s = timeout_s
        self.monitors = settings.get("mon_host", "")
        if timeout_s is not None:
            _watch(self)
        code = lib.ceph_create(ctypes.byref(self.cmount), user.encode() if user else None)
        if code < 0:
            raise failed(code, "ceph_create")
        try:
            if conf_file:
                code = lib.ceph_conf_read_file(self.cmount, conf_file.encode())
                if code < 0:
                    raise failed(code, f"ceph_conf_read_file {conf_file}")
            for option, value in settings.items():
                code = lib.ceph_conf_set(self.cmount, option.encode(), value.encode())
                if code < 0:
                    raise UsageError(f"the Ceph client option {option} = {value!r} is refused "
                                     f"by libcephfs ({os.strerror(-code)})")
            if fs_name:
                code = lib.ceph_select_filesystem(self.cmount, fs_name.encode())
                if code < 0:
                    raise failed(code, f"select file system {fs_name}")
            code = lib.ceph_mount(self.cmount, b"/")
            if code < 0:
                raise failed(code, f"mount (monitors {settings.get('mon_host', '?')})")
            self.mounted = True
            # a client that exits without unmounting keeps its caps until the MDS's
            # session timeout (60 s): the next command's opens of the files it wrote wait
            # that long for them. So every process gives its caps back as it exits.
            atexit.register(self.release)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unmounted (its session closed, its capabilities given back) and freed."""
        if self.cmount:
            atexit.unregister(self.release)
            if self.mounted:
                self.calling = ("unmount", b"", time.monotonic())
                self.lib.ceph_unmount(self.cmount)
                self.calling = None
                self.mounted = False
            self.lib.ceph_release(self.cmount)
            self.cmount = ctypes.c_void_p()

    def check(self, code: int, what: bytes) -> int:
        self.calling = None   # the call returned
        if code < 0:
            raise failed(code, what.decode(errors="replace"))
        return code

    def begin(self, what: str, path: bytes = b"") -> None:
        """A call starts (the watchdog's note: what, on what, since when)."""
        self.calling = (what, path, _now())

    def stat(self, path: bytes) -> Statx:
        found = Statx()
        self.begin("stat", path)
        self.check(self.lib.ceph_statx(self.cmount, path, ctypes.byref(found),
                                       CEPH_STATX_BASIC_STATS, 0), path)
        return found

    def lstat(self, path: bytes) -> Statx:
        found = Statx()
        self.begin("stat", path)
        self.check(self.lib.ceph_statx(self.cmount, path, ctypes.byref(found),
                                       CEPH_STATX_BASIC_STATS, AT_SYMLINK_NOFOLLOW), path)
        return found

    def fstat_size(self, fd: int) -> int:
        found = Statx()
        self.begin("fstat")
        self.check(self.lib.ceph_fstatx(self.cmount, fd, ctypes.byref(found),
                                        CEPH_STATX_BASIC_STATS, 0), b"fstat")
        return int(found.size)

    # open and close are an open storm's every call: begin and check written out in them
    # (two Python calls fewer a call, about 0.15 us of an open's 5 us through libcephfs)
    def open(self, path: bytes, flags: int, mode: int = 0) -> int:
        self.calling = ("open", path, _now())
        code: int = self.lib.ceph_open(self.cmount, path, flags, mode)
        self.calling = None
        if code < 0:
            raise failed(code, path.decode(errors="replace"))
        return code

    def close(self, fd: int) -> None:
        self.calling = ("close", b"", _now())
        code: int = self.lib.ceph_close(self.cmount, fd)
        self.calling = None
        if code < 0:
            raise failed(code, "close")

    def pread(self, fd: int, address: int, count: int, offset: int) -> int:
        self.begin("read")
        return self.check(self.lib.ceph_read(self.cmount, fd, address, count, offset), b"read")

    def pwrite(self, fd: int, address: int, count: int, offset: int) -> int:
        self.begin("write")
        return self.check(self.lib.ceph_write(self.cmount, fd, address, count, offset), b"write")

    def fsync(self, fd: int) -> None:
        self.begin("fsync")
        self.check(self.lib.ceph_fsync(self.cmount, fd, 0), b"fsync")

    def mkdir(self, path: bytes, mode: int) -> None:
        self.begin("mkdir", path)
        self.check(self.lib.ceph_mkdir(self.cmount, path, mode), path)

    def rmdir(self, path: bytes) -> None:
        self.begin("rmdir", path)
        self.check(self.lib.ceph_rmdir(self.cmount, path), path)

    def unlink(self, path: bytes) -> None:
        self.begin("unlink", path)
        self.check(self.lib.ceph_unlink(self.cmount, path), path)

    def rename(self, source: bytes, destination: bytes) -> None:
        self.begin("rename", source)
        self.check(self.lib.ceph_rename(self.cmount, source, destination), source)

    def listdir(self, path: bytes) -> list[bytes]:
        directory = ctypes.c_void_p()
        self.begin("list", path)
        self.check(self.lib.ceph_opendir(self.cmount, path, ctypes.byref(directory)), path)
        names = []
        try:
            while True:
                self.begin("list", path)
                entry = self.lib.ceph_readdir(self.cmount, directory)
                self.calling = None
                if not entry:
                    break
                name = entry.contents.name
                if name not in (b".", b".."):
                    names.append(name)
        finally:
            self.begin("list", path)
            self.lib.ceph_closedir(self.cmount, directory)
            self.calling = None
        return names

    def getxattr(self, path: bytes, name: str) -> bytes:
        """An extended attribute's value (CephFS's virtual ones: ceph.dir.layout.*,
        ceph.file.layout); OSError of ENODATA where it is not set."""
        value = ctypes.create_string_buffer(XATTR_BYTES)
        self.begin("getxattr", path)
        size = self.check(self.lib.ceph_getxattr(self.cmount, path, name.encode(), value,
                                                 XATTR_BYTES), path)
        return value.raw[:size]

    def setxattr(self, path: bytes, name: str, value: bytes) -> None:
        self.begin("setxattr", path)
        self.check(self.lib.ceph_setxattr(self.cmount, path, name.encode(), value, len(value),
                                          0), path)

    def mds_command(self, mds_spec: str, command: dict[str, object]) -> str:
        """A command to an MDS over the wire (what `ceph tell mds.X ...` sends): its
        output; OSError when the MDS refuses it or none answers."""
        argument = ctypes.c_char_p(json.dumps(command).encode())
        out, out_len = ctypes.c_void_p(), ctypes.c_size_t()
        status, status_len = ctypes.c_void_p(), ctypes.c_size_t()
        code = self.lib.ceph_mds_command(
            self.cmount, mds_spec.encode(), ctypes.byref(argument), 1, None, 0,
            ctypes.byref(out), ctypes.byref(out_len), ctypes.byref(status),
            ctypes.byref(status_len))
        try:
            text = ctypes.string_at(out.value, out_len.value).decode(errors="replace") \
                if out.value else ""
            said = ctypes.string_at(status.value, status_len.value).decode(errors="replace") \
                if status.value else ""
        finally:
            for buffer in (out, status):
                if buffer.value:
                    self.lib.ceph_buffer_free(buffer)
        if code < 0:
            number = -code
            raise ERROR_CLASSES.get(number, OSError)(
                number, f"{os.strerror(number)}{f' ({said})' if said else ''}",
                f"mds {mds_spec}: {command.get('prefix')}")
        return text


# --- the watchdog: one thread per process over every bounded mount ----------------------

_now = time.monotonic
_watched: weakref.WeakSet[Mount] = weakref.WeakSet()
_watching = threading.Lock()
_watchdog: list[threading.Thread] = []


def _watch(mount: Mount) -> None:
    with _watching:
        _watched.add(mount)
        if not _watchdog:
            thread = threading.Thread(target=_look, name="stampede-cephfs-watchdog", daemon=True)
            _watchdog.append(thread)
            thread.start()


def _look() -> None:
    while True:
        time.sleep(WATCH_PERIOD_S)
        for mount in list(_watched):
            calling, bound = mount.calling, mount.timeout_s
            if callable(calling):   # the compiled metadata loop's progress (stampede.oploop)
                calling = calling()
            if calling is None or bound is None:
                continue
            what, path, since = calling
            if _now() - since > bound * (UNMOUNT_FACTOR if what == "unmount" else 1):
                _give_up(mount, what, path, bound)


# A call that moves a file's bytes waits on the OSDs holding its objects (and on the MDS
# for the file's capabilities: an fsync's size and times go to it); any other, on the MDS.
DATA_CALLS = frozenset({"read", "write", "fsync"})


def no_answer_line(rank: int | str, what: str, path: bytes, bound_s: float, monitors: str) -> str:
    """The one line a rank leaves when a call of `what` had no answer within its bound,
    naming the daemons the call waits on and the command that says which are down."""
    on = f" {path.decode(errors='replace')}" if path else ""
    who = ("the OSDs that hold its objects are not answering, or the MDS that grants its "
           f"capabilities (monitors {monitors or '?'}; `ceph -s` says which are down)"
           if what in DATA_CALLS else
           f"the MDS is not answering (monitors {monitors or '?'}; `ceph fs status` says "
           "whether one is active)")
    return (f"stampede: error: rank {rank}: CephFS {what}{on} had no answer within "
            f"{bound_s:g} s (target.storage_options.timeout_s): {who}; this rank ends here, "
            "what was archived before stays\n")


def _give_up(mount: Mount, what: str, path: bytes, bound: float) -> None:
    """One line, then the process ends (its thread is blocked in the library for good:
    nothing else could end it)."""
    line = no_answer_line(launcher_rank(), what, path, bound, mount.monitors)
    try:
        os.write(2, line.encode())
    finally:
        os._exit(GAVE_UP_STATUS)
