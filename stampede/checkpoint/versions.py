"""Saved versions: where each lives, which one is published, and the journal that lets
`clean` and the next save undo exactly what a save wrote, whatever stopped it.

    TARGET/stampede-saves.json          the journal (rank 0 writes it, untimed, atomically)
    TARGET/saves/LAYOUT/v000007/...     version 7: the layout's files, under its own names
    TARGET/saves/LAYOUT/latest          the pointer: "v000007", replaced atomically (publish)

The pointer is the commit: a version is published when, and only when, the pointer names
it, and a save writes it last, after every rank's part is durable and validated. The
journal records each version before its first byte is written (state "writing", with its
files, their temporary names, its directories and the hashes of what will be written),
then "complete" or "invalid". Versions never reuse a number. After a publish, the oldest
complete versions beyond save.keep are released by the ranks (the retention unlink storm,
timed; state "released"). Before a save, versions the pointer does not name that are not
complete (a killed save, a failed validation, what a release left) are removed, untimed,
and their entries dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Sequence
from typing import NotRequired, TypedDict, cast

from stampede import __version__
from stampede.backends.base import Backend
from stampede.checkpoint.manifest import check_entry_types, check_table, damaged, read_document
from stampede.errors import CheckpointError, RunFailed

JOURNAL_NAME = "stampede-saves.json"
JOURNAL_SCHEMA = 1
SAVES_DIR = "saves"
POINTER_NAME = "latest"
STATES = ("writing", "complete", "invalid", "released")
_VERSION_NAME = re.compile(r"v(\d{6,})")


class SavedFile(TypedDict):
    path: str
    bytes: int   # its size, recorded before a byte of it was written


class SavedVersion(TypedDict):
    """A version's entry: save.py's _record_version writes manifest.layout_entry's keys,
    then the version's own; record_outcome updates state (and complete, reason)."""
    complete: bool
    nranks: int
    replicas: int
    bytes_per_rank: int
    format: str
    dtype: str
    content_block_bytes: int
    files: list[SavedFile]
    slices: list[dict[str, object]]
    version: int
    dir: str
    state: str   # one of STATES
    reason: str
    partials: list[str]      # the files' temporary names
    directories: list[str]
    mode: str
    durability: str
    validate: str


class Series(TypedDict):
    next: int   # the next version's number: never reused
    versions: list[SavedVersion]


class Journal(TypedDict):
    schema: int
    stampede_version: str
    layouts: dict[str, Series]
    created_root: bool
    directories: NotRequired[list[str]]   # saves/ and saves/LAYOUT, where a save made them


def layout_dir(layout: str) -> str:
    return f"{SAVES_DIR}/{layout}"


def version_dir(layout: str, version: int) -> str:
    return f"{layout_dir(layout)}/v{version:06d}"


def pointer_path(layout: str) -> str:
    return f"{layout_dir(layout)}/{POINTER_NAME}"


def pointer_text(version: int) -> bytes:
    return f"v{version:06d}\n".encode()


def new_journal(created_root: bool) -> Journal:
    return {"schema": JOURNAL_SCHEMA, "stampede_version": __version__, "layouts": {},
            "created_root": created_root}


def read_journal(backend: Backend, target: str) -> Journal | None:
    """The journal of a target, or None when nothing was saved there; a damaged one is an
    error naming the key (and clean then removes nothing)."""
    journal = read_document(backend, target, JOURNAL_NAME, "save journal", JOURNAL_SCHEMA,
                            "save")
    if journal is not None:
        _check_types(journal, f"{target.rstrip('/')}/{JOURNAL_NAME}")
    return cast("Journal | None", journal)   # its keys and their types checked just now


def journal_of_save(backend: Backend, target: str) -> Journal:
    """The journal a running save made (rank 0): a CheckpointError, not an assertion, when
    it is gone (removed by hand: the save's lock keeps stampede's own clean out)."""
    journal = read_journal(backend, target)
    if journal is None:
        raise CheckpointError(f"{target.rstrip('/')}/{JOURNAL_NAME} vanished while the save "
                              "ran: what it saves can no longer be undone by clean",
                              hint="remove the target's saves/ by hand, or give another "
                                   "target.path")
    return journal


