"""The one reader of what stampede reads back (stampede.results.readback): each kind of
file (a trace, a sidecar, the save journal, the manifest), each written by stampede's own
writer, then damaged each way (truncated, one byte flipped, emptied, replaced by a file of
another type), is a note naming the file and what is wrong, never a traceback. A report
goes on without it; the journal and the manifest, on which clean, save and run act, stay
one CheckpointError (exit 2) with that note and what to do. And whatever byte of a trace
is flipped or wherever it is cut, what it returns is what was written, or a note."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from stampede.backends.posix import PosixBackend
from stampede.checkpoint import manifest, versions
from stampede.errors import CheckpointError
from stampede.ops import OP_CODE
from stampede.results import trace as traces
from stampede.results.model import LayoutTrace
from stampede.results.readback import Read, read_sidecar, read_trace
from stampede.results.recorder import Recorder

LAYOUTS = ("restore/shared", "restore/sharded")


def rows(count: int, rank_offset: int = 0) -> np.ndarray:
    return np.array([[0, OP_CODE["read"], 10 * n, 10 * n + 7, 4096, 1, rank_offset + n % 2,
                      0, 4096 * n] for n in range(count)], dtype=np.int64)


def write_trace(path: Path, count: int = 40) -> Path:
    """A trace of two layouts as `run --trace` writes it."""
    return traces.write_trace(path, {layout: LayoutTrace(rows(count, index), ["f"])
                                     for index, layout in enumerate(LAYOUTS)},
                              {"run_id": "r1", "hosts_by_rank": ["a", "a"]})


def write_sidecar(directory: Path) -> Path:
    """A sidecar as the recorder writes it."""
    recorder = Recorder(directory / "a.csv", "r1", "run", lambda rows, sidecar: None)
    return recorder.record([{"run_id": "r1", "layout": "sharded", "op": "read"}],
                           {"layouts": {"sharded": {"stats": {"timeline": []}}}})


def write_journal(directory: Path) -> Path:
    versions.write_journal(PosixBackend(str(directory)), versions.new_journal(False))
    return directory / versions.JOURNAL_NAME


def write_manifest(directory: Path) -> Path:
    manifest.write_manifest(PosixBackend(str(directory)), manifest.new_manifest())
    return directory / manifest.MANIFEST_NAME


def truncated(data: bytes) -> bytes:
    return data[:len(data) * 2 // 3]


def flipped(data: bytes, at: int) -> bytes:
    changed = bytearray(data)
    changed[at] ^= 0x01
    return bytes(changed)


def json_flipped(data: bytes) -> bytes:
    """JSON has no checksum: a flipped byte is found where it breaks the syntax, so the
    flip lands on the first ':' (a byte inside a string can read as written: the
    journal's and the manifest's types are checked by their own modules)."""
    return flipped(data, data.index(b":"))


def trace_flipped(data: bytes) -> bytes:
    """A byte inside the second layout's rows (its CRC-32 fails)."""
    import io
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo("layout_1.npy")
    return flipped(data, info.header_offset + 120)


def read_json_kind(read: Callable[[Path], Read[object]]) -> Callable[[Path], str]:
    """The note a report's reader gives."""
    def note(path: Path) -> str:
        found = read(path)
        assert found.value is None and len(found.notes) == 1, found
        return found.notes[0]
    return note


def refused(read: Callable[[PosixBackend, str], object]) -> Callable[[Path], str]:
    """The CheckpointError clean, save and run stop with: the note, and what to do."""
    def note(path: Path) -> str:
        with pytest.raises(CheckpointError) as raised:
            read(PosixBackend(str(path.parent)), str(path.parent))
        assert "by hand" in raised.value.hint
        return raised.value.message
    return note


def trace_note(path: Path) -> str:
    found = read_trace(path)
    assert len(found.notes) == 1, found.notes
    return found.notes[0]


