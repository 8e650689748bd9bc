"""The one reader of what stampede wrote and reads back: a run's sidecar
(ARCHIVE.runs/RUN_ID.json) and trace (RUN_ID.trace.npz) beside its archive, and a
target's manifest and save journal (their bytes, through the backend).

A file can come back damaged: a disk that filled up, a copy cut short, a flipped bit, a
hand edit. Whatever is wrong is a note naming the file and what: empty, truncated, not
UTF-8, not valid JSON, not a JSON object, not a zip, a checksum that fails, an array
missing; never a traceback (`BadZipFile`, `JSONDecodeError`, `KeyError`). A Read holds
what could be used (None when nothing could) and the notes; the caller decides what a
note costs:
- a report (`report`, `report --html`, `plot`, `mttr`, `analyze`) goes on without that
  part and shows the note (stderr: "stampede: note: ...", and the HTML page's notes);
- a command that would write or remove files on the strength of it (`clean`, `save`,
  `run` against the manifest, the journal) stops: checkpoint.manifest.read_document turns
  the note into one CheckpointError (exit 2) naming the file and what to do.

A trace reads in part where it can: numpy writes an .npz as a zip of one .npy member per
array, each with its CRC-32, so a flipped byte costs the layout whose rows it hit (its
checksum fails) and a truncated file the layouts after the cut (their members are read
by walking the local headers when the zip's directory at its end is gone). The meta
(the op names, the columns, the layouts) is the one member without which nothing reads.
JSON carries no checksum: a flipped byte that leaves valid JSON of the right shape reads
as written (the manifest's and the journal's types are checked by their modules).
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from stampede.errors import UsageError
from stampede.values import read_bytes

if TYPE_CHECKING:   # numpy only where a trace is read: the manifest's readers import this
    import numpy as np

    from stampede.results.trace import Trace

T = TypeVar("T")
Document = dict[str, object]   # a JSON object read back (its keys checked by its reader)

# What a damaged zip or .npy member raises as it is read (a flipped byte in a header can
# reach any of them: a bad size, an unknown compression method, a dtype numpy refuses).
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, OSError,
            zlib.error, struct.error, NotImplementedError, UnicodeDecodeError, KeyError,
            TypeError, RuntimeError)   # RuntimeError: a flipped flag that says "encrypted"

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")   # zip's local file header (30 bytes)
_LOCAL_SIGNATURE = b"PK\x03\x04"
_DIRECTORY_SIGNATURE = b"PK\x01\x02"             # the central directory: the members end
_ZIP64_EXTRA = 0x0001
CHECKSUM_FAILS = "its CRC-32 checksum fails"


@dataclass(frozen=True)
class Read(Generic[T]):
    """What was read back: the value (None when nothing of it could be used) and the notes
    saying what was wrong, each naming the file (a value with notes was read in part)."""
    value: T | None
    notes: tuple[str, ...] = ()


def parse_json(data: bytes, where: str, what: str) -> Read[Document]:
    """`data` (the file at `where`, `what` it is: "sidecar", "save journal") as a JSON
    object, or a note saying why it is not one."""
    def note(problem: str) -> Read[Document]:
        return Read(None, (f"{where}: the {what} {problem}",))

    if not data.strip():
        return note(f"is empty ({len(data)} bytes)")
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        return note(f"is not UTF-8 text (byte {error.start:,} is damaged)")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        # a string left open can only be the text's end (a line break inside one is an
        # error of its own)
        if error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string"):
            return note(f"is truncated: its JSON ends early, at byte {len(data):,} ({error.msg})")
        return note(f"is not valid JSON: {error.msg} at line {error.lineno} column "
                    f"{error.colno} (a damaged byte?)")
    if not isinstance(document, dict):
        return note(f"is not a JSON object (it holds {_kind(document)})")
    return Read(document)


def read_json(path: Path, what: str) -> Read[Document]:
    """A JSON object stampede wrote into a local file, or a note (a missing file, a FIFO or
    a directory in its place included)."""
    try:
        data = read_bytes(path, what)
    except UsageError as error:
        return Read(None, (str(error),))
    return parse_json(data, str(path), what)


def read_sidecar(path: Path) -> Read[Document]:
    """A run's sidecar: a JSON object whose layouts and saves, where it has them, are tables
    of layouts (what the reports read from it)."""
    found = read_json(path, "sidecar")
    document = found.value
    if document is None:
        return found
    for part in ("layouts", "saves"):
        entries = document.get(part)
        if entries is not None and not (isinstance(entries, dict)
                                        and all(isinstance(e, dict) for e in entries.values())):
            return Read(None, (f"{path}: the sidecar's {part} is not a table of layouts (it "
                               f"holds {_kind(entries)})",))
    return found


def read_trace(path: Path) -> Read[Trace]:
    """A run's trace, whole or in part: the layouts whose rows read, and a note naming the
    file, what is wrong and the layouts it is read without; None when nothing reads (no
    meta, or no layout)."""
    import numpy as np

    from stampede.results.trace import Trace

    try:
        data = read_bytes(path, "trace")
    except UsageError as error:
        return Read(None, (str(error),))

    def nothing(problem: str) -> Read[Trace]:
        return Read(None, (f"{path}: the trace {problem}: nothing of it can be read",))

    if not data:
        return nothing("is empty (0 bytes)")
    if not data.startswith(_LOCAL_SIGNATURE):
        return nothing("is not a zip (numpy .npz) file")
    members, problems = _members(data)
    cut = bool(problems)   # the members after a cut or damage are not there to miss
    array = members.get("meta.npy")
    if array is None:
        return nothing(_named("; ".join(problems), [])
                       if problems else "is an .npz without a meta array (not a stampede trace)")
    meta, problem = _meta(array)
    if meta is None:
        return nothing(problem)
    names, columns = meta["layouts"], meta["columns"]
    assert isinstance(names, list) and isinstance(columns, list)   # _meta checked them
    layouts: dict[str, np.ndarray] = {}
    lost: list[str] = []
    for index, name in enumerate(names):
        member = f"layout_{index}.npy"
        rows = members.get(member)
        if isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype == np.int64 \
                and rows.shape[1] == len(columns):
            layouts[name] = _widened(rows)
            continue
        lost.append(name)
        if isinstance(rows, np.ndarray):
            problems.append(f"has {member} that is not rows ({rows.dtype}, shape {rows.shape})")
        elif member not in members and not cut:
            problems.append(f"lacks {member}")
    said = _named("; ".join(problems), names)
    if not layouts:
        return nothing(said)
    if not problems:
        return Read(Trace(meta, layouts))
    return Read(Trace(meta, layouts), (f"{path}: the trace {said}: " + (
        f"read without {', '.join(lost)}" if lost else "every layout's rows read whole"),))


def _named(problem: str, names: list[str]) -> str:
    """A problem in the trace's words: the members it names as what they hold."""
    for index, name in enumerate(names):
        problem = problem.replace(f"layout_{index}.npy", f"the rows of {name}")
    return problem.replace("meta.npy", "its meta (op names, layouts)")


