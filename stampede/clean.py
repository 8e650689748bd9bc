"""`clean`: remove exactly what prepare wrote, as listed in the manifest, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from stampede.errors import CheckpointError
from stampede.manifest import MANIFEST_NAME, manifest_path, read_manifest


def clean(target: str) -> list[str]:
    """Delete the manifest's files, the manifest, and directories left empty; return them."""
    root = Path(target)
    manifest = read_manifest(root)
    if manifest is None:
        raise CheckpointError(f"{target}: no {MANIFEST_NAME}: nothing here was prepared by "
                              "stampede, so clean removes nothing")
    resolved_root = root.resolve()
    removed = []
    directories = set()
    for entry in manifest["layouts"].values():
        for record in entry["files"]:
            path = root / record["path"]
            # Never follow a path out of the target (a manifest edited by hand, a symlink).
            if resolved_root not in path.resolve().parents or path.is_symlink():
                raise CheckpointError(f"{path}: listed in the manifest but outside the target "
                                      "or a symbolic link; not removed")
            directories.add(path.parent)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            removed.append(str(path))
    manifest_path(root).unlink()
    removed.append(str(manifest_path(root)))
    for directory in sorted(directories, key=lambda p: -len(p.parts)):
        if directory != root and directory.exists() and not any(directory.iterdir()):
            os.rmdir(directory)
            removed.append(str(directory) + "/")
    return removed
