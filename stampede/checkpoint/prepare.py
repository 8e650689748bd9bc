"""`prepare`: every rank writes its part of the checkpoint in parallel, then a manifest.

shared: rank 0 creates the one file at its full size (with its header, in a formatted
file), then each rank writes its slice at its offset; sharded: each rank creates and
writes its own file. Every rank fsyncs, hashes what it wrote (SHA-256 and XXH3-128 per
slice) and rank 0 records it all in the manifest.
"""

from __future__ import annotations

import hashlib
import os
import resource
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

from stampede import mpi
from stampede.backends import open_backend
from stampede.backends.base import Backend, Writer, missing_root
from stampede.backends.posix import DIR_MODE, FILE_MODE
from stampede.buffers import AlignedBuffer
from stampede.checkpoint import versions
from stampede.checkpoint.content import ContentSource, CopiedContent, content_label
from stampede.checkpoint.formats import create_file, safetensors_prefix
from stampede.checkpoint.lock import LOCK_NAME, TargetLock, writer_lock
from stampede.checkpoint.manifest import (
    MANIFEST_NAME,
    layout_entry,
    new_manifest,
    read_manifest,
    write_manifest,
)
from stampede.checkpoint.plan import (
    Extent,
    bytes_per_rank,
    checkpoint_files,
    file_tensors,
    shared_path,
    writes_of_rank,
)
from stampede.errors import CheckpointError, StampedeError, UsageError
from stampede.filesystems import backend_striping, stripe, stripe_in
from stampede.spec import JobSpec
from stampede.targets import capabilities_for
from stampede.units import BYTES_PER_MIB, format_bytes

# A progress line: (total bytes, description, enabled) -> a context yielding advance(nbytes)
ProgressBar = Callable[[int, str, bool], AbstractContextManager[Callable[[int], None]]]