def _members(data: bytes) -> tuple[dict[str, np.ndarray | None], list[str]]:
    """Each member that reads, as its array (None where it failed), and what went wrong:
    through the zip's directory, or, when that is gone (a truncated file), by walking the
    members' local headers from the start."""
    import numpy as np

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except _DAMAGED:
        return _walk(data)
    found: dict[str, np.ndarray | None] = {}
    problems = []
    for info in archive.infolist():
        try:
            with archive.open(info) as stream:
                found[info.filename] = np.lib.format.read_array(stream, allow_pickle=False)
        except _DAMAGED as error:
            found[info.filename] = None
            problems.append(f"is damaged: {info.filename}: {_said(error)}")
    return found, problems


def _walk(data: bytes) -> tuple[dict[str, np.ndarray | None], list[str]]:
    """The members before the damage, read from their local headers (numpy writes their
    sizes and CRC there: a seekable file, zip64 extras); what stopped the walk, and each
    member whose checksum failed on the way."""
    import numpy as np

    found: dict[str, np.ndarray | None] = {}
    problems: list[str] = []
    offset = 0
    while not data.startswith(_DIRECTORY_SIGNATURE, offset):
        if offset >= len(data):
            return found, [*problems, f"ends at byte {offset:,}, without its zip directory "
                                      "(truncated?)"]
        if not data.startswith(_LOCAL_SIGNATURE, offset):
            return found, [*problems, f"is damaged at byte {offset:,} (not a zip member)"]
        head = data[offset:offset + _LOCAL_HEADER.size]
        if len(head) < _LOCAL_HEADER.size:
            return found, [*problems, f"is truncated at byte {len(data):,} (inside a "
                                      "member's header)"]
        (_, _, flags, method, _, _, crc, compressed, _, name_length,
         extra_length) = _LOCAL_HEADER.unpack(head)
        start = offset + _LOCAL_HEADER.size
        name = data[start:start + name_length].decode(errors="replace")
        extra = data[start + name_length:start + name_length + extra_length]
        begin = start + name_length + extra_length
        if begin > len(data):
            return found, [*problems, f"is truncated at byte {len(data):,} (inside {name}'s "
                                      "header)"]
        compressed = _zip64_size(extra, compressed)
        body = data[begin:begin + compressed]
        if flags & 0x08 or compressed < 0:   # no size before the data: cannot walk on
            return found, [*problems, f"is damaged at byte {offset:,} ({name}'s header "
                                      "has no size)"]
        if len(body) < compressed:
            return found, [*problems, f"is truncated at byte {len(data):,} (inside {name})"]
        found[name] = None
        if zlib.crc32(body) != crc:
            problems.append(f"is damaged: {name}: {CHECKSUM_FAILS}")
        else:
            try:
                payload = body if method == zipfile.ZIP_STORED else \
                    zlib.decompress(body, -zlib.MAX_WBITS)
                found[name] = np.lib.format.read_array(io.BytesIO(payload), allow_pickle=False)
            except _DAMAGED as error:
                problems.append(f"is damaged: {name}: {_said(error)}")
        offset = begin + compressed
    return found, [*problems, "has its zip directory (at its end) cut short or damaged"]


