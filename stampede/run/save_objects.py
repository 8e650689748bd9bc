"""The timed save on an object store (stampede.backends.base.ObjectStore): each object
written directly under its final name, appearing whole when its upload completes, so there
is no temporary name, rename, directory or fsync_dir (stampede.run.save_pattern runs the
steps around it: snapshot, validate, publish, release).

With save.part_size = P, one multipart upload per object:

    create    CreateMultipartUpload, by the object's creator (a shared object's: rank 0,
              a striped shard's: its replica 0); a shared upload's UploadId then goes to
              its other writers in the wait after it (a vote and a broadcast, one op wait)
    write     one UploadPart per P bytes of the rank's extents, sent from the shard's
              page-aligned buffer (no copy); part k of an object holds its data bytes
              [(k - 1) P, k P), so writers never collide (their extents start on part
              boundaries: stampede.checkpoint.save_plan refuses others); part 1 carries
              a formatted object's header in front
    fsync     CompleteMultipartUpload with every (part number, ETag), ascending: the
              object durable and visible. A shared object's parts are gathered to its
              creator in a wait, it completes, and a last wait tells the writers: their
              bytes are durable at that wait's end

Without a part size, one PUT per object: write is that PUT (the rank writes the whole
object: save_plan refuses several writers of one object without parts); create, which
reaches no server then, is not an op and has no sample, and the PUT's answer is the
object durable (no fsync sample either). Time to first byte means nothing for a PUT
(nothing comes back but the status): none is recorded. Retries are counted per op in the
backend's `retries` (create, write, fsync, publish, unlink).

An upload that does not complete (a failed part, a rank that failed elsewhere, the
deadline) is aborted at the end, untimed (AbortMultipartUpload), so no parts stay behind;
one a killed rank left is aborted by the next save or clean (ObjectStore.discard_uploads).
metadata-first's index is one PUT by rank 0 once every shard is durable; the publish is
the pointer's conditional PUT (If-Match: the pointer's ETag when the version began, or
If-None-Match: * where there was none): a writer that published meanwhile makes it fail
(412), never overwritten.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar, cast

from stampede import mpi
from stampede.backends.base import Backend, ObjectStore, Upload, object_store
from stampede.checkpoint.save_plan import FileWrite
from stampede.layouts import layout_of
from stampede.run.outcome import Log
from stampede.run.save_pattern import CREATE, FSYNC, WRITE, Save
from stampede.run.save_setup import SaveSetup

T = TypeVar("T")
Parts = dict[str, list[tuple[int, str]]]   # relpath -> (part number, ETag) this rank sent


def pointer_etag(backend: Backend, pointer: str) -> str | None:
    """Rank 0, untimed, before the version is written: the pointer's ETag as it is now
    (None: no pointer yet), which the publish's conditional PUT must still find: a writer
    that published meanwhile wins."""
    store = object_store(backend)
    assert store is not None   # asked on an object store only
    return store.etag(str(backend.path(pointer)))


class ObjectSave(Save):
    """One rank's save of one version into objects (the module's steps)."""

    def __init__(self, setup: SaveSetup, iteration: int, origin_ns: int, log: Log) -> None:
        super().__init__(setup, iteration, origin_ns, log)
        self.store = cast(ObjectStore, self.setup.backend)
        self.uploads: dict[str, Upload] = {}  # relpath -> an upload this rank started, open
        self.joined: dict[str, Upload] = {}   # relpath -> another rank's upload it writes into
        self.parts: Parts = {}

    def write_durably(self) -> None:
        setup, plan = self.setup, self.plan
        if setup.part_bytes is None:
            for file in plan.files:
                self.put_file(file)
        else:
            shared = setup.world if layout_of(plan.layout).one_file else setup.group
            self.start_uploads()
            if shared is not None:
                self.share_uploads(shared)
            for file in plan.files:
                self.upload_parts(file, setup.part_bytes)
            if shared is None:
                self.complete(self.parts)
            else:
                self.complete_shared(shared)
        if layout_of(plan.layout).index_file and self.vote(setup.world) and \
                plan.index is not None and setup.index is not None:
            self.put_index(plan.index, setup.index)
        self.vote(setup.world)   # every rank's bytes durable under their final names

    # --- helpers (untimed) ------------------------------------------------------------

    def wait_and(self, comm: mpi.Comm, action: Callable[[], T]) -> tuple[bool, T]:
        """A vote on `comm` (as Save.vote) and a collective that carries data, timed
        together as one op wait; (True when no rank of it has failed, what it carried)."""
        first = len(self.log)
        failed = self.wait(comm, int(not self.ok or self.expired))[0]
        carried = action()
        iteration, op, start, _, nbytes, ok = self.log[first]
        self.log[first] = (iteration, op, start, time.perf_counter_ns(), nbytes, ok)
        self.abandoned = self.abandoned or bool(failed)
        return not self.abandoned, carried

    def data_start(self, relpath: str) -> int:
        """Where the object's data begins (after a formatted object's header)."""
        return min(self.setup.bases[relpath].values())

    def release_handles(self) -> None:
        for upload in self.uploads.values():   # never completed: its parts dropped
            try:
                self.store.abort_upload(upload)
            except OSError as error:
                self.outcome.messages.append(f"rank {self.plan.rank}: abandoning an upload: "
                                             f"{error}; the next save or clean aborts it")
        self.uploads.clear()

    def pointer_writer(self) -> Callable[[], object]:
        """The publish: the pointer's conditional PUT, which fails (FileExistsError) where
        another writer published since this version began."""
        setup = self.setup
        return partial(self.store.publish, str(setup.paths[setup.pointer]),
                       (memoryview(setup.pointer_bytes),), setup.pointer_etag)

    # --- the steps -----------------------------------------------------------------------

    def start_uploads(self) -> None:
        """create: CreateMultipartUpload of each object this rank creates."""
        setup, clock, append, start_upload = self.setup, time.perf_counter_ns, \
            self.log.append, self.store.start_upload
        for file in self.plan.files:
            if not file.creates or not self.active:
                continue
            start = clock()
            try:
                upload = start_upload(setup.paths[file.relpath])
            except OSError as error:
                append((self.iteration, CREATE, start, clock(), 0, 0))
                self.fail("create", file.relpath, error)
                return
            stop = clock()
            append((self.iteration, CREATE, start, stop, 0, 1))
            self.uploads[file.relpath] = upload
            if self.past_deadline(stop):
                return

    def share_uploads(self, comm: mpi.Comm) -> None:
        """The wait after create: the creator's UploadIds to the object's other writers."""
        ids = {relpath: upload.upload_id for relpath, upload in self.uploads.items()}
        going, ids = self.wait_and(comm, lambda: mpi.bcast(comm, ids))
        if not going:
            return
        for file in self.plan.files:
            if not file.creates and file.relpath in ids:
                self.joined[file.relpath] = self.store.join_upload(
                    self.setup.paths[file.relpath], ids[file.relpath])

    def upload_parts(self, file: FileWrite, part_bytes: int) -> None:
        """write: one UploadPart per part of the rank's extents, from the shard in memory."""
        setup, plan = self.setup, self.plan
        upload = self.uploads.get(file.relpath) or self.joined.get(file.relpath)
        if upload is None or not self.active:
            return
        clock, send, append, iteration = time.perf_counter_ns, self.store.upload_part, \
            self.log.append, self.iteration
        data_start, source = self.data_start(file.relpath), self.source
        header = setup.headers.get(file.relpath)
        sent = self.parts.setdefault(file.relpath, [])
        for extent in file.extents:
            base = setup.bases[file.relpath][extent.tensor]
            if (base + extent.offset - data_start) % part_bytes:
                self.fail("write", file.relpath, f"bytes from {base + extent.offset} do not "
                          f"start a part of {part_bytes} bytes")   # save_plan refuses these
                return
            shift = extent.at(plan.hold) - extent.offset
            for offset, length in extent.blocks(part_bytes):
                place = shift + offset
                number = (base + offset - data_start) // part_bytes + 1
                views = (source[place:place + length],) if number > 1 or header is None \
                    else (header, source[place:place + length])
                start = clock()
                try:
                    etag = send(upload, number, views)
                except OSError as error:
                    append((iteration, WRITE, start, clock(), 0, 0))
                    self.fail("write", f"{file.relpath} part {number}", error)
                    return
                stop = clock()
                append((iteration, WRITE, start, stop, sum(view.nbytes for view in views), 1))
                sent.append((number, etag))
                self.written += length
                if stop > setup.deadline_ns and self.past_deadline(stop):
                    return

    def complete(self, parts: Parts) -> None:
        """fsync: CompleteMultipartUpload of each upload this rank started."""
        clock, append = time.perf_counter_ns, self.log.append
        for relpath, upload in list(self.uploads.items()):
            if not self.active:
                return
            start = clock()
            try:
                self.store.complete_upload(upload, sorted(parts.get(relpath, [])))
            except OSError as error:
                append((self.iteration, FSYNC, start, clock(), 0, 0))
                self.fail("fsync", f"{relpath} (completing its upload)", error)
                return
            stop = clock()
            append((self.iteration, FSYNC, start, stop, 0, 1))
            del self.uploads[relpath]
            self._durable_at(stop)

    def complete_shared(self, comm: mpi.Comm) -> None:
        """Every writer's parts to the creator (a wait), which completes the upload; a
        last wait tells the writers their bytes are durable."""
        going, gathered = self.wait_and(comm, lambda: mpi.gather(comm, self.parts))
        if going and self.uploads:
            merged: Parts = {}
            for parts in gathered or []:
                for relpath, sent in parts.items():
                    merged.setdefault(relpath, []).extend(sent)
            self.complete(merged)
        if self.vote(comm) and self.joined and not self.uploads:
            self._durable_at(self.log[-1][3])   # the creator's Complete is behind this wait

    def put_file(self, file: FileWrite) -> None:
        """write: one PUT of the whole object (header, then the rank's extents)."""
        setup, plan = self.setup, self.plan
        if not self.active:
            return
        views = tuple(self.source[extent.at(plan.hold):extent.at(plan.hold) + extent.length]
                      for extent in file.extents)
        header = setup.headers.get(file.relpath)
        self.put_one(file.relpath, views if header is None else (header, *views),
                     sum(extent.length for extent in file.extents))

    def put_index(self, index: FileWrite, data: memoryview) -> None:
        """metadata-first, rank 0, once every shard is durable: the index, one PUT."""
        self.put_one(index.relpath, (data,), len(data))

    def put_one(self, relpath: str, views: tuple[memoryview, ...], data_bytes: int) -> None:
        start = time.perf_counter_ns()
        try:
            self.store.put_object(self.setup.paths[relpath], views)
        except OSError as error:
            self.log.append((self.iteration, WRITE, start, time.perf_counter_ns(), 0, 0))
            self.fail("write", relpath, error)
            return
        stop = time.perf_counter_ns()
        self.log.append((self.iteration, WRITE, start, stop,
                         sum(view.nbytes for view in views), 1))
        self.written += data_bytes
        self._durable_at(stop)
        self.past_deadline(stop)
