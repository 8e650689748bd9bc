"""What archives hold, read once: the read side's one way in (the recorder is the write side's).

An `Archive` is opened at a command's edge (`Archive.open(*paths)`) and handed to the model
and the presenters, which never read a file themselves (tests/test_house.py):
- the rows of every file, read once (stampede.results.archive.read_rows: any schema,
  upgraded to today's terms), in order: the files as given, each file's rows as appended;
- every cell typed once through the column registry (stampede.results.cells.typed: a
  float, an int, a bool or a str as the column holds): a cell that is not what its column
  holds is the one error naming the file, its line, the column and the value, before
  anything is rendered; readers take `row["column"]` as it is;
- the runs a verdict uses chosen in one place, once: `latest` (the last valid run of an op,
  by layout), `rejoin_runs` (stampede rejoin's, a verdict of their own), `term_runs` (the
  runs behind T_MTTR's measured terms of a layout), and a verdict restricted to one set of
  runs (`without`); the model is handed what they chose and reads nothing;
- each run's sidecar and trace read on demand, cached, through stampede.results.readback
  (a damaged one is a Read with a note: the caller says it); `beside`: a page's at once.

An Archive is also built in memory (`Archive(rows)`, typed there too; sidecars by run id):
the model's tests give it rows, never a CSV."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from stampede.results.cells import SOURCE, Row, typed
from stampede.results.readback import Document, Read
from stampede.results.tiers import SPARE_START, TIER_RESTORES

if TYPE_CHECKING:
    from stampede.results.trace import Trace


@dataclass(frozen=True)
class Chosen:
    """A row a verdict term comes from, and the file it came from (the name the page says)."""

    row: Row
    name: str


@dataclass(frozen=True)
class TermRuns:
    """The runs the measured T_MTTR terms of one restore layout come from (Archive.term_runs),
    chosen once: each from the last archive file that holds it."""

    startup: Chosen | None = None   # the latest startup run: T_pod_init
    barrier: Chosen | None = None   # its MPI barrier: part of T_barrier_sync
    restore: Chosen | None = None   # the latest restore from storage, its fastest row: BW_rank
    pg_init: Row | None = None      # that restore's process-group set-up (run.exchange = torch)
    sidecar: Document | None = None   # that restore's run's sidecar: its time to first byte
    # every startup run's barrier, all rank counts, all files: T_barrier_sync at a target
    barriers: tuple[Row, ...] = ()


@dataclass(frozen=True)
class Beside:
    """The sidecars and traces of some runs (Archive.beside), by run id, and the notes on
    those that are missing (a run without a sidecar) or damaged."""

    sidecars: dict[str, Document]
    traces: dict[str, Trace]
    notes: list[str]   # a sidecar missing or not readable
    damaged: list[str] = field(default_factory=list)   # a trace that does not read whole


@dataclass(eq=False)
class Archive:
    """The rows of one or several archives and, on demand, their runs' sidecars and traces."""

    rows: list[Row]   # typed (cells.typed) when the Archive is made
    paths: tuple[Path, ...] = ()
    names: tuple[str, ...] = ()   # the paths as given (the label the reports print)
    # in memory (tests): run id -> sidecar; opened from files: read from ARCHIVE.runs/
    sidecars: Mapping[str, Document] | None = None
    # what was read of ARCHIVE.runs/, by run id (shared by the Archives `parts` and `without`
    # make: a sidecar is read once per command)
    _sidecars: dict[str, Read[Document]] = field(default_factory=dict, repr=False)
    _traces: dict[str, Read[Trace] | None] = field(default_factory=dict, repr=False)
    _rejoin_runs: list[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.rows = [typed(row) for row in self.rows]   # a typed Row comes back as it is

    @classmethod
    def open(cls, *paths: str | Path) -> Archive:
        """The archives at `paths`, read once and typed cell by cell."""
        from stampede.results.archive import read_rows

        return cls([typed(row) for path in paths for row in read_rows(path)],
                   tuple(Path(path) for path in paths), tuple(str(path) for path in paths))

    # --- naming ---

    @property
    def label(self) -> str:
        """The files, as given on the command line (", " between them)."""
        return ", ".join(self.names or (str(path) for path in self.paths))

    def __bool__(self) -> bool:
        return bool(self.rows)

    # --- runs ---

    def runs(self) -> list[str]:
        """Run ids in the order they were appended."""
        return list(dict.fromkeys(row["run_id"] for row in self.rows))

    def run_rows(self, run_id: str) -> list[Row]:
        return [row for row in self.rows if row["run_id"] == run_id]

    def rejoin_runs(self) -> list[str]:
        """The runs of `stampede rejoin` (those holding both of its restores, a verdict of
        their own, never layouts to rank among the others), in order; found once."""
        if self._rejoin_runs is None:
            restores: dict[str, set[str]] = {}
            for row in self.rows:
                if row["op"] == "restore":
                    restores.setdefault(row["run_id"], set()).add(row["layout"])
            self._rejoin_runs = [run_id for run_id, layouts in restores.items()
                                 if set(TIER_RESTORES) <= layouts]
        return self._rejoin_runs

    def latest(self, op: str, layout: str = "") -> Row | None:
        """The last valid row of `op` (of `layout`, when given) with a time to last rank:
        the run a verdict term comes from."""
        chosen = [row for row in self.rows if row["op"] == op and row["valid"]
                  and not math.isnan(row["time_to_last_rank_s"])
                  and (not layout or row["layout"] == layout)]
        return chosen[-1] if chosen else None

    def term_runs(self, layout: str) -> TermRuns:
        """The runs T_MTTR's measured terms of restore `layout` ("": any) come from, file by
        file, a later file's run replacing an earlier's term by term: the latest startup
        and its barrier; the latest valid restore of a checkpoint (not `stampede gpu`'s
        copies) from storage (a warm one only where no other is), its least time to last
        rank, with its pg_init row and its run's sidecar; every startup's barrier."""
        found = TermRuns(barriers=tuple(
            row for row in self.rows if row["op"] == "barrier" and row["valid"]
            and math.isfinite(row["lat_p50_s"]) and row["nranks"] >= 1
            and row["layout"] != SPARE_START))
        for part in self.parts():
            # a rejoin's spare-start is its spares' start-up, not a job's (the rejoin's own)
            startup = part.without_layout(SPARE_START).latest("startup")
            if startup is not None:
                name = part.name_of(startup)
                found = replace(found, startup=Chosen(startup, name))
                barrier = next((row for row in reversed(part.rows) if row["op"] == "barrier"
                                and row["run_id"] == startup["run_id"]), None)
                if barrier is not None and math.isfinite(barrier["lat_p50_s"]):
                    found = replace(found, barrier=Chosen(barrier, name))
            restores = [row for row in part.rows if row["op"] == "restore" and row["valid"]
                        and row["phase"] == "restore" and math.isfinite(row["slowest_rank_gbps"])
                        and (not layout or row["layout"] == layout)]
            storage = [row for row in restores if row["cache"] != "warm"] or restores
            if storage:
                run_id = storage[-1]["run_id"]
                best = min((row for row in storage if row["run_id"] == run_id),
                           key=lambda row: row["time_to_last_rank_s"])
                pg_init = next((row for row in part.rows if row["op"] == "pg_init"
                                and math.isfinite(row["elapsed_s"]) and row["run_id"] == run_id
                                and row["layout"] == best["layout"]), None)
                found = replace(found, restore=Chosen(best, part.name_of(best)), pg_init=pg_init,
                                sidecar=part.sidecar(run_id).value)
        return found

    def parts(self) -> list[Archive]:
        """One Archive per file (a verdict term read file by file, the later file's winning),
        sharing this one's sidecars."""
        if len(self.paths) < 2:
            return [self]
        return [self._with([row for row in self.rows if row.get(SOURCE) == str(path)], (path,),
                           (name,)) for path, name in zip(self.paths, self.names, strict=True)]

    def without(self, run_ids: Iterable[str]) -> Archive:
        """These runs left out (a verdict that must not draw on them), sidecars shared."""
        dropped = set(run_ids)
        return self._with([row for row in self.rows if row["run_id"] not in dropped], self.paths,
                          self.names)

    def without_layout(self, layout: str) -> Archive:
        """A layout's rows left out, sidecars shared."""
        return self._with([row for row in self.rows if row["layout"] != layout], self.paths,
                          self.names)

    def name_of(self, row: Row) -> str:
        """The file name a row came from (the archive's label in memory)."""
        source = row.get(SOURCE)
        return Path(source).name if source else self.label or "archive"

    # --- sidecars and traces, on demand ---

    def sidecar(self, run_id: str) -> Read[Document]:
        """The run's sidecar (ARCHIVE.runs/RUN_ID.json), read once: a missing or damaged
        one is a Read with a note naming the file."""
        if self.sidecars is not None or not self.paths:   # in memory
            document = (self.sidecars or {}).get(run_id)
            return Read(document, () if document is not None else
                        (f"run {run_id}: no sidecar in memory",))
        if run_id not in self._sidecars:
            from stampede.results.readback import read_sidecar

            path = self._sidecar_path(run_id)
            self._sidecars[run_id] = read_sidecar(path)
        return self._sidecars[run_id]

    def trace(self, run_id: str) -> Read[Trace] | None:
        """The run's trace (--trace), read once; None for a run without one."""
        if self.sidecars is not None or not self.paths:   # in memory: no traces
            return None
        if run_id not in self._traces:
            from stampede.results.readback import read_trace
            from stampede.results.trace import trace_path

            path = trace_path(self._sidecar_path(run_id))
            self._traces[run_id] = (read_trace(path) if path.exists() or path.is_symlink()
                                    else None)
        return self._traces[run_id]

    def beside(self, run_ids: Iterable[str], traces: bool = True) -> Beside:
        """What the rows of the runs a page shows cannot hold, read once: each run's sidecar
        and (`traces`) its trace where it has one; a note on each that does not read whole."""
        found = Beside({}, {}, [])
        for run_id in dict.fromkeys(run_ids):
            sidecar = self.sidecar(run_id)
            found.notes.extend(f"run {run_id}: no readable sidecar: {note}: skipping the cdf "
                               "and timeline figures" for note in sidecar.notes)
            if sidecar.value is None:
                continue
            found.sidecars[run_id] = sidecar.value
            trace = self.trace(run_id) if traces else None
            if trace is not None:   # None: a run without --trace
                found.damaged.extend(trace.notes)
                if trace.value is not None:   # a damaged one in part: the layouts that read
                    found.traces[run_id] = trace.value
        return found

    def _sidecar_path(self, run_id: str) -> Path:
        from stampede.results.archive import sidecar_path

        source = next((row.get(SOURCE) for row in self.rows if row["run_id"] == run_id), None)
        return sidecar_path(source or self.paths[-1], run_id)

    def _with(self, rows: list[Row], paths: tuple[Path, ...], names: tuple[str, ...]) -> Archive:
        return Archive(rows, paths, names, self.sidecars, self._sidecars, self._traces)
