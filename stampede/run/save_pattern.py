"""The timed save: what one rank does in one save of one version, stamp by stamp.

As in the restore (stampede.run.pattern), each op is timed alone between two
`perf_counter_ns` stamps and errors are counted per op, never raised; a rank that failed,
or ran out of time, still takes part in every wait that follows (with "incomplete"), so
nothing hangs, and nothing is published.

    [async: snapshot (the shard copied to the staging buffer) -> blocked ends; the rest
     runs in a background thread, from the copy]
    write     the rank's bytes made durable under their final names, then a wait for every
              rank's: into files (stampede.run.save_files: mkdir, create, write, fsync,
              close, rename, fsync_dir) or objects (stampede.run.save_objects: create,
              write, fsync as CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
              or one PUT); sync: blocked ends here
    validate  each written extent evicted and re-read, its hash (or finite check) against
              the one computed when the shard was filled; then a wait for every verdict
    publish   rank 0, if every rank's part is good: the version's directories fsynced,
              then the pointer replaced atomically (tmp + fsync + rename + fsync_dir; on
              an object store one PUT)
    unlink    after a wait for the publish: each rank deletes its share of the released
              versions' files, then a wait, then rank 0 removes their directories (rmdir)

The pseudo-ops close it: save (phase start -> the rank's bytes durable under their final
names: its last fsync, or its last upload completed; ranks that write), blocked (every
rank), published (rank 0).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from stampede import mpi
from stampede.ops import OP_CODE, SAVE_STORAGE_OPS
from stampede.run.outcome import Log, PhaseOutcome, describe
from stampede.run.save_checks import validate_extent
from stampede.run.save_setup import SaveSetup
from stampede.run.where import NOWHERE
from stampede.units import format_plain

(SNAPSHOT, MKDIR, CREATE, OPEN, WRITE, FSYNC, CLOSE, RENAME, FSYNC_DIR, WAIT, VALIDATE, PUBLISH,
 UNLINK, RMDIR, BLOCKED, SAVE, PUBLISHED) = (OP_CODE[name] for name in (
     "snapshot", "mkdir", "create", "open", "write", "fsync", "close", "rename", "fsync_dir",
     "wait", "validate", "publish", "unlink", "rmdir", "blocked", "save", "published"))
STORAGE_CODES = frozenset(OP_CODE[name] for name in SAVE_STORAGE_OPS)
WAIT_GRACE_S = 10.0   # past the deadline, a wait for other ranks aborts the job


class Save:
    """One rank's save of one version: the steps of the module's docstring, in order;
    a subclass writes the rank's bytes (write_durably) into files or objects."""

    def __init__(self, setup: SaveSetup, iteration: int, origin_ns: int, log: Log) -> None:
        self.setup, self.plan, self.iteration, self.origin = setup, setup.plan, iteration, origin_ns
        self.log, self.outcome = log, PhaseOutcome()
        self.handles: dict[str, object] = {}   # relpath -> open handle (partial name)
        self.source = setup.model.view         # what the writes copy from
        self.ok = True                         # every op of this rank so far succeeded
        self.abandoned = False                 # a wait said another rank failed
        self.expired = False                   # the deadline passed: no more local I/O
        self.durable_ns = 0                    # the rank's last fsync (or, without, close)
        self.written = 0
        self.blocked_ns = 0

    # --- helpers (untimed) ------------------------------------------------------------

    def at(self, name: str, offset: int = NOWHERE) -> None:
        """--trace: the last sample's file (a path relative to the target) and offset."""
        if self.setup.where is not None:
            self.setup.where.rows.append((len(self.log) - 1, self.setup.where.file_id(name),
                                          offset))

    def fail(self, op: str, what: str, error: OSError | str) -> None:
        self.ok = False
        text = error if isinstance(error, str) else describe(error, self.setup.direct)
        self.outcome.fail(f"rank {self.plan.rank}: {op} {what}: {text}")

    def past_deadline(self, stop: int) -> bool:
        if stop > self.setup.deadline_ns and not self.expired:
            self.expired, self.ok = True, False
            self.outcome.timed_out = True
            self.outcome.fail(f"rank {self.plan.rank}: deadline reached before the save finished")
        return self.expired

    def wait(self, comm: mpi.Comm, *flags: int) -> np.ndarray:
        """A timed wait (op wait) that is also a vote: the flags summed over `comm`."""
        start = time.perf_counter_ns()
        timeout_s = max(self.setup.deadline_ns - start, 0) / 1e9 + WAIT_GRACE_S
        total = mpi.allreduce_sum(comm, np.array(flags, dtype=np.int64), timeout_s=timeout_s)
        if total is None:
            mpi.abort(comm, f"rank {self.plan.rank}: other ranks did not reach the save's next "
                            f"step within {format_plain(timeout_s)} s")
            raise AssertionError("unreachable")
        self.log.append((self.iteration, WAIT, start, time.perf_counter_ns(), 0, 1))
        return total

    def _durable_at(self, stop: int) -> None:
        self.durable_ns = max(self.durable_ns, stop)

    @property
    def active(self) -> bool:
        """Local I/O goes on: nothing failed here or elsewhere, the deadline not passed."""
        return self.ok and not self.abandoned and not self.expired

    def vote(self, comm: mpi.Comm) -> bool:
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
            self.release_handles()
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

    def write_durably(self) -> None:
        """The rank's bytes durable under their final names, then a wait for every rank's."""
        raise NotImplementedError

    def release_handles(self) -> None:
        """Untimed, at the end, whatever happened: what write_durably left open."""

    def pointer_writer(self) -> Callable[[], object]:
        """The publish's one call, bound before its stamps: the pointer replaced."""
        return partial(self.setup.backend.put_bytes, self.setup.pointer, self.setup.pointer_bytes)

    def _background(self, failure: list[BaseException]) -> None:
        try:
            self.write_durably()
        except BaseException as error:   # re-raised by the main thread after join
            failure.append(error)

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

    def validated(self) -> bool:
        """Every writing rank re-reads and checks what it wrote; then every rank learns
        whether all parts are good (a wait). Returns that."""
        setup, plan = self.setup, self.plan
        if setup.validate != "none" and self.active:
            for file in plan.files:
                for extent in file.extents:
                    checked = validate_extent(setup, plan.hold, file, extent)
                    if checked.sample is not None:
                        self.log.append((self.iteration, VALIDATE, *checked.sample))
                    self.outcome.corrupt |= checked.corrupt
                    if checked.failure:
                        self.fail("validate", checked.what, checked.failure)
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
                put = self.pointer_writer()
                start = clock()
                try:
                    put()
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