def entry_of(journal: Journal, layout: str, version: int) -> SavedVersion:
    found = [entry for entry in journal["layouts"].get(layout, Series(next=1, versions=[]))["versions"]
             if entry["version"] == version]
    if not found:
        raise CheckpointError(f"the save journal lost version {version} of {layout} while the "
                              "save ran (rewritten by another process?)")
    return found[0]


def _check_types(journal: dict[str, object], where: str) -> None:
    layouts = journal.get("layouts")
    if not isinstance(layouts, dict):
        raise damaged(where, "layouts", layouts, "a table of layouts")
    for layout, series in layouts.items():
        check_table(series, f"layouts.{layout}", {"next": int, "versions": list}, where)
        for index, entry in enumerate(series["versions"]):
            key = f"layouts.{layout}.versions[{index}]"
            check_entry_types(entry, key, where)
            check_table(entry, key, {"version": int, "dir": str, "state": str,
                                     "partials": list, "directories": list}, where)
            if entry["state"] not in STATES:
                raise damaged(where, f"{key}.state", entry["state"], " or ".join(STATES))
            if not entry["dir"].startswith(f"{layout_dir(layout)}/"):
                raise damaged(where, f"{key}.dir", entry["dir"], f"under {layout_dir(layout)}/")


def write_journal(backend: Backend, journal: Journal) -> None:
    """Atomically (backend.put_bytes): a crash leaves the old journal or the new one."""
    backend.put_bytes(JOURNAL_NAME, json.dumps(journal, indent=1, sort_keys=True).encode())


def rewrite_journal(backend: Backend, target: str, journal: Journal) -> None:
    """A running save's journal, read by journal_of_save and changed, written back only
    while it is still there: one removed by hand between the read and this write would
    otherwise come back from memory, and the save go on as if nothing had happened. The
    same CheckpointError as journal_of_save's. What is left unguarded is the write itself
    (put_bytes: a temporary file written, then renamed into place)."""
    try:
        backend.size(JOURNAL_NAME)
    except FileNotFoundError:
        journal_of_save(backend, target)   # raises: it is gone
    write_journal(backend, journal)


def series(journal: Journal, layout: str) -> Series:
    return journal["layouts"].setdefault(layout, {"next": 1, "versions": []})


def published_version(backend: Backend, journal: Journal | None, layout: str) -> int | None:
    """The version the layout's pointer names, when the journal knows it; else None."""
    if journal is None or layout not in journal["layouts"]:
        return None
    text = backend.get_bytes(pointer_path(layout))
    if text is None:
        return None
    match = _VERSION_NAME.fullmatch(text.decode(errors="replace").strip())
    if match is None:
        return None
    version = int(match.group(1))
    known = {entry["version"] for entry in journal["layouts"][layout]["versions"]}
    return version if version in known else None


def stale_versions(journal: Journal, layout: str, published: int | None) -> list[SavedVersion]:
    """Versions nothing can restore: not named by the pointer and not complete (a killed
    or failed save). The next save and clean remove them."""
    return [entry for entry in series(journal, layout)["versions"]
            if entry["version"] != published and entry["state"] != "complete"]


def released_versions(journal: Journal, layout: str, new_version: int,
                      keep: int) -> list[SavedVersion]:
    """The complete versions a publish of `new_version` releases: all but the newest
    `keep` (the new one counted)."""
    complete = sorted((entry for entry in series(journal, layout)["versions"]
                       if entry["state"] == "complete" and entry["version"] != new_version),
                      key=lambda entry: entry["version"])
    return complete[:max(0, len(complete) - (keep - 1))]


def version_bytes(entry: SavedVersion) -> int:
    """The bytes of a version's files, as the journal recorded them before they were written."""
    return sum(int(record["bytes"]) for record in entry["files"])


