"""Checkpoints of single-file PyTorch serialisers, catalogued from their containers alone
(no pickle is run, torch is not imported):

- torch (`*.bin`, `*.pt`, `*.pth`): what `torch.save` writes, a zip archive (stored, not
  compressed) holding the pickle `<archive>/data.pkl` and one record `<archive>/data/<key>`
  per storage. Each storage record is a saved item: its bytes at their file offset (from
  the zip's central directory and the record's local header), read whole or in byte
  slices, as DCP items are. Which tensors view a storage is in the pickle, not read here.
  A legacy (non-zip) torch pickle is refused.
- tensorizer (`*.tensors`): CoreWeave tensorizer's files, taken whole: one item per file
  (its headers and tensors together), since stampede does not parse tensorizer's headers.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable

from stampede.errors import CheckpointError
from stampede.existing.catalogue import Catalogue, Location, TensorInfo, make_catalogue

TORCH_SUFFIXES = (".bin", ".pt", ".pth")
TENSORIZER_SUFFIX = ".tensors"
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")   # a zip local file header, 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"


class _Reader(io.RawIOBase):
    """A seekable file over ranged reads of one opened file (Location.opened): zipfile
    parses the central directory through the backend (a few reads of the file's end), as
    it would through open()."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, base: int = 0) -> None:
        self.read_range, self.size, self.position = read, size, 0
        self.base = base   # where the archive starts in the file (a DCP item: its offset)

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(base + offset, 0)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        length = min(len(buffer), max(self.size - self.position, 0))
        if length == 0:
            return 0
        data = self.read_range(self.base + self.position, length)
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def scan_torch(location: Location, relpaths: list[str]) -> Catalogue:
    """Every storage record of each torch.save zip, as a saved item of its file."""
    files, tensors = [], []
    for relpath in relpaths:
        size = _size(location, relpath)
        files.append((relpath, size))
        tensors.extend(_storages(location, relpath, size))
    return make_catalogue(location.root, "torch", files, tensors, "", 0)


def scan_tensorizer(location: Location, relpaths: list[str]) -> Catalogue:
    """Each tensorizer file as one item, whole."""
    files = [(relpath, _size(location, relpath)) for relpath in relpaths]
    return make_catalogue(location.root, "tensorizer", files,
                          [TensorInfo(relpath, relpath, "", (), size, 0)
                           for relpath, size in files], "", 0)


def _size(location: Location, relpath: str) -> int:
    try:
        return location.size(relpath)
    except OSError as error:
        raise CheckpointError(f"{location.where(relpath)}: {error.strerror or error}") from None


def _storages(location: Location, relpath: str, size: int) -> list[TensorInfo]:
    where = location.where(relpath)
    with location.opened(relpath) as (read, _):
        return _records(read, where, relpath, size)


def _records(read: Callable[[int, int], bytes], where: str, relpath: str, size: int
             ) -> list[TensorInfo]:
    try:
        with zipfile.ZipFile(io.BufferedReader(_Reader(read, size))) as archive:
            records = [info for info in archive.infolist()
                       if info.filename.partition("/")[2].startswith("data/")]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as error:
        raise CheckpointError(f"{where}: not a torch.save zip archive ({error}): a legacy "
                              "torch pickle, or no torch file at all, is a format stampede "
                              "does not read", hint="save it again with torch.save (the zip "
                              "format, torch >= 1.6), or as safetensors") from None
    found = []
    for info in records:
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{where}: storage {info.filename} is compressed: torch.save "
                                  "stores its records uncompressed; this file was rewritten")
        offset = _data_offset(read, where, info)
        if offset + info.file_size > size:
            raise CheckpointError(f"{where}: storage {info.filename} ends at byte "
                                  f"{offset + info.file_size}, the file has {size}: truncated?")
        found.append(TensorInfo(info.filename.partition("/")[2], relpath, "", (),
                                info.file_size, offset))
    if not found:
        raise CheckpointError(f"{where}: a zip archive without torch storages "
                              "(<archive>/data/<key>): not a torch.save checkpoint")
    return found


def record_in(read: Callable[[int, int], bytes], where: str, base: int, length: int
              ) -> tuple[int, int] | None:
    """A DCP item saved by torch.save (bytes base..base+length of the file): where its one
    storage record's bytes start in the file, and how many; None when the item is not a
    zip holding exactly one stored record (it is then only read whole). A few small reads:
    the zip's end, its central directory, the record's local header."""
    read = _with_tail(read, base, length)
    try:
        with zipfile.ZipFile(io.BufferedReader(_Reader(read, length, base))) as archive:
            records = [info for info in archive.infolist()
                       if info.filename.partition("/")[2].startswith("data/")]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        return None
    if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED:
        return None
    info = records[0]
    start = _data_offset(read, where, info, base)
    return (start, info.file_size) if start + info.file_size <= base + length else None


# A zip's end record, its comment (at most 64 KiB) and a torch.save item's central
# directory (a handful of names) lie in its last TAIL_BYTES: read once, not in the few
# small reads zipfile makes (each a request on an object store); an item this small is
# read whole with it, local header included.
TAIL_BYTES = 64 * 1024 + 22


def _with_tail(read: Callable[[int, int], bytes], base: int, length: int
               ) -> Callable[[int, int], bytes]:
    """`read` over bytes base..base+length, its last TAIL_BYTES fetched once on first use
    and every read inside them served from it."""
    start = base + max(length - TAIL_BYTES, 0)
    tail: list[bytes] = []

    def cached(offset: int, count: int) -> bytes:
        if offset < start or offset + count > base + length:
            return read(offset, count)
        if not tail:
            tail.append(read(start, base + length - start))
        return tail[0][offset - start:offset - start + count]
    return cached


def _data_offset(read: Callable[[int, int], bytes], where: str, info: zipfile.ZipInfo,
                 base: int = 0) -> int:
    """Where a record's bytes start: after its local header, whose extra field (torch pads
    records to 64-byte boundaries with it) may differ from the central directory's."""
    header = read(base + info.header_offset, _LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise CheckpointError(f"{where}: {info.filename}: no zip local "
                              f"header at byte {info.header_offset}: corrupt?")
    fields = _LOCAL_HEADER.unpack(header)
    name_length, extra_length = fields[-2], fields[-1]
    return base + info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
