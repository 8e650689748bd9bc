"""libnfs (the user-space NFS client distributions package: Debian's libnfs13) through
ctypes: one context per client, its synchronous calls, each error an OSError.

libnfs returns -errno; the message of the context (nfs_get_error) is added where it says
more. Reads and writes go straight from and to the caller's buffer (its address, no
copy). The calls are the library's 4.0 signatures (nfs_pread(nfs, fh, offset, count,
buf)); a library without them is refused when loaded, with the install hint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import os
import socket
import uuid

from stampede.clibrary import Prototypes, load
from stampede.errors import UsageError

INSTALL_HINT = "apt-get install libnfs13 (Debian/Ubuntu; libnfs on RHEL: dnf install libnfs)"
LIBRARY_NAMES = ("libnfs.so.13", "libnfs.so.14", "libnfs.so")


class Stat64(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


class Url(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


class Dirent(ctypes.Structure):
    pass


Dirent._fields_ = [("next", ctypes.POINTER(Dirent)), ("name", ctypes.c_char_p)]

_lib: ctypes.CDLL | None = None
_CONTEXTS = itertools.count()


def library() -> ctypes.CDLL:
    """The loaded libnfs with its prototypes (once per process); UsageError where none."""
    global _lib
    if _lib is not None:
        return _lib
    found = ctypes.util.find_library("nfs")
    p, i, u64, s = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_char_p
    fh = ctypes.POINTER(ctypes.c_void_p)
    prototypes: Prototypes = {
        "nfs_init_context": (p, []), "nfs_destroy_context": (None, [p]),
        "nfs_get_error": (s, [p]), "nfs_set_timeout": (None, [p, i]),
        "nfs_set_version": (i, [p, i]), "nfs_set_autoreconnect": (None, [p, i]),
        "nfs_set_dircache": (None, [p, i]), "nfs_set_pagecache": (None, [p, ctypes.c_uint32]),
        "nfs_set_readahead": (None, [p, ctypes.c_uint32]),
        "nfs4_set_client_name": (None, [p, s]), "nfs4_set_verifier": (None, [p, s]),
        "nfs_parse_url_dir": (ctypes.POINTER(Url), [p, s]),
        "nfs_destroy_url": (None, [ctypes.POINTER(Url)]), "nfs_mount": (i, [p, s, s]),
        "nfs_umount": (i, [p]), "nfs_get_readmax": (u64, [p]), "nfs_get_writemax": (u64, [p]),
        "nfs_stat64": (i, [p, s, ctypes.POINTER(Stat64)]),
        "nfs_fstat64": (i, [p, p, ctypes.POINTER(Stat64)]),
        "nfs_open": (i, [p, s, i, fh]), "nfs_create": (i, [p, s, i, i, fh]),
        "nfs_close": (i, [p, p]), "nfs_pread": (i, [p, p, u64, u64, p]),
        "nfs_pwrite": (i, [p, p, u64, u64, p]), "nfs_fsync": (i, [p, p]),
        "nfs_mkdir2": (i, [p, s, i]), "nfs_rmdir": (i, [p, s]), "nfs_unlink": (i, [p, s]),
        "nfs_rename": (i, [p, s, s]), "nfs_opendir": (i, [p, s, fh]),
        "nfs_readdir": (ctypes.POINTER(Dirent), [p, p]), "nfs_closedir": (None, [p, p]),
    }
    lib = load((*LIBRARY_NAMES, *([found] if found else [])), prototypes,
               "nfs:// targets need libnfs, the user-space NFS client, and it is not installed",
               "libnfs 4 or 5", INSTALL_HINT)
    _lib = lib
    return lib


def failed(nfs: int, code: int, what: str) -> OSError:
    """An OSError for libnfs's -errno `code`, with the context's message."""
    number = -code if code < 0 else errno.EIO
    detail = library().nfs_get_error(nfs)
    if number == errno.EINTR:
        # libnfs's synchronous calls end an RPC its timeout ran out on with EINTR
        # ("Interrupted system call", whatever the context's message says by then; a
        # failed poll is EIO): a hung server is said as what it is
        number, detail = errno.ETIMEDOUT, (b"no answer from the NFS server within "
                                           b"target.storage_options.timeout_ms")
    message = os.strerror(number) + (f" ({detail.decode(errors='replace')})" if detail else "")
    error_class = {errno.ENOENT: FileNotFoundError, errno.EEXIST: FileExistsError,
                   errno.EACCES: PermissionError, errno.EPERM: PermissionError,
                   errno.ENOTDIR: NotADirectoryError, errno.EISDIR: IsADirectoryError,
                   errno.ETIMEDOUT: TimeoutError}.get(number, OSError)
    return error_class(number, message, what)


class Client:
    """One NFS client (a libnfs context) mounted on one export: every call synchronous,
    paths absolute within the export ("/dir/file"). Not thread-safe: one per rank."""

    def __init__(self, url: str, timeout_ms: int) -> None:
        lib = library()
        self.lib = lib
        self.nfs = lib.nfs_init_context()
        if not self.nfs:
            raise OSError(errno.ENOMEM, "libnfs could not create a context")
        lib.nfs_set_timeout(self.nfs, timeout_ms)
        lib.nfs_set_autoreconnect(self.nfs, 0)   # a dead server is an error, not a wait
        # none of libnfs's caches: every op is its RPCs (the directory cache is on by default)
        lib.nfs_set_dircache(self.nfs, 0)
        lib.nfs_set_pagecache(self.nfs, 0)
        lib.nfs_set_readahead(self.nfs, 0)
        # an NFSv4 client of its own: two contexts of one process under one name are one
        # client to the server, and the second's SETCLIENTID expires the first's state
        name = f"stampede-{socket.gethostname()}-{os.getpid()}-{next(_CONTEXTS)}"
        lib.nfs4_set_client_name(self.nfs, name.encode())
        lib.nfs4_set_verifier(self.nfs, uuid.uuid4().hex[:8].encode())
        parsed = lib.nfs_parse_url_dir(self.nfs, url.encode())
        if not parsed:
            message = (lib.nfs_get_error(self.nfs) or b"").decode(errors="replace")
            self.destroy()
            raise UsageError(f"target.path = {url!r}: libnfs cannot parse it ({message})")
        try:
            server, export = parsed.contents.server, parsed.contents.path
            code = lib.nfs_mount(self.nfs, server, export)
            if code < 0:
                raise failed(self.nfs, code, f"mount {server.decode()}:{export.decode()}")
            self.server, self.export = server.decode(), export.decode()
        except BaseException:
            lib.nfs_destroy_url(parsed)
            self.destroy()
            raise
        lib.nfs_destroy_url(parsed)
        self.readmax = int(lib.nfs_get_readmax(self.nfs))
        self.writemax = int(lib.nfs_get_writemax(self.nfs))

    def destroy(self) -> None:
        if self.nfs:
            self.lib.nfs_destroy_context(self.nfs)
            self.nfs = None

    def check(self, code: int, what: bytes) -> int:
        if code < 0:
            raise failed(self.nfs, code, what.decode(errors="replace"))
        return code

    def stat(self, path: bytes) -> Stat64:
        found = Stat64()
        self.check(self.lib.nfs_stat64(self.nfs, path, ctypes.byref(found)), path)
        return found

    def fstat_size(self, handle: int) -> int:
        found = Stat64()
        self.check(self.lib.nfs_fstat64(self.nfs, handle, ctypes.byref(found)), b"fstat")
        return int(found.size)

    def open(self, path: bytes, flags: int) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.nfs_open(self.nfs, path, flags, ctypes.byref(handle)), path)
        return handle.value or 0

    def create(self, path: bytes, flags: int, mode: int) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.nfs_create(self.nfs, path, flags, mode, ctypes.byref(handle)), path)
        return handle.value or 0

    def close(self, handle: int) -> None:
        self.check(self.lib.nfs_close(self.nfs, handle), b"close")

    def pread(self, handle: int, address: int, count: int, offset: int) -> int:
        return self.check(self.lib.nfs_pread(self.nfs, handle, offset, count, address), b"read")

    def pwrite(self, handle: int, address: int, count: int, offset: int) -> int:
        return self.check(self.lib.nfs_pwrite(self.nfs, handle, offset, count, address), b"write")

    def fsync(self, handle: int) -> None:
        self.check(self.lib.nfs_fsync(self.nfs, handle), b"fsync")

    def mkdir(self, path: bytes, mode: int) -> None:
        self.check(self.lib.nfs_mkdir2(self.nfs, path, mode), path)

    def rmdir(self, path: bytes) -> None:
        self.check(self.lib.nfs_rmdir(self.nfs, path), path)

    def unlink(self, path: bytes) -> None:
        self.check(self.lib.nfs_unlink(self.nfs, path), path)

    def rename(self, source: bytes, destination: bytes) -> None:
        self.check(self.lib.nfs_rename(self.nfs, source, destination), source)

    def listdir(self, path: bytes) -> list[bytes]:
        directory = ctypes.c_void_p()
        self.check(self.lib.nfs_opendir(self.nfs, path, ctypes.byref(directory)), path)
        names = []
        try:
            while True:
                entry = self.lib.nfs_readdir(self.nfs, directory)
                if not entry:
                    break
                name = entry.contents.name
                if name not in (b".", b".."):
                    names.append(name)
        finally:
            self.lib.nfs_closedir(self.nfs, directory)
        return names
