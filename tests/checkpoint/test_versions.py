"""The save journal and the pointer: which version is published, what the next save
removes, what a publish releases; a damaged journal is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stampede.backends.posix import PosixBackend
from stampede.checkpoint import versions
from stampede.errors import CheckpointError


def entry(version: int, state: str) -> dict[str, object]:
    root = versions.version_dir("sharded", version)
    return {"version": version, "dir": root, "state": state, "nranks": 1,
            "bytes_per_rank": 4096, "format": "raw", "files": [{"path": f"{root}/f", "bytes": 1}],
            "slices": [], "partials": [f"{root}/.f.partial"], "directories": [root]}


def journal_of(*entries: dict[str, object]) -> dict[str, object]:
    journal = versions.new_journal(created_root=False)
    journal["layouts"] = {"sharded": {"next": 9, "versions": list(entries)}}
    return journal


def test_the_pointer_is_the_commit(tmp_path: Path) -> None:
    backend = PosixBackend(str(tmp_path))
    journal = journal_of(entry(3, "complete"), entry(4, "writing"))
    assert versions.published_version(backend, journal, "sharded") is None
    (tmp_path / "saves" / "sharded").mkdir(parents=True)
    backend.put_bytes(versions.pointer_path("sharded"), versions.pointer_text(4))
    # named by the pointer: published, whatever a save killed after its publish left
    assert versions.published_version(backend, journal, "sharded") == 4
    backend.put_bytes(versions.pointer_path("sharded"), b"v000005\n")   # unknown: none
    assert versions.published_version(backend, journal, "sharded") is None
    backend.put_bytes(versions.pointer_path("sharded"), b"garbage")
    assert versions.published_version(backend, journal, "sharded") is None


def test_what_the_next_save_removes_and_a_publish_releases() -> None:
    journal = journal_of(entry(1, "released"), entry(2, "complete"), entry(3, "complete"),
                         entry(4, "invalid"), entry(5, "writing"))
    stale = versions.stale_versions(journal, "sharded", published=3)
    assert [item["version"] for item in stale] == [1, 4, 5]
    # publishing 6 with keep 2 keeps 6 and 3; keep 1 keeps 6 alone
    assert [item["version"] for item in versions.released_versions(journal, "sharded", 6, 2)] == [2]
    assert [item["version"] for item in versions.released_versions(journal, "sharded", 6, 1)] == [2, 3]
    assert versions.released_versions(journal, "sharded", 6, 3) == []
    assert versions.written_paths(entry(2, "complete")) == [
        "saves/sharded/v000002/f", "saves/sharded/v000002/.f.partial"]


@pytest.mark.parametrize(("damage", "says"), [
    (lambda j: j["layouts"]["sharded"]["versions"][0].update(state="done"), "state = 'done'"),
    (lambda j: j["layouts"]["sharded"]["versions"][0].update(dir="/etc"), "dir = '/etc'"),
    (lambda j: j["layouts"]["sharded"].update(next="9"), "next = '9': must be a whole number"),
    (lambda j: j["layouts"]["sharded"]["versions"][0].update(partials="x"), "a list"),
])
def test_a_damaged_journal_is_one_line(tmp_path: Path, damage, says: str) -> None:
    journal = journal_of(entry(2, "complete"))
    damage(journal)
    (tmp_path / versions.JOURNAL_NAME).write_text(json.dumps(journal))
    with pytest.raises(CheckpointError, match="stampede-saves.json: layouts.sharded") as raised:
        versions.read_journal(PosixBackend(str(tmp_path)), str(tmp_path))
    assert says in str(raised.value) and "\n" not in str(raised.value).split("hint:")[0].strip()


def test_growth_is_everything_kept_plus_the_new_version_until_the_oldest_goes() -> None:
    mib = 2**20
    # a new target: 3 saves keeping 2 hold at most 3 versions (the third beside the two)
    assert versions.growth([], 10, saves=3, keep=2) == (30, 20)
    assert versions.growth([], 10, saves=1, keep=2) == (10, 10)
    # the case: two 1 MiB versions kept, three 12 MiB saves: 2 + 12, then 13 + 12,
    # then 24 + 12 = 36 MiB at the most, 22 MiB more than before at the end
    assert versions.growth([mib, mib], 12 * mib, saves=3, keep=2) == (34 * mib, 22 * mib)
    # smaller versions after larger ones: at the peak still everything kept plus one
    assert versions.growth([8, 8], 2, saves=3, keep=2) == (2, -12)
    assert versions.growth([5], 5, saves=0, keep=2) == (0, 0)


def test_kept_bytes_counts_complete_versions_oldest_first() -> None:
    journal = journal_of(entry(4, "complete"), entry(2, "complete"), entry(5, "writing"),
                         entry(3, "released"))
    journal["layouts"]["sharded"]["versions"][0]["files"][0]["bytes"] = 7   # type: ignore[index]
    assert versions.kept_bytes(journal, "sharded") == [1, 7]                # v2 then v4
    assert versions.kept_bytes(None, "sharded") == []
    assert versions.kept_bytes(journal, "shared") == []


def test_clean_removes_the_temporaries_a_killed_write_left_and_nothing_else(
        tmp_path: Path) -> None:
    """A journal, manifest or pointer write killed between its temporary and the rename
    (a server gone mid-save, as tests/backends/test_nfs.py's kill found) leaves
    `.NAME.tmp-PID`; clean removes those, and a file of someone else's stays."""
    from stampede.checkpoint.clean import clean
    from stampede.spec import load_job
    from tests.helpers.jobs import write_job

    target = tmp_path / "ck"
    target.mkdir()
    backend = PosixBackend(str(target))
    journal = journal_of(entry(1, "writing"))
    versions.write_journal(backend, journal)
    (target / "saves" / "sharded").mkdir(parents=True)
    left = [f".{versions.JOURNAL_NAME}.tmp-4242", ".stampede-manifest.json.tmp-17",
            f"saves/sharded/.{versions.POINTER_NAME}.tmp-99"]
    for relpath in left:
        (target / relpath).write_text("{")
    theirs = target / f"{versions.JOURNAL_NAME}.bak"
    theirs.write_text("mine")
    job = write_job(tmp_path, target={"path": str(target)}, checkpoint={"size": "1MiB"})
    removed = clean(load_job(job))
    assert all(any(line.endswith(relpath) for line in removed) for relpath in left), removed
    assert sorted(path.name for path in target.rglob("*") if path.is_file()) == [theirs.name]
