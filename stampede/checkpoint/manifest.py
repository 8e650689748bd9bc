"""The manifest: what `prepare` wrote, so that `run` can check it and `clean` can undo it.

It lives in the target directory as `stampede-manifest.json` and marks the directory as
stampede's own: prepare refuses to write into a non-empty directory without one, and
clean deletes only the files it lists.
"""

from __future__ import annotations

import errno
import json
from typing import Any

from stampede import __version__
from stampede.backends.base import Backend
from stampede.errors import CheckpointError, RunFailed
from stampede.results.readback import parse_json
from stampede.spec import JobSpec

MANIFEST_NAME = "stampede-manifest.json"
MANIFEST_SCHEMA = 1
# An error reading a document that says the target as given is wrong (exit 2); any other
# (a throttled store, EIO, a timeout) is the storage failing during the run (exit 1).
REFUSED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR})


def read_manifest(backend: Backend, target: str) -> dict[str, Any] | None:
    """The manifest of a target, or None when there is none; corrupt ones are errors."""
    manifest = read_document(backend, target, MANIFEST_NAME, "manifest", MANIFEST_SCHEMA,
                             "prepare")
    if manifest is not None:
        _check_types(manifest, f"{target.rstrip('/')}/{MANIFEST_NAME}")
    return manifest


def read_document(backend: Backend, target: str, name: str, what: str, schema: int,
                  redo: str) -> dict[str, object] | None:
    """One of stampede's JSON documents in a target (the manifest, the save journal), or
    None when there is none. What run, save and clean do rests on it, so unreadable,
    empty, truncated, not JSON, not an object or another schema is one CheckpointError
    (exit 2) naming the file and what is wrong (stampede.results.readback's note), never a
    note they go on without (`redo`: the command that writes it again)."""
    where = f"{target.rstrip('/')}/{name}"
    try:
        text = backend.get_bytes(name)
    except OSError as error:
        said = f"{where}: cannot read the {what} ({error.strerror or error})"
        if error.errno in REFUSED_ERRNOS:      # the target as given cannot be read: exit 2
            raise CheckpointError(said) from None
        raise RunFailed(said) from None        # the storage failed (throttled, EIO): exit 1
    if text is None:
        return None
    found = parse_json(text, where, what)   # what stampede reads back: one reader
    if found.value is None:
        raise CheckpointError(found.notes[0], hint=f"remove the target's files by hand and "
                                                   f"{redo} again")
    if found.value.get("schema") != schema:
        raise CheckpointError(f"{where}: not a stampede {what} of schema {schema}")
    return found.value


# What each entry of a layout holds, and of which type (bool is not an int here).
ENTRY_TYPES = {"nranks": int, "bytes_per_rank": int, "format": str, "files": list,
               "slices": list}
FILE_TYPES = {"path": str, "bytes": int}
SLICE_TYPES = {"path": str, "offset": int, "length": int}
KIND_NAMES = {int: "a whole number", str: "a string", list: "a list"}


def _check_types(manifest: dict[str, object], where: str) -> None:
    """Every key run and clean read is there and of its type: a manifest edited by hand is
    one error naming the key and the value, never a traceback (and clean then removes
    nothing: it only ever deletes what a sound manifest lists)."""
    layouts = manifest.get("layouts")
    if not isinstance(layouts, dict):
        raise damaged(where, "layouts", layouts, "a table of layouts")
    for layout, entry in layouts.items():
        check_entry_types(entry, f"layouts.{layout}", where)


def damaged(where: str, key: str, value: object, what: str) -> CheckpointError:
    return CheckpointError(f"{where}: {key} = {value!r:.80}: must be {what}",
                           hint="the file was edited or damaged: remove the target's files by "
                                "hand and prepare (or save) again")


def check_table(table: object, key: str, types: dict[str, type], where: str) -> None:
    """`table` is a table holding each of `types`' keys with a value of its type (bool is
    not an int here)."""
    if not isinstance(table, dict):
        raise damaged(where, key, table, "a table")
    for name, kind in types.items():
        value = table.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise damaged(where, f"{key}.{name}", value, KIND_NAMES[kind])


def check_entry_types(entry: object, key: str, where: str) -> None:
    """A layout's entry (layout_entry: prepare's, or a saved version's)."""
    check_table(entry, key, ENTRY_TYPES, where)
    assert isinstance(entry, dict)
    for index, record in enumerate(entry["files"]):
        check_table(record, f"{key}.files[{index}]", FILE_TYPES, where)
    for index, record in enumerate(entry["slices"]):
        check_table(record, f"{key}.slices[{index}]", SLICE_TYPES, where)


def write_manifest(backend: Backend, manifest: dict[str, object]) -> None:
    """Atomically (backend.put_bytes): a crash leaves the old manifest or the new one."""
    backend.put_bytes(MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True).encode())


def new_manifest() -> dict[str, object]:
    return {"schema": MANIFEST_SCHEMA, "stampede_version": __version__, "layouts": {}}