KINDS = {   # kind -> (its writer, its reader's note, damages as (name, bytes -> bytes, says))
    "trace": (lambda d: write_trace(d / "r1.trace.npz"), trace_note, [
        ("truncated", truncated, "the trace is truncated at byte"),
        ("one byte flipped", trace_flipped, "the trace is damaged: the rows of "
                                            "restore/sharded: its CRC-32 checksum fails"),
        ("empty", lambda data: b"", "the trace is empty (0 bytes)"),
        ("not a trace", lambda data: b'{"run_id": "r1"}', "the trace is not a zip"),
    ]),
    "sidecar": (write_sidecar, read_json_kind(read_sidecar), [
        ("truncated", truncated, "the sidecar is truncated: its JSON ends early"),
        ("one byte flipped", json_flipped, "the sidecar is not valid JSON"),
        ("empty", lambda data: b"", "the sidecar is empty (0 bytes)"),
        ("not a sidecar", lambda data: b'{"layouts": [1, 2]}',
         "the sidecar's layouts is not a table of layouts (it holds a list)"),
    ]),
    "journal": (write_journal, refused(versions.read_journal), [
        ("truncated", truncated, "the save journal is truncated: its JSON ends early"),
        ("one byte flipped", json_flipped, "the save journal is not valid JSON"),
        ("empty", lambda data: b"", "the save journal is empty (0 bytes)"),
        ("not a journal", lambda data: b"[1, 2]", "the save journal is not a JSON object "
                                                  "(it holds a list)"),
    ]),
    "manifest": (write_manifest, refused(manifest.read_manifest), [
        ("truncated", truncated, "the manifest is truncated: its JSON ends early"),
        ("one byte flipped", json_flipped, "the manifest is not valid JSON"),
        ("empty", lambda data: b"", "the manifest is empty (0 bytes)"),
        ("not a manifest", lambda data: b'"stampede"', "the manifest is not a JSON object "
                                                       "(it holds a string)"),
    ]),
}
CASES = [(kind, name) for kind, (_, _, damages) in KINDS.items() for name, _, _ in damages]


@pytest.mark.parametrize(("kind", "damage"), CASES, ids=[f"{k}-{d}" for k, d in CASES])
def test_each_kind_damaged_each_way_is_a_note_naming_the_file(tmp_path: Path, kind: str,
                                                              damage: str) -> None:
    write, note_of, damages = KINDS[kind]
    path = write(tmp_path)
    _, change, says = next(each for each in damages if each[0] == damage)
    path.write_bytes(change(path.read_bytes()))
    note = note_of(path)
    assert note.startswith(f"{path}: ") and says in note, note
    assert "\n" not in note and "Traceback" not in note


def test_every_kind_reads_back_whole_as_written(tmp_path: Path) -> None:
    trace = read_trace(write_trace(tmp_path / "r1.trace.npz"))
    assert trace.notes == () and trace.value is not None
    assert list(trace.value.layouts) == list(LAYOUTS)
    assert np.array_equal(trace.value.layouts["restore/sharded"], rows(40, 1))
    path = write_sidecar(tmp_path)
    sidecar = read_sidecar(path)
    assert sidecar.notes == () and sidecar.value is not None
    assert sidecar.value["layouts"] == {"sharded": {"stats": {"timeline": []}}}
    path.unlink()   # a hand-made sidecar, not a run's: the session checks runs' against their schema
    write_journal(tmp_path)
    write_manifest(tmp_path)
    assert versions.read_journal(PosixBackend(str(tmp_path)), str(tmp_path)) is not None
    assert manifest.read_manifest(PosixBackend(str(tmp_path)), str(tmp_path)) is not None


def test_a_missing_or_unreadable_file_is_a_note_too(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "r1.trace.npz")   # a FIFO would hang a plain read
    assert read_trace(tmp_path / "r1.trace.npz").notes == (
        f"{tmp_path / 'r1.trace.npz'}: is a FIFO, not a regular file, so not a trace",)
    assert read_sidecar(tmp_path / "none.json") == Read(None, (
        f"{tmp_path / 'none.json'}: cannot read the sidecar (No such file or directory)",))


def test_a_trace_cut_anywhere_or_with_any_byte_flipped_is_what_was_written_or_a_note(
        tmp_path: Path) -> None:
    """Every cut and every single flipped byte: no exception, and each layout it returns
    holds exactly the rows written; where a layout is missing, or nothing reads, a note
    names the file and says so. A flip the zip never reads (a local header's date, the
    zip's comment length) is harmless: the trace reads whole, silently."""
    original = write_trace(tmp_path / "r1.trace.npz", count=6).read_bytes()
    written = {layout: rows(6, index) for index, layout in enumerate(LAYOUTS)}
    damaged = tmp_path / "d.trace.npz"
    kinds = {"whole": 0, "in part": 0, "nothing": 0}
    variants = [original[:cut] for cut in range(len(original))] + \
        [flipped(original, at) for at in range(len(original))]
    for data in variants:
        damaged.write_bytes(data)
        found = read_trace(damaged)
        got = found.value.layouts if found.value is not None else {}
        for layout, layout_rows in got.items():
            assert np.array_equal(layout_rows, written[layout]), (layout, len(data))
        if len(got) < len(LAYOUTS):
            assert len(found.notes) == 1 and found.notes[0].startswith(f"{damaged}: the trace")
            lost = [layout for layout in LAYOUTS if layout not in got]
            said = found.notes[0]
            assert ("nothing of it can be read" in said) if not got else \
                said.endswith(f"read without {', '.join(lost)}")
        kinds["whole" if len(got) == len(LAYOUTS) else "in part" if got else "nothing"] += 1
    # each outcome happens: cuts after the first layout keep it, flips in a layout's rows
    # cost that layout only, flips in the meta or cuts inside it cost everything
    assert all(kinds.values()), kinds


