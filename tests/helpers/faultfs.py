"""A pass-through FUSE file system that fails chosen requests, for fault tests.

    python tests/helpers/faultfs.py BACKING MOUNTPOINT [--fail-read SUBSTRING]
        [--fail-open SUBSTRING] [--fail-write SUBSTRING --write-errno ENOSPC
        --write-after BYTES] [--corrupt-write SUBSTRING --corrupt-at OFFSET]

Files whose path contains --fail-read answer every read with EIO (a disk or network
error); those matching --fail-open refuse open with EACCES (which root cannot bypass,
unlike file modes); writes to files matching --fail-write fail with --write-errno
(ENOSPC: a full disk; EIO) once --write-after bytes have been written to them in all (a
disk that fills up mid-write: the write that would pass the limit fails, and every one
after it, whatever the size of FUSE's write requests); a write to a file matching
--corrupt-write that covers file offset --corrupt-at lands with that byte flipped (a
device that corrupts silently).
Everything else passes through to BACKING, writes, renames and removals included. Runs
in the foreground until unmounted.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading

from stampede.emulate.mds import load_fuse

STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns",
               "st_mtime_ns", "st_ctime_ns")
STATVFS_FIELDS = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                  "f_ffree", "f_favail", "f_flag", "f_namemax")


class FaultFS:
    """mfusepy operations (each request calls the method of its name; an OSError becomes
    its errno, an injected fault included)."""

    use_ns = True   # times in nanoseconds (st_*time_ns)

    def __init__(self, backing: str, options: argparse.Namespace) -> None:
        self.backing, self.options = backing, options
        self.written = 0
        self.full = False
        self.guard = threading.Lock()   # not `lock`: that name is a FUSE operation

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # --- metadata ---------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        status = os.lstat(self._real(path))
        return {field.removesuffix("_ns"): getattr(status, field) for field in STAT_FIELDS}

    def statfs(self, path: str) -> dict[str, int]:
        status = os.statvfs(self._real(path))
        return {field: getattr(status, field) for field in STATVFS_FIELDS}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def mkdir(self, path: str, mode: int) -> None:
        os.mkdir(self._real(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))

    def rename(self, old: str, new: str) -> None:
        os.rename(self._real(old), self._real(new))

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> None:
        os.utime(self._real(path), ns=times) if times is not None else os.utime(self._real(path))

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        os.truncate(self._real(path), length)

    # --- data -------------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        if self.options.fail_open and self.options.fail_open in path:
            raise fault(errno.EACCES)
        return os.open(self._real(path), flags & ~os.O_DIRECT)

    def create(self, path: str, mode: int, fi: object = None) -> int:
        return os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if self.options.fail_read and self.options.fail_read in path:
            raise fault(errno.EIO)
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        options = self.options
        if options.fail_write and options.fail_write in path:
            with self.guard:
                if self.full or self.written + len(data) > options.write_after:
                    self.full = True   # and stays full: a later, smaller write fails too
                    raise fault(getattr(errno, options.write_errno))
                self.written += len(data)
        if options.corrupt_write and options.corrupt_write in path \
                and offset <= options.corrupt_at < offset + len(data):
            flipped = bytearray(data)
            flipped[options.corrupt_at - offset] ^= 0xFF
            data = bytes(flipped)
        return os.pwrite(fh, data, offset)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        os.fsync(fh)

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        os.close(fh)


def fault(number: int) -> OSError:
    return OSError(number, os.strerror(number))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--fail-read", default="")
    parser.add_argument("--fail-open", default="")
    parser.add_argument("--fail-write", default="")
    parser.add_argument("--write-errno", default="ENOSPC", choices=("ENOSPC", "EIO", "EDQUOT"))
    parser.add_argument("--write-after", type=int, default=0)
    parser.add_argument("--corrupt-write", default="")
    parser.add_argument("--corrupt-at", type=int, default=0)
    options = parser.parse_args()
    load_fuse().FUSE(FaultFS(options.backing, options), options.mountpoint, foreground=True,
                     nothreads=False, allow_other=True)


if __name__ == "__main__":
    main()
