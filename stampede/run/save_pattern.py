"""The timed save: what one rank does in one save of one version, stamp by stamp.

As in the restore (stampede.run.pattern), each op is timed alone between two
`perf_counter_ns` stamps and errors are counted per op, never raised; a rank that failed,
or ran out of time, still takes part in every wait that follows (with "incomplete"), so
nothing hangs, and nothing is published.

    [async: snapshot (the shard copied to the staging buffer) -> blocked ends; the rest
     runs in a background thread, from the copy]
    mkdir     save.mkdir = root: rank 0 makes the version's directories, then a wait;
              every: each writing rank makes those on its paths (an existing one is fine)
    create    each file under its temporary name, O_CREAT|O_EXCL, by its creator (a
              formatted file's header is its first write); a shared file is then opened
              (open) by the others, after a wait
    write     block by block from the shard in memory (pwritev; O_DIRECT with run.cache =
              direct), then fsync and close each file
    rename    temporary -> final name, by the creator (a shared file after a wait for its
              writers), then fsync_dir of the directory renamed into
    wait      every rank's bytes durable [metadata-first: rank 0 writes the index the same
              way, then a second wait]; sync: blocked ends here
    validate  each written extent evicted and re-read, its hash (or finite check) against
              the one computed when the shard was filled; then a wait for every verdict
    publish   rank 0, if every rank's part is good: the version's directories fsynced,
              then the pointer replaced atomically (tmp + fsync + rename + fsync_dir)
    unlink    after a wait for the publish: each rank deletes its share of the released
              versions' files, then a wait, then rank 0 removes their directories (rmdir)

The pseudo-ops close it: save (phase start -> the rank's last fsync: its bytes durable
under their final names; ranks that write), blocked (every rank), published (rank 0).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stampede import mpi
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import Extent
from stampede.checkpoint.save_plan import FileWrite, SavePlan
from stampede.results.samples import OP_CODE, SAVE_STORAGE_OPS
from stampede.run.pattern import Log, PhaseOutcome, _describe

(SNAPSHOT, MKDIR, CREATE, OPEN, WRITE, FSYNC, CLOSE, RENAME, FSYNC_DIR, WAIT, VALIDATE, PUBLISH,
 UNLINK, RMDIR, BLOCKED, SAVE, PUBLISHED) = (OP_CODE[name] for name in (
     "snapshot", "mkdir", "create", "open", "write", "fsync", "close", "rename", "fsync_dir",
     "wait", "validate", "publish", "unlink", "rmdir", "blocked", "save", "published"))
STORAGE_CODES = frozenset(OP_CODE[name] for name in SAVE_STORAGE_OPS)
WAIT_GRACE_S = 10.0   # past the deadline, a wait for other ranks aborts the job


@dataclass
class SaveSetup:
    """What a rank prepares, untimed, for one save (one version) of one layout."""

    plan: SavePlan
    backend: Backend
    paths: dict[str, Any]           # relpath -> the backend's name (files, partials, dirs)
    model: AlignedBuffer            # the shard in memory, this version's content
    check: AlignedBuffer            # one block: validation re-reads into it
    block_bytes: int
    world: Any
    group: Any = None               # striped: the ranks writing one shard's file
    staging: AlignedBuffer | None = None   # save.mode = async: the copy written from
    direct: bool = False
    durable: bool = True            # save.durability = fsync
    mkdir_every: bool = False       # save.mkdir = every
    validate: str = "xxh3"          # none | sha256 | xxh3 | finite
    finite_dtype: str = ""          # validate = finite: the elements' dtype
    expected: dict[Extent, str] = field(default_factory=dict)   # validate's hash per extent
    headers: dict[str, memoryview] = field(default_factory=dict)   # relpath -> header bytes
    bases: dict[str, dict[str, int]] = field(default_factory=dict)  # relpath -> tensor -> offset
    index: memoryview | None = None     # metadata-first, rank 0: the index's bytes
    pointer: str = ""               # rank 0: the layout's pointer (relpath) and its bytes
    pointer_bytes: bytes = b""
    spine: tuple[str, ...] = ()     # rank 0: directories fsynced before the publish
    releasing: bool = False         # versions are released after a publish (every rank)
    releases: tuple[str, ...] = ()  # this rank's share of the released versions' files
    release_dirs: tuple[str, ...] = ()   # rank 0: their directories, deepest first
    deadline_ns: int = 0
    owned: list[Any] = field(default_factory=list)   # buffers of this version alone


class _Save:
    """One rank's save of one version: the steps of the module's docstring, in order."""

    def __init__(self, setup: SaveSetup, iteration: int, origin_ns: int, log: Log) -> None:
        self.setup, self.plan, self.iteration, self.origin = setup, setup.plan, iteration, origin_ns
        self.log, self.outcome = log, PhaseOutcome()
        self.handles: dict[str, Any] = {}      # relpath -> open handle (partial name)
        self.source = setup.model.view         # what the writes copy from
        self.ok = True                         # every op of this rank so far succeeded
        self.abandoned = False                 # a wait said another rank failed
        self.expired = False                   # the deadline passed: no more local I/O
        self.durable_ns = 0                    # the rank's last fsync (or, without, close)
        self.written = 0
        self.blocked_ns = 0

    # --- helpers (untimed) ------------------------------------------------------------

    def fail(self, op: str, what: str, error: OSError | str) -> None:
        self.ok = False
        text = error if isinstance(error, str) else _describe(error, self.setup.direct)
        self.outcome.fail(f"rank {self.plan.rank}: {op} {what}: {text}")

    def past_deadline(self, stop: int) -> bool:
        if stop > self.setup.deadline_ns and not self.expired:
            self.expired, self.ok = True, False
            self.outcome.timed_out = True
            self.outcome.fail(f"rank {self.plan.rank}: deadline reached before the save finished")
        return self.expired

    def wait(self, comm: Any, *flags: int) -> np.ndarray:
        """A timed wait (op wait) that is also a vote: the flags summed over `comm`."""
        start = time.perf_counter_ns()
        timeout_s = max(self.setup.deadline_ns - start, 0) / 1e9 + WAIT_GRACE_S
        total = mpi.allreduce_sum(comm, np.array(flags, dtype=np.int64), timeout_s=timeout_s)
        if total is None:
            mpi.abort(comm, f"rank {self.plan.rank}: other ranks did not reach the save's next "
                            f"step within {timeout_s:.3g} s")
            raise AssertionError("unreachable")
        self.log.append((self.iteration, WAIT, start, time.perf_counter_ns(), 0, 1))
        return total

    def _durable_at(self, stop: int) -> None:
        self.durable_ns = max(self.durable_ns, stop)

    @property
    def active(self) -> bool:
        """Local I/O goes on: nothing failed here or elsewhere, the deadline not passed."""
        return self.ok and not self.abandoned and not self.expired

    def vote(self, comm: Any) -> bool:
        """A wait on `comm`: True when no rank of it has failed (else the version is
        abandoned here too)."""
        if self.wait(comm, int(not self.ok or self.expired))[0]:
            self.abandoned = True
        return not self.abandoned

    # --- the steps -----------------------------------------------------------------------

    def run(self) -> PhaseOutcome:
        setup, plan = self.setup, self.plan
        first = len(self.log)
        try:
            if setup.staging is not None:
                self.snapshot()
                failure: list[BaseException] = []
                thread = threading.Thread(target=self._background, args=(failure,),
                                          name="stampede-async-save")
                thread.start()
                thread.join()
                if failure:
                    raise failure[0]
            else:
                self.write_durably()
                self.blocked_ns = time.perf_counter_ns()
            good = self.validated()
            self.publish_and_release(good)
        finally:
            for handle in self.handles.values():   # untimed: after a failure only
                with contextlib.suppress(OSError):
                    setup.backend.close(handle)
        iteration, origin = self.iteration, self.origin
        self.log.append((iteration, BLOCKED, origin, self.blocked_ns or origin, 0, 1))
        if plan.writes or plan.index is not None:
            self.log.append((iteration, SAVE, origin, self.durable_ns or time.perf_counter_ns(),
                             self.written, int(self.ok)))
        self.outcome.incomplete = not self.ok
        self.outcome.ops = sum(1 for row in self.log[first:] if row[1] in STORAGE_CODES)
        return self.outcome

    def snapshot(self) -> None:
        """async: copy the shard to the staging buffer; training could go on after it."""
        staging = self.setup.staging
        assert staging is not None
        start = time.perf_counter_ns()
        staging.view[:] = self.setup.model.view
        stop = self.blocked_ns = time.perf_counter_ns()
        self.log.append((self.iteration, SNAPSHOT, start, stop, len(staging.view), 1))
        self.source = staging.view

    def _background(self, failure: list[BaseException]) -> None:
        try:
            self.write_durably()
        except BaseException as error:   # re-raised by the main thread after join
            failure.append(error)

    def write_durably(self) -> None:
        """mkdir -> create/open -> write -> fsync -> close -> rename -> fsync_dir, then the
        wait for every rank's bytes (and metadata-first's index)."""
        setup, plan = self.setup, self.plan
        self.make_directories()
        shared = setup.world if plan.layout == "shared" else setup.group
        self.create(creators=True)
        if shared is not None and self.vote(shared):   # the others open what was created
            self.create(creators=False)
        for file in plan.files:
            self.write_file(file, self.source)
        self.sync_and_close([file.relpath for file in plan.files])
        if shared is not None:   # the shared file is renamed once all its writers are done
            if self.vote(shared):
                self.rename([file for file in plan.files if file.creates])
        elif self.active:
            self.rename(list(plan.files))
        if plan.layout == "metadata-first" and self.vote(setup.world) and \
                plan.index is not None and setup.index is not None:
            self.create_index(plan.index, setup.index)
        self.vote(setup.world)   # every rank's bytes durable under their final names

    def make_directories(self) -> None:
        setup, plan, clock, append = self.setup, self.plan, time.perf_counter_ns, self.log.append
        mkdir, iteration = setup.backend.mkdir, self.iteration
        if not setup.backend.has_directories:
            return
        if setup.mkdir_every:
            wanted = plan.own_directories() if plan.writes or plan.index else ()
        else:
            wanted = plan.directories if plan.rank == 0 else ()
        for directory in wanted:
            start = clock()
            try:
                mkdir(setup.paths[directory])
            except FileExistsError:   # another rank made it first: what this one needs
                append((iteration, MKDIR, start, clock(), 0, 1))
                continue
            except OSError as error:
                append((iteration, MKDIR, start, clock(), 0, 0))
                self.fail("mkdir", directory, error)
                break
            append((iteration, MKDIR, start, clock(), 0, 1))
        if not setup.mkdir_every:
            self.vote(setup.world)

    def create(self, creators: bool) -> None:
        """Creators create their files (O_EXCL) and write a header first; with
        creators=False, the other writers of a shared file open it."""
        setup, plan, clock, append = self.setup, self.plan, time.perf_counter_ns, self.log.append
        if not self.active:
            return
        open_ = setup.backend.creator(setup.direct) if creators else \
            setup.backend.write_opener(setup.direct)
        code = CREATE if creators else OPEN
        for file in plan.files:
            if file.creates != creators:
                continue
            path = setup.paths[file.partial]
            start = clock()
            try:
                handle = open_(path)
            except OSError as error:
                append((self.iteration, code, start, clock(), 0, 0))
                self.fail("create" if creators else "open", file.partial, error)
                return
            stop = clock()
            append((self.iteration, code, start, stop, 0, 1))
            self.handles[file.relpath] = handle
            header = setup.headers.get(file.relpath)
            if creators and header is not None:
                self.write_view(file.relpath, handle, header, 0)
            if self.past_deadline(stop):
                return

    def write_view(self, relpath: str, handle: Any, view: memoryview, offset: int) -> bool:
        """One timed write (used for headers and the index; the shard's blocks are
        written by write_file's own loop)."""
        start = time.perf_counter_ns()
        try:
            count = self.setup.backend.write_from(handle, view, offset)
            while 0 < count < len(view):   # short: the rest, or why not
                more = self.setup.backend.write_from(handle, view[count:], offset + count)
                if more <= 0:
                    break
                count += more
        except OSError as error:
            self.log.append((self.iteration, WRITE, start, time.perf_counter_ns(), 0, 0))
            self.fail("write", f"{relpath} at {offset}", error)
            return False
        stop = time.perf_counter_ns()
        if count != len(view):
            self.log.append((self.iteration, WRITE, start, stop, count, 0))
            self.fail("write", f"{relpath} at {offset}",
                      f"short write, {count} of {len(view)} bytes (disk full?)")
            return False
        self.log.append((self.iteration, WRITE, start, stop, count, 1))
        return not self.past_deadline(stop)

    def write_file(self, file: FileWrite, source: memoryview) -> None:
        """Every block of the rank's extents in this file, from the shard in memory."""
        setup, plan = self.setup, self.plan
        handle = self.handles.get(file.relpath)
        if handle is None or not self.active:
            return
        clock, write, append, iteration = time.perf_counter_ns, setup.backend.write_from, \
            self.log.append, self.iteration
        hold_offset, block = plan.hold.offset, setup.block_bytes
        for extent in file.extents:
            base = setup.bases[file.relpath][extent.tensor]
            for offset, length in extent.blocks(block):
                place = offset - hold_offset
                view = source[place:place + length]
                start = clock()
                try:
                    count = write(handle, view, base + offset)
                    while 0 < count < length:   # short (the disk filling up): the rest, or why
                        more = write(handle, view[count:], base + offset + count)
                        if more <= 0:
                            break
                        count += more
                except OSError as error:
                    append((iteration, WRITE, start, clock(), 0, 0))
                    self.fail("write", f"{file.partial} at {base + offset}", error)
                    return
                stop = clock()
                if count != length:
                    append((iteration, WRITE, start, stop, count, 0))
                    self.fail("write", f"{file.partial} at {base + offset}",
                              f"short write, {count} of {length} bytes (disk full?)")
                    return
                append((iteration, WRITE, start, stop, count, 1))
                self.written += count
                if stop > setup.deadline_ns and self.past_deadline(stop):
                    return

    def sync_and_close(self, relpaths: list[str]) -> None:
        setup, clock, append = self.setup, time.perf_counter_ns, self.log.append
        for relpath in relpaths:
            handle = self.handles.get(relpath)
            if handle is None:
                continue
            if setup.durable and self.active:
                start = clock()
                try:
                    setup.backend.sync(handle)
                except OSError as error:
                    append((self.iteration, FSYNC, start, clock(), 0, 0))
                    self.fail("fsync", relpath, error)
                else:
                    stop = clock()
                    append((self.iteration, FSYNC, start, stop, 0, 1))
                    self._durable_at(stop)
            del self.handles[relpath]
            start = clock()
            try:
                setup.backend.close(handle)
            except OSError as error:   # NFS reports a failed write back at close
                append((self.iteration, CLOSE, start, clock(), 0, 0))
                self.fail("close", relpath, error)
                continue
            stop = clock()
            append((self.iteration, CLOSE, start, stop, 0, 1))
            if not setup.durable:
                self._durable_at(stop)   # buffered: done when the bytes are handed over

    def rename(self, files: list[FileWrite]) -> None:
        """Temporary -> final name, then the directory's entry made durable."""
        setup, clock, append = self.setup, time.perf_counter_ns, self.log.append
        if not setup.backend.has_directories or self.expired:
            return
        synced: set[str] = set()
        for file in files:
            start = clock()
            try:
                setup.backend.rename(setup.paths[file.partial], setup.paths[file.relpath])
            except OSError as error:
                append((self.iteration, RENAME, start, clock(), 0, 0))
                self.fail("rename", file.partial, error)
                return
            stop = clock()
            append((self.iteration, RENAME, start, stop, 0, 1))
            if not setup.durable:
                self._durable_at(stop)
                continue
            directory = os.path.dirname(file.relpath)
            if directory not in synced:
                synced.add(directory)
                self.sync_directory(directory)

    def sync_directory(self, directory: str, durable: bool = True) -> None:
        """fsync_dir; `durable`: its end counts as this rank's bytes durable (a directory
        renamed into; the publish's own syncs count towards published only)."""
        start = time.perf_counter_ns()
        try:
            self.setup.backend.sync_dir(self.setup.paths[directory])
        except OSError as error:
            self.log.append((self.iteration, FSYNC_DIR, start, time.perf_counter_ns(), 0, 0))
            self.fail("fsync_dir", directory, error)
            return
        stop = time.perf_counter_ns()
        self.log.append((self.iteration, FSYNC_DIR, start, stop, 0, 1))
        if durable:
            self._durable_at(stop)

    def create_index(self, index: FileWrite, data: memoryview) -> None:
        """metadata-first, rank 0, once every shard is durable: the index, written as the
        shards are (create, write, fsync, close, rename, fsync_dir)."""
        self.create_one(index)
        handle = self.handles.get(index.relpath)
        if handle is None:
            return
        block = self.setup.block_bytes
        for offset in range(0, len(data), block):
            if not self.write_view(index.partial, handle, data[offset:offset + block], offset):
                break
        else:
            self.written += len(data)
        self.sync_and_close([index.relpath])
        if self.active:
            self.rename([index])

    def create_one(self, file: FileWrite) -> None:
        setup, clock = self.setup, time.perf_counter_ns
        start = clock()
        try:   # never O_DIRECT: an index is small, and of any length
            handle = setup.backend.creator(False)(setup.paths[file.partial])
        except OSError as error:
            self.log.append((self.iteration, CREATE, start, clock(), 0, 0))
            self.fail("create", file.partial, error)
            return
        self.log.append((self.iteration, CREATE, start, clock(), 0, 1))
        self.handles[file.relpath] = handle

    def validated(self) -> bool:
        """Every writing rank re-reads and checks what it wrote; then every rank learns
        whether all parts are good (a wait). Returns that."""
        setup, plan = self.setup, self.plan
        if setup.validate != "none" and self.active:
            from stampede.run.save_checks import validate_extent
            for file in plan.files:
                for extent in file.extents:
                    if not validate_extent(self, file, extent):
                        break
        verdict = self.wait(setup.world, int(not self.ok or self.expired),
                            int(self.outcome.corrupt))
        return not verdict.any()

    def publish_and_release(self, good: bool) -> None:
        """Rank 0 publishes a good version; once every rank knows, the released versions
        go (each rank its share of the files, then rank 0 their directories)."""
        setup, plan, clock, append = self.setup, self.plan, time.perf_counter_ns, self.log.append
        published = 0
        if plan.rank == 0:
            stop = clock()
            if good:
                if setup.durable:
                    for directory in setup.spine:
                        self.sync_directory(directory, durable=False)
                start = clock()
                try:
                    setup.backend.put_bytes(setup.pointer, setup.pointer_bytes)
                except OSError as error:
                    append((self.iteration, PUBLISH, start, clock(), 0, 0))
                    self.fail("publish", setup.pointer, error)
                else:
                    stop = clock()
                    append((self.iteration, PUBLISH, start, stop, 0, 1))
                    published = 1
            append((self.iteration, PUBLISHED, self.origin, stop, 0, published))
        if not setup.releasing:
            return
        if not self.wait(setup.world, published)[0]:
            return   # not published: the released versions stay, the previous one named
        for relpath in setup.releases:
            start = clock()
            try:
                setup.backend.unlink(setup.paths[relpath])
            except OSError as error:
                append((self.iteration, UNLINK, start, clock(), 0, 0))
                self.fail("unlink", relpath, error)
                continue
            append((self.iteration, UNLINK, start, clock(), 0, 1))
        self.wait(setup.world, 0)   # every file gone before its directory
        if plan.rank == 0:
            for directory in setup.release_dirs:
                start = clock()
                try:
                    setup.backend.rmdir(setup.paths[directory])
                except OSError as error:
                    append((self.iteration, RMDIR, start, clock(), 0, 0))
                    self.fail("rmdir", directory, error)
                    continue
                append((self.iteration, RMDIR, start, clock(), 0, 1))


def run_save(setup: SaveSetup, iteration: int, origin_ns: int, log: Log) -> PhaseOutcome:
    """One save of one version on this rank; samples (absolute stamps) appended to `log`."""
    return _Save(setup, iteration, origin_ns, log).run()
