"""`prepare`: every rank writes its part of the checkpoint in parallel, then a manifest.

shared: rank 0 creates the one file at its full size, then each rank writes its slice at
its offset; sharded: each rank creates and writes its own file. Every rank fsyncs, hashes
what it wrote (SHA-256 per slice) and rank 0 records it all in the manifest.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from stampede import mpi
from stampede.buffers import AlignedBuffer
from stampede.content import ContentSource
from stampede.errors import CheckpointError
from stampede.manifest import MANIFEST_NAME, layout_entry, new_manifest, read_manifest, write_manifest
from stampede.plan import (
    SHARED_FILE,
    Extent,
    bytes_per_rank,
    checkpoint_files,
    shard_count,
    writes_of_rank,
)
from stampede.progress import progress_bar
from stampede.spec import JobSpec

# Files are created without world access: checkpoints can hold other people's models.
FILE_MODE = 0o640
DIR_MODE = 0o750


def _check_target(spec: JobSpec) -> dict[str, Any]:
    """Rank 0: the job fits the rank count, the target exists (or is created) and is ours
    to write into."""
    root = Path(spec.target_path)
    if root.is_symlink():
        raise CheckpointError(f"target.path = {spec.target_path!r} is a symbolic link",
                              hint="give the real directory")
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"target.path = {spec.target_path!r} is not a directory")
    try:
        root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointError(f"target.path = {spec.target_path!r}: cannot create it "
                              f"({error.strerror})") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise CheckpointError(f"target.path = {spec.target_path!r} is not writable")
    manifest = read_manifest(root)
    if manifest is None and any(root.iterdir()):
        raise CheckpointError(
            f"target.path = {spec.target_path!r} is not empty and was not prepared by stampede"
            f" (no {MANIFEST_NAME})", hint="give an empty or new directory")
    return manifest or new_manifest()


def _create_files(spec: JobSpec, layout: str, nranks: int, manifest: dict[str, Any]) -> None:
    """Rank 0: directories, and the shared file at its full size before ranks write into it.

    Files of an earlier prepare of this layout that no layout needs any more (shards of
    another rank count) are removed: they were ours, and the manifest is about to forget
    them.
    """
    root = Path(spec.target_path)
    files = checkpoint_files(spec, layout, nranks)
    keep = {relpath for relpath, _ in files} | {
        record["path"] for name, entry in manifest["layouts"].items() if name != layout
        for record in entry["files"]}
    for record in manifest["layouts"].get(layout, {}).get("files", []):
        if record["path"] not in keep:
            (root / record["path"]).unlink(missing_ok=True)
    for relpath, size in files:
        (root / relpath).parent.mkdir(mode=DIR_MODE, exist_ok=True)
        if relpath == SHARED_FILE:
            fd = os.open(root / relpath, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)


class _Writer:
    """One rank's writes: deterministic content, block by block, fsynced, hashed.

    Several layouts share files (the shard files); each extent is written once per
    prepare and its record reused.
    """

    def __init__(self, spec: JobSpec, rank: int) -> None:
        self.spec, self.rank = spec, rank
        self.root = Path(spec.target_path)
        self.content = ContentSource(spec.block_bytes)
        self.written: dict[Extent, dict[str, Any]] = {}

    def write(self, extents: tuple[Extent, ...], advance: Callable[[int], None]) -> list[dict[str, Any]]:
        with AlignedBuffer(self.spec.block_bytes) as buffer:
            for extent in extents:
                if extent not in self.written:
                    self.written[extent] = self._write_extent(extent, buffer, advance)
        return [self.written[extent] for extent in extents]

    def _write_extent(self, extent: Extent, buffer: AlignedBuffer,
                      advance: Callable[[int], None]) -> dict[str, Any]:
        # A file one rank writes whole is truncated (what an earlier prepare left); the
        # shared file was sized by rank 0 and must not be truncated by the ranks writing it.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
        flags |= 0 if extent.relpath == SHARED_FILE else os.O_TRUNC
        digest = hashlib.sha256()
        fd = os.open(self.root / extent.relpath, flags, FILE_MODE)
        try:
            for offset, length in extent.blocks(self.spec.block_bytes):
                view = buffer.prefix(length)
                self.content.fill(view, extent.relpath, offset)
                if os.pwritev(fd, (view,), offset) != length:
                    raise OSError(f"short write to {extent.relpath} at {offset}")
                digest.update(view)
                advance(length)
            os.fsync(fd)
        finally:
            os.close(fd)
        return {"rank": self.rank, "path": extent.relpath, "offset": extent.offset,
                "length": extent.length, "sha256": digest.hexdigest()}


def prepare(comm: Any, spec: JobSpec, show_progress: bool = True) -> dict[str, Any]:
    """Write every layout of the job; returns the manifest (on every rank)."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    mpi.on_root(comm, "checking the job", partial(bytes_per_rank, spec, nranks))
    manifest = mpi.on_root(comm, "checking the target", partial(_check_target, spec))
    writer = _Writer(spec, rank)
    for layout in spec.layouts:
        per_rank = bytes_per_rank(spec, nranks)
        extents = writes_of_rank(spec, layout, nranks, rank)
        mpi.on_root(comm, f"creating the {layout} files",
                    partial(_create_files, spec, layout, nranks, manifest))
        # Rank 0 stands for all in the progress bar: the writers go at about the same pace.
        total = sum(extent.length for extent in extents) * min(nranks, shard_count(spec, nranks))
        with progress_bar(total, f"prepare {layout}", show_progress and rank == 0) as bar:
            advance = partial(_scaled, bar, total / max(sum(e.length for e in extents), 1))
            slices = mpi.collective(comm, f"writing the {layout} checkpoint",
                                    partial(writer.write, extents, advance))
        everyone = mpi.gather(comm, slices)
        if rank == 0:
            assert everyone is not None
            files = list(checkpoint_files(spec, layout, nranks))
            manifest["layouts"][layout] = layout_entry(
                spec, layout, nranks, per_rank, files, [s for part in everyone for s in part])
            write_manifest(spec.target_path, manifest)
    result: dict[str, Any] = mpi.bcast(comm, manifest)
    return result


def _scaled(advance: Callable[[int], None], factor: float, nbytes: int) -> None:
    advance(int(nbytes * factor))
