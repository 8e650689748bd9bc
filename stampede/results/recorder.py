"""One run's archive as it is measured: what every measuring command (run, save, cycle,
rejoin, startup, gpu, loaders) records, the one way.

A run is recorded in parts (a layout, a whole sweep): each part's rows are first handed
to the command's renderer (stampede.present: the results are shown even when the archive
then refuses them), then appended whole or not at all, then the run's sidecar is
rewritten whole with everything so far. A run stopped after a part (a signal, a failure,
a full disk) keeps every part recorded before it. The sidecar's envelope (schema, run id,
command) is stamped here, so that its shape is the one results/sidecar-N.schema.json
writes down for each command. Rank 0's alone: results knows nothing of MPI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from stampede.results.archive import append_rows, write_sidecar
from stampede.results.columns import ARCHIVE_SCHEMA

Row = dict[str, str]
# The renderer of a part: its rows and the sidecar about to be written (the facts the
# rows cannot hold, such as an NFS target's RPCs, are shown from it).
Show = Callable[[Sequence[Row], Mapping[str, Any]], None]


class Recorder:
    """The archive (CSV rows, sidecar) of one run of one command, and what it holds so far."""

    def __init__(self, archive: str | Path, run_id: str, command: str, show: Show) -> None:
        self.archive, self.run_id, self.command, self.show = str(archive), run_id, command, show
        self.rows: list[Row] = []
        self.sidecar_file: Path | None = None

    def record(self, rows: Sequence[Row], sidecar: Mapping[str, object]) -> Path:
        """One part: shown, its rows appended whole, the sidecar (everything the run's
        rows cannot hold, so far) rewritten whole; returns the sidecar's path."""
        document = {**sidecar, "schema": ARCHIVE_SCHEMA, "run_id": self.run_id,
                    "command": self.command}
        self.show(rows, document)
        append_rows(self.archive, rows)
        self.rows += rows
        self.sidecar_file = write_sidecar(self.archive, self.run_id, document)
        return self.sidecar_file

    def archived(self, beside: str = "") -> str:
        """The line a report ends with: where the rows and the sidecar are (and `beside`:
        what else the run wrote next to them, ", trace PATH")."""
        return f"archived: {self.archive} (+ {self.sidecar_file}{beside})"
