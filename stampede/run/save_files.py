"""The timed save on a file system (the backend has directories): each file written under
a temporary name and renamed into place once durable, op by op (stampede.run.save_pattern
runs the steps around it: snapshot, validate, publish, release).

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
              way, then a second wait]
"""

from __future__ import annotations

import contextlib
import os
import time

from stampede.checkpoint.save_plan import FileWrite
from stampede.layouts import layout_of
from stampede.run.save_pattern import (
    CLOSE,
    CREATE,
    FSYNC,
    MKDIR,
    OPEN,
    RENAME,
    WRITE,
    Save,
)
from stampede.run.where import NOWHERE


class FileSave(Save):
    """One rank's save of one version into files (the module's steps)."""

    def release_handles(self) -> None:
        for handle in self.handles.values():   # untimed: after a failure only
            with contextlib.suppress(OSError):
                self.setup.backend.close(handle)

    def write_durably(self) -> None:
        """mkdir -> create/open -> write -> fsync -> close -> rename -> fsync_dir, then the
        wait for every rank's bytes (and metadata-first's index)."""
        setup, plan = self.setup, self.plan
        self.make_directories()
        shared = setup.world if layout_of(plan.layout).one_file else setup.group
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
        if layout_of(plan.layout).index_file and self.vote(setup.world) and \
                plan.index is not None and setup.index is not None:
            self.create_index(plan.index, setup.index)
        self.vote(setup.world)   # every rank's bytes durable under their final names

    def make_directories(self) -> None:
        setup, plan, clock, append = self.setup, self.plan, time.perf_counter_ns, self.log.append
        mkdir, iteration = setup.backend.mkdir, self.iteration
        if not setup.backend.capabilities.has_directories:
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
                self.at(directory)
                continue
            except OSError as error:
                append((iteration, MKDIR, start, clock(), 0, 0))
                self.at(directory)
                self.fail("mkdir", directory, error)
                break
            append((iteration, MKDIR, start, clock(), 0, 1))
            self.at(directory)
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
                self.at(file.relpath)
                self.fail("create" if creators else "open", file.partial, error)
                return
            stop = clock()
            append((self.iteration, code, start, stop, 0, 1))
            self.at(file.relpath)
            self.handles[file.relpath] = handle
            header = setup.headers.get(file.relpath)
            if creators and header is not None:
                self.write_view(file.relpath, handle, header, 0)
            if self.past_deadline(stop):
                return

    def write_view(self, relpath: str, handle: object, view: memoryview, offset: int) -> bool:
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
            self.at(relpath, offset)
            self.fail("write", f"{relpath} at {offset}", error)
            return False
        stop = time.perf_counter_ns()
        self.log.append((self.iteration, WRITE, start, stop, count, int(count == len(view))))
        self.at(relpath, offset)
        if count != len(view):
            self.fail("write", f"{relpath} at {offset}",
                      f"short write, {count} of {len(view)} bytes (disk full?)")
            return False
        return not self.past_deadline(stop)

    def write_file(self, file: FileWrite, source: memoryview) -> None:
        """Every block of the rank's extents in this file, from the shard in memory."""
        setup, plan = self.setup, self.plan
        handle = self.handles.get(file.relpath)
        if handle is None or not self.active:
            return
        clock, write, append, iteration = time.perf_counter_ns, setup.backend.write_from, \
            self.log.append, self.iteration
        block, where = setup.block_bytes, setup.where
        file_id = where.file_id(file.relpath) if where is not None else NOWHERE
        for extent in file.extents:
            base = setup.bases[file.relpath][extent.tensor]
            shift = extent.at(plan.hold) - extent.offset
            for offset, length in extent.blocks(block):
                place = shift + offset
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
                    self.at(file.relpath, base + offset)
                    self.fail("write", f"{file.partial} at {base + offset}", error)
                    return
                stop = clock()
                if count != length:
                    append((iteration, WRITE, start, stop, count, 0))
                    self.at(file.relpath, base + offset)
                    self.fail("write", f"{file.partial} at {base + offset}",
                              f"short write, {count} of {length} bytes (disk full?)")
                    return
                append((iteration, WRITE, start, stop, count, 1))
                if where is not None:
                    where.rows.append((len(self.log) - 1, file_id, base + offset))
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
                    self.at(relpath)
                    self.fail("fsync", relpath, error)
                else:
                    stop = clock()
                    append((self.iteration, FSYNC, start, stop, 0, 1))
                    self.at(relpath)
                    self._durable_at(stop)
            del self.handles[relpath]
            start = clock()
            try:
                setup.backend.close(handle)
            except OSError as error:   # NFS reports a failed write back at close
                append((self.iteration, CLOSE, start, clock(), 0, 0))
                self.at(relpath)
                self.fail("close", relpath, error)
                continue
            stop = clock()
            append((self.iteration, CLOSE, start, stop, 0, 1))
            self.at(relpath)
            if not setup.durable:
                self._durable_at(stop)   # buffered: done when the bytes are handed over

    def rename(self, files: list[FileWrite]) -> None:
        """Temporary -> final name, then the directory's entry made durable."""
        setup, clock, append = self.setup, time.perf_counter_ns, self.log.append
        if not setup.backend.capabilities.has_directories or self.expired:
            return
        synced: set[str] = set()
        for file in files:
            start = clock()
            try:
                setup.backend.rename(setup.paths[file.partial], setup.paths[file.relpath])
            except OSError as error:
                append((self.iteration, RENAME, start, clock(), 0, 0))
                self.at(file.relpath)
                self.fail("rename", file.partial, error)
                return
            stop = clock()
            append((self.iteration, RENAME, start, stop, 0, 1))
            self.at(file.relpath)
            if not setup.durable:
                self._durable_at(stop)
                continue
            directory = os.path.dirname(file.relpath)
            if directory not in synced:
                synced.add(directory)
                self.sync_directory(directory)

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
            self.at(file.relpath)
            self.fail("create", file.partial, error)
            return
        self.log.append((self.iteration, CREATE, start, clock(), 0, 1))
        self.at(file.relpath)
        self.handles[file.relpath] = handle