@contextmanager
def _silent(total: int, description: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    yield lambda nbytes: None


def _check_target(spec: JobSpec, backend: Backend, nranks: int,
                  lock: TargetLock) -> dict[str, Any]:
    """Rank 0, the target's lock held: the target exists (or is created) and is ours to
    write into; a refusal gives back what the lock made."""
    try:
        return _checked_target(spec, backend, nranks, lock.created_root)
    except StampedeError:      # refused, or the storage failed reading what is there
        lock.abandon()
        raise


def _checked_target(spec: JobSpec, backend: Backend, nranks: int,
                    created_root: bool) -> dict[str, object]:
    if backend.capabilities.local_files:
        root = Path(spec.target_path)
        if root.is_symlink():
            raise CheckpointError(f"target.path = {spec.target_path!r} is a symbolic link",
                                  hint="give the real directory")
        if root.exists() and not root.is_dir():
            raise CheckpointError(f"target.path = {spec.target_path!r} is not a directory")
    space = space_needed(spec, nranks)   # before anything is created, the root included
    if space.free_bytes is not None and not space.fits:
        raise CheckpointError(f"target.path = {spec.target_path!r}: {space.describe()}",
                              hint="a smaller checkpoint.size, or another target.path")
    created_root = created_root or missing_root(backend)
    try:
        backend.ensure_root()
    except OSError as error:
        raise CheckpointError(f"target.path = {spec.target_path!r}: cannot create it "
                              f"({error.strerror or error})") from None
    if backend.capabilities.local_files and not os.access(spec.target_path, os.W_OK | os.X_OK):
        raise CheckpointError(f"target.path = {spec.target_path!r} is not writable")
    manifest = read_manifest(backend, spec.target_path)
    names = [name for name in backend.names() if name != LOCK_NAME] if manifest is None else []
    if versions.JOURNAL_NAME in names:   # saves of stampede's, and nothing prepared
        raise CheckpointError(
            f"target.path = {spec.target_path!r} holds saved versions ({versions.JOURNAL_NAME})"
            f" and no prepared checkpoint (no {MANIFEST_NAME}): run would restore the saves",
            hint="`stampede clean` the job that saved them, or give another target.path")
    if names:
        raise CheckpointError(
            f"target.path = {spec.target_path!r} is not empty and was not prepared by stampede"
            f" (no {MANIFEST_NAME})", hint="give an empty or new directory (or prefix)")
    if manifest is None:
        # clean removes the directory too, when prepare made it and nothing else is in it
        manifest = {**new_manifest(), "created_root": created_root}
    return manifest


@dataclass(frozen=True)
class Space:
    """What a prepare would write, against what the target can take (POSIX only)."""

    bytes_written: int           # every layout's files, headers included
    files: int
    largest_file_bytes: int
    free_bytes: int | None       # for the writer (statvfs f_bavail); None: not known
    present_bytes: int           # of those files, already on disk (rewritten in place)
    file_limit_bytes: int | None  # RLIMIT_FSIZE, when set
    where: str
    what: str = "prepare writes"

    @property
    def fits(self) -> bool:
        room = self.free_bytes is None or self.bytes_written - self.present_bytes <= self.free_bytes
        return room and (self.file_limit_bytes is None
                         or self.largest_file_bytes <= self.file_limit_bytes)

    def describe(self) -> str:
        text = (f"{self.what} {format_bytes(self.bytes_written)} "
                f"({self.bytes_written:,} bytes) in {self.files} file(s)")
        if self.free_bytes is None:
            return text + f"; free space not checked ({self.where})"
        text += (f"; {format_bytes(self.free_bytes)} free at {self.where}"
                 + (f" ({format_bytes(self.present_bytes)} of it rewritten in place)"
                    if self.present_bytes else ""))
        if self.file_limit_bytes is not None and self.largest_file_bytes > self.file_limit_bytes:
            return text + (f"; the largest file, {format_bytes(self.largest_file_bytes)}, is "
                           f"over this process's file-size limit ({self.file_limit_bytes:,} B)")
        return text + ("; it fits" if self.fits else "; it does not fit")


HEADER_MARGIN_BYTES = BYTES_PER_MIB   # a formatted file's header and alignment, at the most


def _file_sizes(spec: JobSpec, layout: str, nranks: int) -> list[tuple[str, int]]:
    """(relpath, bytes on disk at the most) of a layout's files, headers included."""
    margin = HEADER_MARGIN_BYTES if spec.format != "raw" else 0
    return [(relpath, nbytes + margin) for relpath, nbytes in checkpoint_files(spec, layout, nranks)]


def _limits(target: str) -> tuple[int | None, int | None, str]:
    """(free bytes for the writer, this process's file-size limit, where free was asked):
    statvfs of the target or its nearest existing parent; nothing known of an object store."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = None if soft == resource.RLIM_INFINITY else soft
    if not capabilities_for(target).local_files:
        return None, limit, "an object store"
    root = Path(target).absolute()
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    status = os.statvfs(existing)
    return status.f_bavail * status.f_frsize, limit, str(existing)


def space_needed(spec: JobSpec, nranks: int) -> Space:
    """Rank 0 or `plan`, before any write: the bytes every layout's files take, and (POSIX)
    the free space of the target's file system and this process's file-size limit."""
    sizes = {relpath: size for layout in spec.layouts
             for relpath, size in _file_sizes(spec, layout, nranks)}
    free, limit, where = _limits(spec.target_path)
    root = Path(spec.target_path).absolute()
    present = 0 if free is None else \
        sum(min(_size_of(root / relpath), size) for relpath, size in sizes.items())
    return Space(sum(sizes.values()), len(sizes), max(sizes.values(), default=0), free, present,
                 limit, where)


def save_space_needed(spec: JobSpec, nranks: int, kept: dict[str, list[int]] | None = None,
                      freed: dict[str, int] | None = None) -> Space:
    """Rank 0 or `plan --save`, before any write: the most a save adds to the target at any
    moment, against its free space. Per layout (stampede.checkpoint.versions.growth): each
    new version is written beside the versions kept (`kept`: their bytes, oldest first; none
    on a new target), the oldest released after it is published; `freed`: the bytes a
    layout's stale versions hold on disk, removed before its first save. Layouts save in
    turn, so a layout's peak comes on top of what the layouts before it left."""
    kept, freed = kept or {}, freed or {}
    saves = spec.warmup + spec.iterations
    need, left, files, largest = 0, 0, 0, 0
    for layout in spec.layouts:
        sizes = _file_sizes(spec, layout, nranks)
        peak, remains = versions.growth(kept.get(layout, []), sum(size for _, size in sizes), saves,
                               spec.keep)
        left -= freed.get(layout, 0)
        need = max(need, left + peak)
        left += remains
        files += len(sizes) * min(saves, spec.keep + 1)
        largest = max([largest, *(size for _, size in sizes)])
    free, limit, where = _limits(spec.target_path)
    return Space(need, files, largest, free, 0, limit, where, "save adds, at the most,")


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


Offsets = dict[str, dict[str, int]]   # relpath -> tensor -> file offset of its first byte


def _create_files(spec: JobSpec, layout: str, nranks: int, manifest: dict[str, Any],
                  backend: Backend) -> tuple[Offsets, list[str]]:
    """Rank 0: directories (striped when the job asks, by the striper of the file
    system's kind), and the shared file at its full size, header included, before ranks
    write into it (POSIX). Returns the shared file's tensor offsets and notes for the user.

    Files of an earlier prepare of this layout that no layout needs any more (shards of
    another rank count) are removed: they were ours, and the manifest is about to forget
    them.
    """
    files = checkpoint_files(spec, layout, nranks)
    keep = {relpath for relpath, _ in files} | {
        record["path"] for name, entry in manifest["layouts"].items() if name != layout
        for record in entry["files"]}
    for record in manifest["layouts"].get(layout, {}).get("files", []):
        if record["path"] not in keep:
            backend.remove(record["path"])
    # Recorded before the first byte is written: whatever stops this prepare (Ctrl-C, a
    # full disk, a killed rank), clean and the next prepare know every file it made.
    manifest["layouts"][layout] = layout_entry(spec, layout, nranks, bytes_per_rank(spec, nranks),
                                               list(files), [], complete=False)
    write_manifest(backend, manifest)
    if not backend.capabilities.local_files:   # objects are written whole, in sequence, by one
        # rank each; a server's directories made as each file is written, or here, striped
        return {}, _server_directories(spec, backend, [relpath for relpath, _ in files])
    root = Path(spec.target_path)
    offsets: Offsets = {}
    notes: list[str] = []
    tensors = file_tensors(spec, layout, nranks)
    striping = bool(spec.stripe_count or spec.stripe_size_bytes)
    leaves = {(root / relpath).parent for relpath, _ in files}
    # every directory between the root and the files (fan-out: fanout/, then fanout/NNN)
    directories = {parent for leaf in leaves for parent in (leaf, *leaf.parents)
                   if root in parent.parents}
    for directory in sorted(directories, key=lambda path: len(path.parts)):
        # Striping applies to files created afterwards, so it is set on the new, empty
        # directory; a directory that exists keeps what it has, and the user is told.
        if not directory.exists():
            directory.mkdir(mode=DIR_MODE)
            if striping:
                notes.append(stripe(directory, spec.stripe_count, spec.stripe_size_bytes).text)
        elif striping:
            notes.append(f"{directory} exists: its striping is left as it is (clean, then "
                         "prepare again to apply target.stripe_*)")
    shared = shared_path(spec.format)
    if shared in tensors:
        offsets[shared] = create_file(spec.format, root / shared, tensors[shared], spec.dtype,
                                      FILE_MODE)
    return offsets, notes


def _server_directories(spec: JobSpec, backend: Backend, relpaths: list[str]) -> list[str]:
    """Rank 0, a target without a local mount, target.stripe_* asked: every directory
    between the root and the files made here, before any rank creates a file in it, and
    striped by the backend's own client (cephfs://: as on a CephFS mount); a backend that
    does not stripe says so once. Returns the notes for the user."""
    count, size = spec.stripe_count, spec.stripe_size_bytes
    if not (count or size):
        return []
    if backend_striping(backend) is None:
        return [stripe_in(backend, "", count, size).text]
    leaves = {PurePosixPath(relpath).parent for relpath in relpaths}
    notes = []
    for directory in sorted({str(parent) for leaf in leaves for parent in (leaf, *leaf.parents)
                             if parent.name}, key=lambda name: name.count("/")):
        try:
            backend.mkdir(backend.path(directory))
        except FileExistsError:
            notes.append(f"{directory} exists: its striping is left as it is (clean, then "
                         "prepare again to apply target.stripe_*)")
            continue
        notes.append(stripe_in(backend, directory, count, size).text)
    return notes


class _Writer:
    """One rank's writes: deterministic content, block by block, durable, hashed.

    Several layouts share files (the shard files); each extent is written once per
    prepare and its record reused. A file is written through the backend's writer: at
    offsets in place (POSIX), or as one sequential upload, header first (object stores).
    """

    def __init__(self, spec: JobSpec, rank: int, backend: Backend) -> None:
        self.spec, self.rank, self.backend = spec, rank, backend
        self.content: ContentSource | CopiedContent = ContentSource(spec.block_bytes)
        self.written: dict[Extent, dict[str, object]] = {}

    def write(self, extents: tuple[Extent, ...], shared_offsets: Offsets,
              tensors: dict[str, tuple[tuple[str, int], ...]],
              advance: Callable[[int], None]) -> list[dict[str, object]]:
        todo = [extent for extent in extents if extent not in self.written]
        with AlignedBuffer(self.spec.block_bytes) as buffer:
            for relpath in dict.fromkeys(extent.relpath for extent in todo):
                fmt = self.spec.format if any(t for t, _ in tensors[relpath]) else "raw"
                prefix, offsets = self._create(relpath, fmt, tensors[relpath], shared_offsets)
                mine = sorted((e for e in todo if e.relpath == relpath),
                              key=lambda e: offsets[e.tensor] + e.offset)
                with self.backend.writer(relpath) as out:
                    if prefix:
                        out.write_at(0, memoryview(prefix))
                    for extent in mine:
                        self.written[extent] = self._write_extent(
                            out, extent, offsets[extent.tensor], buffer, advance)
        return [self.written[extent] for extent in extents]

    def _create(self, relpath: str, fmt: str, tensors: tuple[tuple[str, int], ...],
                shared_offsets: Offsets) -> tuple[bytes, dict[str, int]]:
        """(bytes to write first, tensor offsets). POSIX: the shared file was created by
        rank 0; a file this rank writes alone it creates itself, header and all, replacing
        an old one. Object stores: the header goes first in the upload."""
        if relpath in shared_offsets:
            return b"", shared_offsets[relpath]
        if self.backend.capabilities.local_files:
            return b"", create_file(fmt, Path(self.spec.target_path) / relpath, tensors,
                                    self.spec.dtype, FILE_MODE)
        if fmt == "safetensors":
            return safetensors_prefix(tensors, self.spec.dtype)
        return b"", {"": 0}

    def _write_extent(self, out: Writer, extent: Extent, base: int, buffer: AlignedBuffer,
                      advance: Callable[[int], None]) -> dict[str, object]:
        """Write the extent's content at `base` + its offsets (base: where its tensor
        starts in a formatted file, 0 in a raw one)."""
        import xxhash  # a prepare-time dependency only

        sha256, xxh3 = hashlib.sha256(), xxhash.xxh3_128()
        label = content_label(extent.relpath, extent.tensor)
        for offset, length in extent.blocks(self.spec.block_bytes):
            view = buffer.prefix(length)
            self.content.fill(view, label, offset)
            out.write_at(base + offset, view)
            sha256.update(view)
            xxh3.update(view)
            advance(length)
        return {"rank": self.rank, "path": extent.relpath, "tensor": extent.tensor,
                "offset": extent.offset, "length": extent.length,
                "sha256": sha256.hexdigest(), "xxh3": xxh3.hexdigest()}


def prepare(comm: mpi.Comm, spec: JobSpec, progress: ProgressBar | None = None,
            copied: CopiedContent | None = None) -> dict[str, Any]:
    """Write every layout of the job, of synthetic bytes or of `copied` ones (another
    checkpoint's, with checkpoint.from: the job arrives sized from it); returns the
    manifest (on every rank). `progress(total_bytes, description, enabled)` is the
    command's progress line (the presentation layer's), none by default."""
    rank, nranks = comm.Get_rank(), comm.Get_size()
    if spec.checkpoint_source == "existing":
        raise UsageError(f"{spec.source}: checkpoint.source = \"existing\": prepare never "
                         "writes to a checkpoint stampede did not make",
                         hint="run it as it is, or copy it into stampede's layouts with "
                              "`prepare --from PATH` and another target.path")
    mpi.on_root(comm, "checking the job", partial(bytes_per_rank, spec, nranks))
    backend = mpi.collective(comm, "connecting to the target",
                             partial(open_backend, spec.target_path, spec.storage_options))
    whole_files = not backend.capabilities.local_files
    lock = writer_lock(spec.target_path)   # the command holds it (commands.flags.job_world)
    manifest = mpi.on_root(comm, "checking the target",
                           partial(_check_target, spec, backend, nranks, lock))
    writer = _Writer(spec, rank, backend)
    if copied is not None:   # the user's tensors instead of synthetic bytes
        writer.content = copied
    for layout in spec.layouts:
        per_rank = bytes_per_rank(spec, nranks)
        extents = writes_of_rank(spec, layout, nranks, rank, whole_files)
        offsets, notes = mpi.on_root(comm, f"creating the {layout} files",
                                     partial(_create_files, spec, layout, nranks, manifest,
                                             backend))
        if rank == 0:
            for note in dict.fromkeys(notes):
                print(f"stampede: {note}", flush=True)
        tensors = file_tensors(spec, layout, nranks)
        # Rank 0 stands for all in the progress bar: the writers go at about the same
        # pace. The total is every rank's writes (an object store's shared file is rank
        # 0's alone: a total of its bytes times the ranks once showed 4x the real rate)
        total = mpi.bcast(comm, sum(
            extent.length for writer_rank in range(nranks) for extent in
            writes_of_rank(spec, layout, nranks, writer_rank, whole_files)) if rank == 0 else 0)
        with (progress or _silent)(total, f"prepare {layout}", rank == 0) as bar:
            advance = partial(_scaled, bar, total / max(sum(e.length for e in extents), 1))
            slices = mpi.collective(comm, f"writing the {layout} checkpoint",
                                    partial(writer.write, extents, offsets, tensors, advance))
        everyone = mpi.gather(comm, slices)
        if rank == 0:
            assert everyone is not None
            files = list(checkpoint_files(spec, layout, nranks))
            entry = manifest["layouts"][layout] = layout_entry(
                spec, layout, nranks, per_rank, files, [s for part in everyone for s in part])
            if copied is not None:   # not regenerable: a corrupt byte is not located
                entry.update(content_block_bytes=0, source=copied.record)
            write_manifest(backend, manifest)
    if copied is not None:
        copied.close()
    result: dict[str, object] = mpi.bcast(comm, manifest)
    return result


def _scaled(advance: Callable[[int], None], factor: float, nbytes: int) -> None:
    advance(int(nbytes * factor))
