"""Where `stampede rejoin` writes, made and undone (stampede.run.rejoin tells the run):
tiers.local_dir checked before MPI, each node's local tier and the target made when
missing (and recorded: what a rank made is what it removes, never a directory it found),
what an unfinished rejoin left refused, and everything a rejoin writes removed at the end
or by `rejoin --clean`: the shards and replicas by name, the directories once empty."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from functools import partial
from pathlib import Path

import numpy as np

from stampede import mpi
from stampede.backends import open_backend
from stampede.backends.base import Backend, missing_root
from stampede.errors import UsageError
from stampede.filesystems import kind_for
from stampede.run.tiers import Rank, local_tier, storage_dir
from stampede.spec import JobSpec

CLEAN_HINT = "stampede rejoin JOB --clean, launched on the same nodes, removes it"
LOCAL_NAMES = re.compile(r"(replica-)?(v\d+-)?p\d{5}")       # what a rejoin writes on a local
STORAGE_NAMES = re.compile(r"(v\d+-)?p\d{5}|manifest\.json")  # tier, and on the storage tier


def nothing_left(state: Rank) -> None:
    """Before anything is written: a rejoin of this job that did not finish left nothing
    on this node's local tier, nor (rank 0) on storage; else refused, and nothing of what
    it left is touched."""
    left = "left by a rejoin of this job that did not finish"
    if state.local.is_dir() and any(state.local.iterdir()):
        raise UsageError(f"{state.local}: {left}", hint=CLEAN_HINT)
    if state.rank == 0 and state.backend.names(storage_dir(state.spec)):
        raise UsageError(f"{state.spec.target_path}/{storage_dir(state.spec)}: {left}",
                         hint=CLEAN_HINT)


def check_local_dir(spec: JobSpec) -> None:
    """Before MPI and any I/O: tiers.local_dir can be made, or exists as a writable
    directory, on this node (UsageError, one line, when it cannot: a file in its way, a
    read-only or pseudo file system such as /proc, no write permission). The mkdir that
    follows may still fail (said per rank, exit 2)."""
    wanted = Path(spec.tier_dir)
    existing = wanted.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    said = f"{spec.source}: tiers.local_dir = {spec.tier_dir!r}"
    if not existing.is_dir():
        raise UsageError(f"{said}: {existing} is not a directory")
    kind, mount = kind_for(existing)
    if not kind.holds_files or "ro" in mount.options.split(","):
        what = "read-only" if kind.holds_files else mount.fs_type
        raise UsageError(f"{said}: {existing} is on {mount.mountpoint} ({what}), where no "
                         "tier can be written: a directory on node-local disk or memory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{said}: {existing} is not writable")


def local_directories(state: Rank) -> None:
    """Untimed: this node's local tier directory, and each of its parents that is missing
    (tiers.local_dir itself, the host's directory); those this rank made recorded, so
    that the end removes them and only them (remove_tiers)."""
    for directory in (*reversed(state.local.parents), state.local):
        try:
            directory.mkdir()
        except FileExistsError:
            continue   # there before, or made by another rank of this node
        except OSError as error:
            raise UsageError(f"{state.spec.source}: tiers.local_dir = {state.spec.tier_dir!r}: "
                             f"cannot make {directory} ({error.strerror or error})") from None
        state.made.append(directory)


def storage_directories(state: Rank) -> None:
    """Untimed, rank 0: the target (made when missing, as save makes it; removed at the
    end when this run made it and left it empty) and the storage tier's directory."""
    backend, spec = state.backend, state.spec
    state.made_root = missing_root(backend)
    try:
        backend.ensure_root()
        if backend.capabilities.has_directories:
            with contextlib.suppress(FileExistsError):   # empty: made by a rejoin, kept by none
                backend.mkdir(backend.path(storage_dir(spec)))
    except OSError as error:
        raise UsageError(f"target.path = {spec.target_path!r}: cannot make "
                         f"{storage_dir(spec)} there ({error.strerror or error})") from None


def clean(state: Rank) -> None:
    """Everything this job wrote, and the directories this run made (remove_tiers).
    Collective."""
    remove_tiers(state.comm, state.backend, state.spec, state.local, state.made,
                 state.made_root)


def remove_tiers(comm: mpi.Comm, backend: Backend, spec: JobSpec, local: Path,
                 made: list[Path] | None = None, made_root: bool = False) -> int:
    """What a rejoin of this job writes, and only that: on every node's local tier the
    shards and replicas (LOCAL_NAMES), on the storage tier (rank 0) the shards and the
    manifest (STORAGE_NAMES); then the directories, each only once empty: those this run
    made (`made`: the local tier's root and the host's directory when they were missing;
    the target when `made_root`), or with `made` None (--clean, which cannot know) the
    job's and the host's directories (tiers.local_dir, perhaps the user's own, stays).
    Collective; the files this rank removed."""
    removed = remove_local(local)
    mpi.barrier(comm)
    if made is None:
        with contextlib.suppress(OSError):
            local.parent.rmdir()
    else:
        _remove_made(comm, made)
    if comm.Get_rank() != 0:
        return removed
    try:
        names = backend.names(storage_dir(spec))
    except OSError as error:   # a dead or hung server: each request fails in its timeout
        print(f"stampede rejoin: {spec.target_path}/{storage_dir(spec)} left on the target "
              f"(listing it: {error.strerror or error}): {CLEAN_HINT}", file=sys.stderr,
              flush=True)
        return removed
    for name in names:
        if STORAGE_NAMES.fullmatch(Path(name).name):
            with contextlib.suppress(OSError):
                backend.remove(name)   # relative to the target's root
                removed += 1
    if backend.capabilities.has_directories:
        with contextlib.suppress(OSError):
            backend.rmdir(backend.path(storage_dir(spec)))
        if made_root:
            with contextlib.suppress(OSError):   # not empty: something else was put in it
                backend.rmdir(backend.path(""))
    return removed


def _remove_made(comm: mpi.Comm, made: list[Path]) -> None:
    """The local directories the ranks made, deepest first, each once empty. Ranks of one
    node made parts of one chain (whoever's mkdir came first), so a pass per directory
    made on any rank, a barrier between: each pass removes at least the deepest one left
    on every node, by the rank that made it."""
    total = mpi.allreduce_sum(comm, np.array([len(made)]))
    for _ in range(int(total[0]) if total is not None else len(made)):
        for directory in sorted(made, key=lambda path: -len(path.parts)):
            with contextlib.suppress(OSError):   # not empty yet, or gone
                directory.rmdir()
        mpi.barrier(comm)


def remove_local(local: Path) -> int:
    """This job's shards and replicas on this node's local tier, then its directory when
    empty (several ranks of a node may remove at once: a file gone is not an error)."""
    removed = 0
    if local.is_dir():
        for path in local.iterdir():
            if LOCAL_NAMES.fullmatch(path.name):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
        with contextlib.suppress(OSError):
            local.rmdir()
    return removed


def clean_job(comm: mpi.Comm, spec: JobSpec) -> int:
    """`stampede rejoin --clean`: what an unfinished rejoin of this job left on every node
    and on the target (remove_tiers); the files removed, all ranks together (rank 0)."""
    host = mpi.processor_name(comm)
    backend = mpi.collective(comm, "connecting to the target",
                             partial(open_backend, spec.target_path, spec.storage_options))
    local = local_tier(spec, host)
    removed = remove_tiers(comm, backend, spec, local)
    total = mpi.allreduce_sum(comm, np.array([removed]))
    return int(total[0]) if total is not None else removed