def _zip64_size(extra: bytes, compressed: int) -> int:
    """The compressed size, from the zip64 extra field where the header's is 0xFFFFFFFF
    (-1: the field is not there, or cut short)."""
    if compressed != 0xFFFFFFFF:
        return compressed
    at = 0
    while at + 4 <= len(extra):
        kind, size = struct.unpack_from("<HH", extra, at)
        if kind == _ZIP64_EXTRA and size >= 16 and at + 4 + 16 <= len(extra):
            return int(struct.unpack_from("<QQ", extra, at + 4)[1])
        at += 4 + size
    return -1


def _meta(array: np.ndarray) -> tuple[Document | None, str]:
    """The trace's meta (a JSON text) checked: its columns, op names and layouts; or what
    is wrong with it, in the words a note gives after "the trace"."""
    from stampede.results.trace import FIRST_COLUMNS, TRACE_COLUMNS

    try:
        meta = json.loads(str(array))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return None, f"has a meta that is not valid JSON ({error})"
    if not isinstance(meta, dict):
        return None, f"has a meta that is not a JSON object (it holds {_kind(meta)})"
    columns = meta.get("columns")
    if columns not in (list(TRACE_COLUMNS), list(FIRST_COLUMNS)):
        return None, f"has the columns {columns!r:.80}, not {list(TRACE_COLUMNS)}"
    for key in ("ops", "layouts"):
        value = meta.get(key)
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            return None, f"has a meta whose {key} = {value!r:.80} is not a list of names"
    return meta, ""


def _widened(rows: np.ndarray) -> np.ndarray:
    """A first trace's rows with file and offset NOWHERE."""
    import numpy as np

    from stampede.results.trace import NOWHERE, TRACE_COLUMNS

    missing = len(TRACE_COLUMNS) - rows.shape[1]
    if missing <= 0:
        return rows
    return np.column_stack([rows, np.full((len(rows), missing), NOWHERE, dtype=np.int64)])


def _said(error: BaseException) -> str:
    if isinstance(error, zipfile.BadZipFile) and "CRC" in str(error):
        return CHECKSUM_FAILS
    return str(error) or error.__class__.__name__


def _kind(value: object) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number",
            bool: "true or false", dict: "an object"}.get(type(value), "null")
