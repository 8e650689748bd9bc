"""A pass-through FUSE file system that fails chosen requests, for fault tests.

    python tests/faultfs.py BACKING MOUNTPOINT [--fail-read SUBSTRING] [--fail-open SUBSTRING]

Files whose path contains --fail-read answer every read with EIO (a disk or network
error); those matching --fail-open refuse open with EACCES (which root cannot bypass,
unlike file modes). Everything else passes through to BACKING. Read-only: the run's
restore is what is under test. Runs in the foreground until unmounted.
"""

from __future__ import annotations

import argparse
import errno
import os

from fuse import FUSE, FuseOSError, Operations

STAT_FIELDS = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime", "st_mtime",
               "st_ctime")


class FaultFS(Operations):  # type: ignore[misc]
    def __init__(self, backing: str, fail_read: str, fail_open: str) -> None:
        self.backing, self.fail_read, self.fail_open = backing, fail_read, fail_open

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def getattr(self, path: str, fh: int | None = None) -> dict[str, float]:
        try:
            status = os.lstat(self._real(path))
        except OSError as error:
            raise FuseOSError(error.errno) from None
        return {field: getattr(status, field) for field in STAT_FIELDS}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def open(self, path: str, flags: int) -> int:
        if self.fail_open and self.fail_open in path:
            raise FuseOSError(errno.EACCES)
        return os.open(self._real(path), os.O_RDONLY)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if self.fail_read and self.fail_read in path:
            raise FuseOSError(errno.EIO)
        return os.pread(fh, size, offset)

    def release(self, path: str, fh: int) -> None:
        os.close(fh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--fail-read", default="")
    parser.add_argument("--fail-open", default="")
    args = parser.parse_args()
    FUSE(FaultFS(args.backing, args.fail_read, args.fail_open), args.mountpoint,
         foreground=True, nothreads=False, ro=True, allow_other=True)


if __name__ == "__main__":
    main()
