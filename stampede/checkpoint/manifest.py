"""The manifest: what `prepare` wrote, so that `run` can check it and `clean` can undo it.

It lives in the target directory as `stampede-manifest.json` and marks the directory as
stampede's own: prepare refuses to write into a non-empty directory without one, and
clean deletes only the files it lists.
"""

from __future__ import annotations

import json
from typing import Any

from stampede import __version__
from stampede.backends.base import Backend
from stampede.errors import CheckpointError
from stampede.spec import JobSpec

MANIFEST_NAME = "stampede-manifest.json"
MANIFEST_SCHEMA = 1


def read_manifest(backend: Backend, target: str) -> dict[str, Any] | None:
    """The manifest of a target, or None when there is none; corrupt ones are errors."""
    where = f"{target.rstrip('/')}/{MANIFEST_NAME}"
    try:
        text = backend.get_bytes(MANIFEST_NAME)
    except OSError as error:
        raise CheckpointError(f"{where}: cannot read the manifest ({error.strerror or error})"
                              ) from None
    if text is None:
        return None
    try:
        manifest: dict[str, Any] = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{where}: the manifest is not valid JSON ({error})",
                              hint="remove the target's files by hand and prepare again") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise CheckpointError(f"{where}: not a stampede manifest of schema {MANIFEST_SCHEMA}")
    return manifest


def write_manifest(backend: Backend, manifest: dict[str, Any]) -> None:
    """Atomically (backend.put_bytes): a crash leaves the old manifest or the new one."""
    backend.put_bytes(MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True).encode())


def new_manifest() -> dict[str, Any]:
    return {"schema": MANIFEST_SCHEMA, "stampede_version": __version__, "layouts": {}}


def layout_entry(spec: JobSpec, layout: str, nranks: int, bytes_per_rank: int,
                 files: list[tuple[str, int]], slices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nranks": nranks,
        "replicas": spec.replicas,
        "bytes_per_rank": bytes_per_rank,
        "format": spec.format,
        "dtype": spec.dtype,
        # the content's block boundaries (stampede.checkpoint.content): a run regenerates the bytes
        # a corrupt slice should hold from them, to say which bytes differ
        "content_block_bytes": spec.block_bytes,
        "files": [{"path": path, "bytes": size} for path, size in files],
        "slices": slices,  # per writer: path, tensor, offset, length, sha256, xxh3
    }


def prepared_layout(manifest: dict[str, Any] | None, spec: JobSpec, layout: str,
                    nranks: int, bytes_per_rank: int) -> dict[str, Any]:
    """The manifest entry for this layout, checked against the job and the rank count."""
    target = spec.target_path
    command = f"mpiexec -n {nranks} stampede prepare {spec.source}"
    if manifest is None:
        raise CheckpointError(f"{target}: no checkpoint prepared here ({MANIFEST_NAME} missing)",
                              hint=f"run `{command}` first (with the same --set options)")
    entry = manifest["layouts"].get(layout)
    if entry is None:
        raise CheckpointError(f"{target}: layout {layout!r} was not prepared here "
                              f"(prepared: {', '.join(sorted(manifest['layouts'])) or 'none'})",
                              hint=f"run `{command}` first")
    prepared = (entry["nranks"], entry.get("replicas", 1), entry["bytes_per_rank"], entry["format"])
    if spec.format != "raw" and entry.get("dtype") != spec.dtype:
        raise CheckpointError(f"{target}: layout {layout!r} was prepared with checkpoint.dtype "
                              f"= {entry.get('dtype')!r}; this run asks for {spec.dtype!r}",
                              hint=f"run `{command}` again")
    if spec.verify != "none" and any(spec.verify not in s for s in entry["slices"]):
        raise CheckpointError(f"{target}: layout {layout!r} was prepared without {spec.verify} "
                              "hashes (by an older stampede)", hint=f"run `{command}` again")
    if spec.check_finite and int(entry.get("content_block_bytes", 0)) % 4:
        raise CheckpointError(f"{target}: layout {layout!r} was prepared with block_size "
                              f"{entry['content_block_bytes']}, not a multiple of 4: its values "
                              "are not element-aligned, so run.check_finite would flag them",
                              hint=f"run `{command}` again with a block_size multiple of 4")
    if prepared != (nranks, spec.replicas, bytes_per_rank, spec.format):
        raise CheckpointError(
            f"{target}: layout {layout!r} was prepared for {entry['nranks']} ranks "
            f"({prepared[1]} replicas) x {entry['bytes_per_rank']} bytes ({entry['format']}); "
            f"this run needs {nranks} ranks ({spec.replicas} replicas) x {bytes_per_rank} bytes "
            f"({spec.format})", hint=f"run `{command}` again")
    return entry