def layout_entry(spec: JobSpec, layout: str, nranks: int, bytes_per_rank: int,
                 files: list[tuple[str, int]], slices: list[dict[str, object]],
                 complete: bool = True) -> dict[str, object]:
    """A layout's record. prepare writes it first incomplete (the files it is about to
    create, no slices yet), so that whatever stops it, clean can remove exactly those
    files; then complete, with every writer's slices and hashes."""
    return {
        "complete": complete,
        "nranks": nranks,
        "replicas": spec.replicas,
        "bytes_per_rank": bytes_per_rank,
        "format": spec.format,
        "dtype": spec.dtype,
        # its keys: copies under copy-k/, shards' keys hashed first (stampede.checkpoint.plan)
        "copies": spec.copies,
        "key_prefix": spec.key_prefix,
        # the content's block boundaries (stampede.checkpoint.content): a run regenerates the bytes
        # a corrupt slice should hold from them, to say which bytes differ
        "content_block_bytes": spec.block_bytes,
        "files": [{"path": path, "bytes": size} for path, size in files],
        "slices": slices,  # per writer: path, tensor, offset, length, sha256, xxh3
    }


def prepared_layout(manifest: dict[str, Any] | None, spec: JobSpec, layout: str,
                    nranks: int, bytes_per_rank: int) -> dict[str, object]:
    """The manifest entry for this layout, checked against the job and the rank count."""
    target = spec.target_path
    command = spec.command("prepare", nranks)
    if manifest is None:
        raise CheckpointError(f"{target}: no checkpoint prepared here ({MANIFEST_NAME} missing)",
                              hint=f"run `{command}` first")
    entry = manifest["layouts"].get(layout)
    if entry is None:
        raise CheckpointError(f"{target}: layout {layout!r} was not prepared here "
                              f"(prepared: {', '.join(sorted(manifest['layouts'])) or 'none'})",
                              hint=f"run `{command}` first")
    if entry.get("complete") is False:   # absent in manifests of older stampedes: complete
        raise CheckpointError(f"{target}: layout {layout!r} was not prepared to the end (the "
                              "prepare was interrupted or failed): its files are incomplete",
                              hint=f"run `{command}` again (or `clean` to remove them)")
    check_entry(entry, spec, f"{target}: layout {layout!r} was prepared", nranks,
                bytes_per_rank, command)
    return entry


def check_entry(entry: dict[str, Any], spec: JobSpec, what: str, nranks: int,
                bytes_per_rank: int, command: str) -> None:
    """A checkpoint's entry (prepared, or a saved version) fits this run: rank count,
    replicas, size, format, dtype, the hashes run.verify needs. `what` says whose entry
    it is ("<target>: layout 'x' was prepared")."""
    prepared = (entry["nranks"], entry.get("replicas", 1), entry["bytes_per_rank"], entry["format"])
    if spec.format != "raw" and entry.get("dtype") != spec.dtype:
        raise CheckpointError(f"{what} with checkpoint.dtype = {entry.get('dtype')!r}; this run "
                              f"asks for {spec.dtype!r}", hint=f"run `{command}` again")
    if spec.verify != "none" and any(spec.verify not in s for s in entry["slices"]):
        why = "a save records xxh3, and sha256 when save.validate or run.verify asks for it" \
            if "version" in entry else "by an older stampede"
        raise CheckpointError(f"{what} without {spec.verify} hashes ({why})",
                              hint=f"run `{command}` again")
    if spec.check_finite and int(entry.get("content_block_bytes", 0)) % 4:
        raise CheckpointError(f"{what} with block_size {entry['content_block_bytes']}, not a "
                              "multiple of 4: its values are not element-aligned, so "
                              "run.check_finite would flag them",
                              hint=f"run `{command}` again with a block_size multiple of 4")
    keys = (entry.get("copies", 1), entry.get("key_prefix", "none"))   # older: plain keys
    if keys != (spec.copies, spec.key_prefix):
        raise CheckpointError(f"{what} with checkpoint.copies = {keys[0]}, key_prefix = "
                              f"{keys[1]!r}; this run asks for {spec.copies}, "
                              f"{spec.key_prefix!r} (other keys)", hint=f"run `{command}` again")
    if prepared != (nranks, spec.replicas, bytes_per_rank, spec.format):
        raise CheckpointError(
            f"{what} for {entry['nranks']} ranks ({prepared[1]} replicas) x "
            f"{_size(entry['bytes_per_rank'])} ({entry['format']}); this run needs {nranks} "
            f"ranks ({spec.replicas} replicas) x {_size(bytes_per_rank)} ({spec.format})",
            hint=f"run `{command}` again")


def _size(nbytes: int) -> str:
    """'256 MiB (268,435,456 B)': readable, and exact where a mismatch may be a few bytes."""
    from stampede.units import format_bytes

    return f"{format_bytes(nbytes)} ({nbytes:,} B)"