def kept_bytes(journal: Journal | None, layout: str) -> list[int]:
    """Each complete version's bytes, oldest first: what stays on disk while a save writes."""
    complete = sorted((entry for entry in (journal["layouts"][layout]["versions"] if journal and
                                           layout in journal["layouts"] else [])
                       if entry["state"] == "complete"),
                      key=lambda entry: entry["version"])
    return [version_bytes(entry) for entry in complete]


def growth(kept: Sequence[int], new_bytes: int, saves: int, keep: int) -> tuple[int, int]:
    """What `saves` versions of new_bytes each add to a layout whose complete versions take
    `kept` bytes (oldest first), keeping `keep`: (the most added at any moment, what is left
    added at the end; either negative where the new versions are smaller). A version is
    written beside every version kept; the oldest beyond `keep` are released only after it
    is published, so each save's peak is everything kept plus the new one."""
    versions = list(kept)
    start = sum(versions)
    peak = start
    for _ in range(saves):
        peak = max(peak, sum(versions) + new_bytes)
        versions = (versions + [new_bytes])[-keep:]
    return peak - start, sum(versions) - start


def stale_bytes(backend: Backend, journal: Journal, layout: str) -> int:
    """What the layout's stale versions (a killed or failed save's) hold on disk now (a
    POSIX target): the next save removes them before its first byte, so their space is
    its to use."""
    published = published_version(backend, journal, layout)
    total = 0
    for entry in stale_versions(journal, layout, published):
        for path in written_paths(entry):
            with contextlib.suppress(OSError):
                total += os.stat(backend.path(path)).st_blocks * 512
    return total


def written_paths(entry: SavedVersion) -> list[str]:
    """Every file a version may have left: final and temporary names."""
    return [record["path"] for record in entry["files"]] + list(entry["partials"])


def remove_version(backend: Backend, entry: SavedVersion) -> None:
    """Rank 0, untimed: a version's files (final or temporary names), then its directories,
    deepest first. A file already gone is not an error."""
    for relpath in written_paths(entry):
        backend.remove(relpath)
    for directory in sorted(entry["directories"], key=lambda path: -path.count("/")):
        with contextlib.suppress(OSError):   # something not ours was put in it: left, with it
            backend.remove(directory)


def drop_entries(journal: Journal, layout: str, versions: Sequence[int]) -> None:
    kept = [entry for entry in series(journal, layout)["versions"]
            if entry["version"] not in versions]
    series(journal, layout)["versions"] = kept


def record_outcome(backend: Backend, target: str, keep: int, layout: str, version: int,
                   published: bool, reason: str, name: str) -> str:
    """After the phase: complete (published; the released versions marked so) or invalid.
    Returns a note for the report when the version was not published (also when the
    storage that failed the save cannot take the journal's update either: the entry
    stays "writing", which the next save and clean treat alike)."""
    try:
        journal = journal_of_save(backend, target)
        entry = entry_of(journal, layout, version)
    except (CheckpointError, RunFailed) as error:   # gone, damaged, or unreadable now
        if published:
            raise
        return (f"{name}: v{version:06d} not published, the pointer untouched; its journal "
                f"entry not updated: {error}; the next save or clean removes what it wrote")
    if published:
        entry["state"], entry["complete"] = "complete", True
        for old in released_versions(journal, layout, version, keep):
            old["state"] = "released"
        rewrite_journal(backend, target, journal)
        return ""
    entry["state"], entry["reason"] = "invalid", reason or "not published"
    try:
        rewrite_journal(backend, target, journal)
    except OSError as error:   # the storage that failed the save (a full disk) may refuse
        return (f"{name}: v{version:06d} not published, the pointer untouched; its journal "
                f"entry not updated ({error.strerror or error}); the next save or clean "
                "removes what it wrote")
    current = published_version(backend, journal, layout)
    stays = f"v{current:06d} stays published" if current else "no version is published"
    return (f"{name}: v{version:06d} not published; {stays}; the next save or clean removes "
            "what it wrote")
