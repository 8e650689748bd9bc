"""`clean`: remove exactly what prepare and save wrote, as listed in the manifest and the
save journal (stampede.checkpoint.versions), and nothing else."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from stampede.backends import open_backend
from stampede.backends.base import object_store
from stampede.checkpoint.lock import READERS_DIR, TargetLock, writer_lock
from stampede.checkpoint.manifest import MANIFEST_NAME, read_manifest
from stampede.errors import CheckpointError
from stampede.spec import JobSpec

if TYPE_CHECKING:
    from stampede.backends.base import Backend


def clean(spec: JobSpec) -> list[str]:
    """Delete the files the manifest and the journal list (every saved version, finished
    or not, and the pointers), then them, and directories left empty; return them."""

    target = spec.target_path
    backend = open_backend(target, spec.storage_options)
    # no save, prepare or run while it is cleaned: the command holds the lock
    # (commands.flags.hold_target); clean lets go before it removes the lock file
    return _clean(spec, backend, writer_lock(target))


def _clean(spec: JobSpec, backend: Backend, lock: TargetLock) -> list[str]:
    from stampede.checkpoint import versions

    target = spec.target_path
    manifest = read_manifest(backend, target)
    journal = versions.read_journal(backend, target)
    if manifest is None and journal is None:
        if backend.capabilities.local_files and lock.path.exists() and not lock.created_file:
            lock.release()                  # a writer killed before its first record
            lock.path.unlink()              # left only this
            return [str(lock.path)]
        lock.abandon()
        raise CheckpointError(f"{target}: no {MANIFEST_NAME} or {versions.JOURNAL_NAME}: "
                              "nothing here was prepared or saved by stampede, so clean "
                              "removes nothing")
    relpaths = [record["path"] for entry in (manifest or {"layouts": {}})["layouts"].values()
                for record in entry["files"]]
    saved_directories: list[str] = []
    for layout, series in (journal or {"layouts": {}})["layouts"].items():
        for entry in series["versions"]:
            relpaths += versions.written_paths(entry)
            saved_directories += entry["directories"]
        relpaths.append(versions.pointer_path(layout))
        relpaths += _leftover_pointers(backend, layout)
    saved_directories += journal.get("directories", []) if journal else []
    # a journal or manifest write killed mid-way (a server gone between write and rename)
    relpaths += _leftover_temporaries(backend, "", MANIFEST_NAME, versions.JOURNAL_NAME)
    for relpath in [*relpaths, *saved_directories]:
        _check_inside(target, relpath, backend.local_path(relpath))
    removed = []
    # what is there (objects: one LIST, not a request per name), so that a version's
    # temporary names once renamed, and released files, are neither removed nor listed
    present = None if backend.capabilities.has_directories else set(backend.names())
    for relpath in dict.fromkeys(relpaths):
        if backend.capabilities.local_files and not os.path.lexists(backend.local_path(relpath) or ""):
            continue
        if present is not None and relpath not in present:
            continue
        backend.remove(relpath)
        removed.append(f"{target.rstrip('/')}/{relpath}")
    store = object_store(backend)
    if store is not None and journal is not None:   # a killed save's unfinished uploads
        removed += [f"{target.rstrip('/')}/{relpath} (an unfinished upload, aborted)"
                    for relpath in store.discard_uploads(versions.SAVES_DIR)]
    for name in (MANIFEST_NAME, versions.JOURNAL_NAME):
        if name == MANIFEST_NAME and manifest is None or \
                name == versions.JOURNAL_NAME and journal is None:
            continue
        backend.remove(name)
        removed.append(f"{target.rstrip('/')}/{name}")
    if backend.capabilities.local_files:
        root = Path(target)
        # the writers' lock, stampede's, let go first: a file open while unlinked stays
        # (FUSE renames it .fuse_hidden…) and the directory would not be empty
        lock.release()
        lock.path.unlink(missing_ok=True)
        removed += _remove_empty_directories(root, relpaths, saved_directories)
        created = any(document is not None and document.get("created_root") is True
                      for document in (manifest, journal))
        if created and root.is_dir() and not any(root.iterdir()):
            root.rmdir()   # prepare or save made it, and nothing else has been put in it
            removed.append(f"{target.rstrip('/')}/")
    elif backend.capabilities.has_directories:   # a server's directories (NFS)
        lock.release()   # its lock file goes (the root may be removed), and its readers'
        with suppress(OSError):
            backend.rmdir(backend.path(READERS_DIR))
        created = any(document is not None and document.get("created_root") is True
                      for document in (manifest, journal))
        removed += [f"{target.rstrip('/')}/{directory}/".replace("//", "/")
                    for directory in _remove_remote_directories(backend, relpaths,
                                                                saved_directories, created)]
    return removed


def _remove_remote_directories(backend: Backend, relpaths: list[str], listed: Sequence[str],
                               created_root: bool) -> list[str]:
    """The directories between the root and the files, and those a save recorded making,
    deepest first, each removed where it is empty (RMDIR refuses one that is not); the
    root too when stampede made it."""
    directories = {str(parent) for relpath in relpaths
                   for parent in PurePosixPath(relpath).parents if str(parent) != "."}
    directories |= {directory.strip("/") for directory in listed if directory.strip("/")}
    ordered = sorted(directories, key=lambda name: -name.count("/"))
    removed = []
    for directory in [*ordered, *([""] if created_root else [])]:
        try:
            backend.rmdir(backend.path(directory))
        except OSError:   # not empty (something else is in it), or already gone
            continue
        removed.append(directory)
    return removed


def _leftover_pointers(backend: Backend, layout: str) -> list[str]:
    """Temporary pointers a publish killed mid-way left (put_bytes' `.latest.tmp-PID`)."""
    from stampede.checkpoint import versions

    return _leftover_temporaries(backend, versions.layout_dir(layout), versions.POINTER_NAME)


def _leftover_temporaries(backend: Backend, directory: str, *names: str) -> list[str]:
    """What a put_bytes of one of `names` killed mid-way left in `directory` (the root:
    ""): its temporary, `.NAME.tmp-PID` (`NAME.tmp-PID` through fsspec), names only
    stampede gives, next to a file only stampede writes."""
    prefixes = tuple(f"{dot}{name}.tmp-" for name in names for dot in (".", ""))
    depth = directory.count("/") + 1 if directory else 0
    return [name for name in backend.names(directory)
            if name.rsplit("/", 1)[-1].startswith(prefixes) and name.count("/") == depth]


def _check_inside(target: str, relpath: str, local: str | None) -> None:
    """Never follow a path out of the target (a manifest edited by hand, a symlink)."""
    pure = PurePosixPath(relpath)
    outside = pure.is_absolute() or ".." in pure.parts
    if local is not None and not outside:
        path = Path(local)
        outside = Path(target).resolve() not in path.resolve().parents or path.is_symlink()
    if outside:
        raise CheckpointError(f"{target}: {relpath} is listed in the manifest but lies outside "
                              "the target or is a symbolic link; nothing removed")


def _remove_empty_directories(root: Path, relpaths: list[str],
                              listed: Sequence[str] = ()) -> list[str]:
    removed = []
    # every directory between the root and the files, deepest first (fan-out: fanout/NNN
    # before fanout/), and those a save recorded making
    directories = {parent for relpath in relpaths for parent in (root / relpath).parents
                   if root in parent.parents} | {root / directory for directory in listed}
    for directory in sorted(directories, key=lambda p: -len(p.parts)):
        if directory != root and directory.is_dir() and not directory.is_symlink() \
                and not any(directory.iterdir()):
            os.rmdir(directory)
            removed.append(str(directory) + "/")
    return removed
