"""`clean`: remove exactly what prepare wrote, as listed in the manifest, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from stampede.backends import open_backend
from stampede.checkpoint.manifest import MANIFEST_NAME, read_manifest
from stampede.errors import CheckpointError
from stampede.spec import JobSpec


def clean(spec: JobSpec) -> list[str]:
    """Delete the manifest's files, the manifest, and directories left empty; return them."""
    target = spec.target_path
    backend = open_backend(target, spec.storage_options)
    manifest = read_manifest(backend, target)
    if manifest is None:
        raise CheckpointError(f"{target}: no {MANIFEST_NAME}: nothing here was prepared by "
                              "stampede, so clean removes nothing")
    relpaths = [record["path"] for entry in manifest["layouts"].values()
                for record in entry["files"]]
    for relpath in relpaths:
        _check_inside(target, relpath, backend.local_path(relpath))
    removed = []
    for relpath in dict.fromkeys(relpaths):
        backend.remove(relpath)
        removed.append(f"{target.rstrip('/')}/{relpath}")
    backend.remove(MANIFEST_NAME)
    removed.append(f"{target.rstrip('/')}/{MANIFEST_NAME}")
    if backend.name == "posix":
        removed += _remove_empty_directories(Path(target), relpaths)
        root = Path(target)
        if manifest.get("created_root") is True and root.is_dir() and not any(root.iterdir()):
            root.rmdir()   # prepare made it, and nothing else has been put in it
            removed.append(f"{target.rstrip('/')}/")
    return removed


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


def _remove_empty_directories(root: Path, relpaths: list[str]) -> list[str]:
    removed = []
    directories = {(root / relpath).parent for relpath in relpaths}
    for directory in sorted(directories, key=lambda p: -len(p.parts)):
        if directory != root and directory.exists() and not any(directory.iterdir()):
            os.rmdir(directory)
            removed.append(str(directory) + "/")
    return removed
