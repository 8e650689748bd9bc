"""One run's archive as it is measured: what every measuring command (run, save, cycle,
rejoin, startup, gpu, loaders) records, the one way.

A run is recorded in parts (a layout, a whole sweep). Each part's rows are first handed
to the command's renderer (stampede.present: the results are shown even when the archive
then refuses them); then the files that describe them are written whole under temporary
names (the sidecar, rewritten with everything so far; with --trace, the trace so far);
then the rows are appended whole or not at all; only then are the files renamed into
place. So a part's rows are in the archive, valid, only when its sidecar and trace were
written: a full disk, a quota or an I/O error at any step leaves the archive, the sidecar
and the trace as the parts before left them, no temporary file behind, and one line
naming the file that failed (RunFailed, exit 1). A run stopped after a part (a signal, a
failure) keeps every part recorded before it. The sidecar's envelope (schema, run id,
command) is stamped here, so that its shape is the one results/sidecar-N.schema.json
writes down for each command. Rank 0's alone: results knows nothing of MPI.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stampede.errors import RunFailed
from stampede.results.archive import append_rows, sidecar_path, write_sidecar
from stampede.results.cells import Row as Typed
from stampede.results.cells import typed
from stampede.results.columns import ARCHIVE_SCHEMA
from stampede.results.trace import trace_path

Row = dict[str, str]
# The renderer of a part: its rows (typed, as a reader of the archive gets them) and the
# sidecar about to be written (the facts the rows cannot hold, such as an NFS target's RPCs,
# are shown from it).
Show = Callable[[Sequence[Typed], Mapping[str, Any]], None]
# A file that describes a part's rows (the sidecar; the trace so far, --trace), written
# whole into the path it is given.
Write = Callable[[Path], object]


class Recorder:
    """The archive (CSV rows, sidecar) of one run of one command, and what it holds so far."""

    def __init__(self, archive: str | Path, run_id: str, command: str, show: Show) -> None:
        self.archive, self.run_id, self.command, self.show = str(archive), run_id, command, show
        self.rows: list[Typed] = []   # what was recorded so far, as a reader gets it
        self.sidecar_file: Path | None = None

    def record(self, rows: Sequence[Row], sidecar: Mapping[str, object],
               trace: Write | None = None) -> Path:
        """One part: shown; the sidecar (everything the run's rows cannot hold, so far)
        and the trace (`trace`: its writer) staged; the rows appended whole; the staged
        files put in place; returns the sidecar's path."""
        document = {**sidecar, "schema": ARCHIVE_SCHEMA, "run_id": self.run_id,
                    "command": self.command}
        read = [typed(row) for row in rows]   # shown as a reader of the archive gets them
        self.show(read, document)
        path = sidecar_path(self.archive, self.run_id)
        writers: list[tuple[str, Path, Write]] = [
            ("sidecar", path, lambda temporary: write_sidecar(temporary, document))]
        if trace is not None:
            writers.append(("trace", trace_path(path), trace))
        staged: list[tuple[Path, Path]] = []   # (written whole under a temporary name, its place)
        try:
            for what, place, write in writers:
                staged.append((_staged(what, place, write, len(rows)), place))
            append_rows(self.archive, rows)   # whole or not at all (RunFailed)
        except BaseException:
            for temporary, _ in staged:
                temporary.unlink(missing_ok=True)
            raise
        self.rows += read
        for temporary, place in staged:   # a rename in one directory: it needs no space
            try:
                os.replace(temporary, place)
            except OSError as error:
                temporary.unlink(missing_ok=True)
                raise RunFailed(f"{place}: putting it in place failed ({error.strerror}) "
                                f"after its {len(rows)} row(s) were archived") from None
        self.sidecar_file = path
        return path

    def archived(self, beside: str = "") -> str:
        """The line a report ends with: where the rows and the sidecar are (and `beside`:
        what else the run wrote next to them, ", trace PATH")."""
        return f"archived: {self.archive} (+ {self.sidecar_file}{beside})"


def _staged(what: str, place: Path, write: Write, nrows: int) -> Path:
    """`write` run into a temporary name beside `place`, which it returns; RunFailed naming
    the file when it cannot be written (the part's rows are then not archived either)."""
    temporary = place.with_name(f".{place.name}.tmp")
    try:
        write(temporary)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise RunFailed(f"{place}: writing the run's {what} failed ({error.strerror or error}); "
                        f"its {nrows} row(s) not archived: the archive, the sidecar and the "
                        "trace are as the parts before them left them") from None
    return temporary