def test_the_sidecar_a_report_reads_is_a_note_and_the_figures_are_skipped(
        tmp_path: Path) -> None:
    from stampede.results.archived import Archive

    path = write_sidecar(tmp_path)
    path.write_bytes(truncated(path.read_bytes()))
    shown = Archive([{"run_id": "r1"}], (tmp_path / "a.csv",)).beside(["r1"])
    assert shown.sidecars == {} and shown.traces == {}
    notes = shown.notes
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"run r1: no readable sidecar: {path}: the sidecar is truncated")
    assert notes[0].endswith(": skipping the cdf and timeline figures")


@pytest.mark.mpi
def test_a_traced_archive_whose_trace_is_cut_or_flipped_is_still_analyzed_and_reported(
        stampede, tmp_path: Path) -> None:
    """E2: `analyze` and `report --html` of a real run's archive whose trace was truncated,
    then had one byte flipped: exit 0, the note naming the trace on stderr (and in the
    page), the report written without the layout the damage cost. A trace of which
    nothing reads is one line for analyze (its one input, exit 2), a note for the report."""
    import html

    from tests.helpers.jobs import small_job

    job = small_job(tmp_path, run={"iterations": 2, "warmup": 0, "verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    ran = stampede("run", str(job), "--trace", np=2)
    assert ran.returncode == 0, ran.stderr
    archive = tmp_path / "results" / "job.csv"
    [trace] = (tmp_path / "results" / "job.runs").glob("*.trace.npz")
    original = trace.read_bytes()
    infos = {info.filename: info for info in zipfile.ZipFile(trace).infolist()}
    cut = infos["layout_1.npy"].header_offset + 100
    cases = {
        "truncated": (original[:cut], f"the trace is truncated at byte {cut:,} (inside the "
                                      "rows of restore/sharded): read without restore/sharded"),
        "flipped": (flipped(original, infos["layout_1.npy"].header_offset + 120),
                    "the trace is damaged: the rows of restore/sharded: its CRC-32 checksum "
                    "fails: read without restore/sharded"),
    }
    for name, (data, says) in cases.items():
        trace.write_bytes(data)
        note = f"{trace}: {says}"
        analyzed = stampede("analyze", str(archive))
        assert analyzed.returncode == 0, (name, analyzed.stderr)
        assert analyzed.stderr.splitlines() == [f"stampede: note: {note}"], analyzed.stderr
        said = " ".join(analyzed.stdout.split())
        assert "restore/shared: iteration" in said and "restore/sharded: iteration" not in said
        page = tmp_path / f"{name}.html"
        reported = stampede("report", str(archive), "--html", str(page))
        assert reported.returncode == 0, (name, reported.stderr)
        assert f"stampede: note: {note}" in reported.stderr.splitlines()
        assert "Traceback" not in reported.stderr and page.is_file()
        written = page.read_text()
        assert html.escape(note) in written
        assert "restore/shared: ranks inside a storage op over time" in written
        assert "restore/sharded: ranks inside a storage op over time" not in written
    trace.write_bytes(flipped(original, infos["meta.npy"].header_offset + 200))
    note = (f"{trace}: the trace is damaged: its meta (op names, layouts): its CRC-32 "
            "checksum fails: nothing of it can be read")
    analyzed = stampede("analyze", str(archive))
    assert analyzed.returncode == 2 and analyzed.stderr.splitlines()[0] == \
        f"stampede analyze: error: {note}", analyzed.stderr
    reported = stampede("report", str(archive), "--html", str(tmp_path / "meta.html"))
    assert reported.returncode == 0 and f"stampede: note: {note}" in reported.stderr
    assert "ranks inside a storage op over time" not in (tmp_path / "meta.html").read_text()
