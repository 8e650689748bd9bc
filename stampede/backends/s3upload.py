"""prepare's uploads to S3: an object written front to back through stampede's own
client (stampede.backends.s3), untimed, its retries counted nowhere. An object shorter
than a block (storage option block_size, default 16 MiB) is one PUT; a longer one a
multipart upload whose parts are cut as s3fs, prepare's writer once, cut them, so the
parts an archive's prepare made stay the parts it makes.

The upload's types are here, below the client: Upload (the handle S3Backend's multipart
requests pass around) and UploadClient (the requests a Streamed sends, which S3Backend
serves), so stampede.backends.s3 imports this module and nothing here imports it."""

from __future__ import annotations

import builtins
from typing import NamedTuple, Protocol

MAX_PART_BYTES = 5 * 2**30   # S3's largest part


class Upload(NamedTuple):
    """A multipart upload in progress: the object it makes and its UploadId."""

    bucket: str
    key: str
    upload_id: str


class UploadClient(Protocol):
    """The S3 requests an upload is made of (stampede.backends.s3.S3Backend's); `op` is
    the op their retries are counted under ("": nowhere)."""

    write_block_bytes: int

    def start_upload(self, path: str, op: str) -> Upload: ...

    def upload_part(self, upload: Upload, number: int, views: tuple[memoryview, ...],
                    op: str) -> str: ...

    def complete_upload(self, upload: Upload, parts: builtins.list[tuple[int, str]],
                        op: str) -> None: ...

    def abort_upload(self, upload: Upload) -> None: ...

    def put_object(self, path: str, views: tuple[memoryview, ...], op: str) -> None: ...


class Streamed:
    """One object's upload: each time a block or more is buffered, it goes as parts
    (part_bounds); at close what is left is the last part, or the whole object's one PUT
    if no part went."""

    def __init__(self, backend: UploadClient, path: str) -> None:
        self.backend, self.path = backend, path
        self.buffered = bytearray()
        self.upload: Upload | None = None
        self.parts: list[tuple[int, str]] = []

    def write(self, view: memoryview) -> None:
        self.buffered += view   # copied: the caller refills its buffer once this returns
        if len(self.buffered) >= self.backend.write_block_bytes:
            self._send_parts()

    def _send_parts(self) -> None:
        backend = self.backend
        if self.upload is None:
            self.upload = backend.start_upload(self.path, op="")
        with memoryview(self.buffered) as whole:
            for start, end in part_bounds(len(whole), backend.write_block_bytes):
                number = len(self.parts) + 1
                with whole[start:end] as part:
                    self.parts.append((number, backend.upload_part(self.upload, number, (part,),
                                                                   op="")))
        self.buffered = bytearray()

    def close(self) -> None:
        """The object made whole: its one PUT, or its last part and the completion."""
        if self.upload is None:
            with memoryview(self.buffered) as whole:
                self.backend.put_object(self.path, (whole,), op="")
            return
        if self.buffered:
            self._send_parts()
        self.backend.complete_upload(self.upload, self.parts, op="")

    def abort(self) -> None:
        """Nothing of the object committed: its upload, if one was started, aborted."""
        self.buffered = bytearray()
        if self.upload is not None:
            self.backend.abort_upload(self.upload)


def part_bounds(size_bytes: int, block_bytes: int) -> list[tuple[int, int]]:
    """(start, end) of the parts `size_bytes` buffered are sent as: parts of a block, the
    short rest joined to the last one, that last one cut in two halves if over S3's
    largest part; fewer bytes than a block (the object's end) are one part."""
    count = max(size_bytes // block_bytes, 1)
    starts = [index * block_bytes for index in range(count)]
    bounds = list(zip(starts, starts[1:] + [size_bytes], strict=True))
    last_start, last_end = bounds[-1]
    joined = size_bytes > block_bytes and size_bytes % block_bytes
    if joined and last_end - last_start > MAX_PART_BYTES:
        middle = last_start + (last_end - last_start) // 2
        bounds[-1:] = [(last_start, middle), (middle, last_end)]
    return bounds
