"""The results archive: one CSV row per (run, layout, op), appended, never rewritten;
plus a JSON sidecar per run with the full metadata and per-rank detail.

CSV schema history (bump ARCHIVE_SCHEMA and add a line on every change of columns):
- 1: first schema. DESIGN.md's required columns, then spread columns (*_min/*_max),
     bytes_per_rank, op_bytes, elapsed_s, slowest_rank_gbps, slowest_ranks, storage_s,
     network_s, storage_ops_per_iteration, storage_bytes_per_iteration, device, link_peak_gbps,
     samples (exact | histogram: how the percentiles were made), fs_type, invalid_reason,
     warnings, then one column per job option (spec.OPTIONS[].column).
- 2: retries (per op: requests the client retried, e.g. on 503 SlowDown; not in count),
     cache_resident_pct (cold runs: median over iterations of the share of the bytes to
     read still in the page cache after eviction), and the options storage_options,
     stripe_count, stripe_size, dtype, drop_caches, rank_shift, check_finite,
     checkpoint_source, assign, from.
- 3: phase (restore | save | startup: what the row's run measured; rows of schema 1 and 2
     read as restore), unprotected_s (a save's window without a published checkpoint:
     0 when retention waited for the publish), restored_from (the saved version a run
     restored: saves/LAYOUT/vNNNNNN; empty for a prepared checkpoint), the save's ops and
     pseudo-ops (stampede.results.samples), and the options fanout, save_mode,
     durability, validate, keep, mkdir_by, part_size, restore_from.
- 4: the options workload, scale, subset (layout mlperf: MLPerf Storage's checkpointing)
     and exchange (run.exchange: mpi | torch; rows of schema 1 to 3 read as mpi:
     they all exchanged over MPI). New op values, no column: pg_init, bcast_first,
     allgather_first, d2h (stampede.results.samples); the run.h2d value cuda-gds.
- 5: tool (whose code did the timed I/O: stampede, a loader, an imported tool), so that
     backend says the storage and phase what was measured: loader rows once carried the
     loader in backend (now tool; backend posix), `stampede gpu` rows their --device in
     backend and phase restore (now backend posix for file modes, - for memory ones,
     phase h2d). Rows of schemas 1-4 read in these terms (read_rows derives them).
     With it (the schema unreleased yet): `stampede rejoin`'s notes (what a run says
     beside its numbers, apart from its warnings), tier_local_bytes, tier_peer_bytes,
     tier_storage_bytes, and the tiers.* options tier_dir, tier_peers, tier_placement,
     spare_nodes, lost_nodes, tier_publish, tier_drain, tier_versions, keep_local,
     keep_peer, keep_storage. Its sidecars (results/sidecar-N.schema.json: run, loaders,
     startup, gpu) each carry the command that wrote them; `stampede gpu` writes one too.
- 6: throttles and backoff_s (per storage op, as retries: the throttling answers the
     client met and the seconds it waited); rows of schemas 1-5 read them as empty (not
     counted), the sidecar's layouts and saves carry them beside retries.
- 7: needed_bytes (the unique bytes a restore needed, from the plan) and its read
     amplification: read_amplification (storage_bytes_per_iteration / needed_bytes),
     read_amplification_node_max and read_amplification_rank_max (the worst node's and
     rank's reads over their needed bytes); rows of schemas 1-6 read them as empty (not
     measured). The layout whole-file came with it, and the options copies and
     key_prefix (an object store's restore spread over prefixes; rows before read as 1
     and none).
- 8: the raw-read ceiling (run.ceiling, measured before the first layout): ceiling_gbps
     and ceiling_gbps_max (the slowest and fastest node's), ceiling_efficiency (a
     layout's or loader's storage GB/s per node over the nodes' mean ceiling), and the
     option's column ceiling; rows of schemas 1-7 read them as empty (not measured) and
     ceiling as false; the sidecar's `ceiling` holds every node's every stream count.
- 9: the option checkpoint.prefetch's column prefetch_bytes (posix_fadvise WILLNEED ahead
     of each read); rows of schemas 1-8 read it as 0 (nothing prefetched). Not an identity
     column: rows before and after still compare.

The columns themselves (type, unit, meaning, since, identity) are
stampede.results.columns'.

Seconds are written with full float precision (repr): a 2 µs stat must survive.
Not-applicable cells (a stat has no GB/s) are empty.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import math
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from stampede.errors import RunFailed, UsageError
from stampede.results.cells import LINE, SOURCE, cell
from stampede.results.columns import (
    ARCHIVE_SCHEMA,
    BEFORE,
    COLUMNS,
    GPU_PHASE,
    OWN_TOOL,
    REQUIRED_COLUMNS,
)
from stampede.targets import POSIX
from stampede.values import OUTPUT_ARCHIVE, file_kind, read_text, refuse_overwrite

# Rows of schemas 1-4 overloaded columns where no column said what was measured: a
# loaders run (its run id tagged so) put each loader in `backend`, an import its tool, a
# `stampede gpu` sweep (job gpu, backend = its --device) archived as phase restore.
GPU_DEVICES = ("host", "cuda")


def _encode(rows: Iterable[Mapping[str, object]]) -> str:
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=COLUMNS, lineterminator="\n")
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"columns not in the archive schema: {sorted(unknown)}")
        writer.writerow({column: cell(row.get(column)) for column in COLUMNS})
    return stream.getvalue()


def check_appendable(path: str | Path, flag: str = "archive.path =") -> None:
    """Before a run, before any I/O: the archive is a regular file with this schema's
    header, or a path where one can be created, and it can be written. Anything else (a
    device such as /dev/null or /dev/full, a FIFO, a directory) is refused: a run would
    end with its results lost, or never end; and where it may be written is the one output
    check's (values.refuse_overwrite: never a trace, nothing in ARCHIVE.runs/, no link).
    `flag`: how the error names it (the job key, or a command's --archive)."""
    path = Path(path)
    where = f"{flag} {str(path)!r}"
    try:
        status = os.stat(path)
    except FileNotFoundError:
        status = None
    except OSError as error:
        raise UsageError(f"{where}: cannot stat it ({error.strerror})") from None
    if status is not None and not stat.S_ISREG(status.st_mode):
        raise UsageError(f"{where}: is {file_kind(status.st_mode)}, not a regular file",
                         hint="an archive is a CSV file, or a path where one can be created")
    if status is not None and status.st_size:
        with open(path, "rb") as stream:   # a regular file: reading cannot block
            first = stream.readline().decode(errors="replace").rstrip("\n")
        if first != ",".join(COLUMNS):
            raise UsageError(f"{where}: the file's header is not this stampede's CSV schema "
                             f"{ARCHIVE_SCHEMA}", hint="give a new archive.path; old archives "
                                                       "still load in `stampede report`")
    refuse_overwrite(flag, path, {}, OUTPUT_ARCHIVE)


def append_rows(path: str | Path, rows: Sequence[Mapping[str, object]]) -> None:
    """Append rows in one write under an exclusive lock, then fsync: whole or not at all.

    The lock makes concurrent runs appending to one archive interleave whole runs; a write
    that fails (a full disk, a quota) is cut back off, so the archive is exactly as it was
    (RunFailed, exit 1); a crash leaves earlier rows intact, and a torn last line is
    skipped by readers and followed by a new line at the next append.
    """
    path = Path(path)
    where = f"archive.path = {str(path)!r}"
    header = ",".join(COLUMNS) + "\n"
    payload = _encode(rows)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise RunFailed(f"{where}: cannot open it to append ({error.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UsageError(f"{where}: is {file_kind(status.st_mode)}, not a regular file")
        size = status.st_size
        prefix = header
        if size:
            first = os.pread(fd, len(header) + 1, 0).decode(errors="replace")
            if not first.startswith(header):
                raise UsageError(f"{where}: the file's header is not this stampede's CSV "
                                 f"schema {ARCHIVE_SCHEMA}", hint="give a new archive.path; "
                                 "old archives still load in `stampede report`")
            prefix = "" if os.pread(fd, 1, size - 1) == b"\n" else "\n"  # after a torn line
        try:
            _write_all(fd, (prefix + payload).encode())
            os.fsync(fd)
        except OSError as error:
            _cut_back(fd, size)
            raise RunFailed(f"{where}: appending {len(rows)} row(s) failed "
                            f"({error.strerror or error}); the archive is as it was before "
                            "them") from None
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _cut_back(fd: int, size: int) -> None:
    """Remove what a failed append wrote (a truncate frees blocks: it cannot need space)."""
    os.ftruncate(fd, size)
    with contextlib.suppress(OSError):
        os.fsync(fd)


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """Every complete row of an archive, any schema (missing columns read as empty)."""
    path = Path(path)
    text = read_text(path, "archive")
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "run_id" not in reader.fieldnames:
        raise UsageError(f"{path}: not a stampede archive (no run_id column)")
    missing = [column for column in REQUIRED_COLUMNS if column not in reader.fieldnames]
    if missing:
        raise UsageError(f"{path}: not a whole stampede archive: its header lacks the "
                         f"column(s) {', '.join(missing)}",
                         hint="every schema since 1 has them; was the file edited?")
    rows = []
    for row in reader:
        if None in row or any(value is None for value in row.values()):
            continue  # a torn line: fewer or more cells than the header
        whole = {**{column: row.get(column, "") for column in set(COLUMNS) | set(row)},
                 SOURCE: str(path), LINE: str(reader.line_num)}
        for column, before in BEFORE.items():
            if not whole[column]:
                whole[column] = before
        if not whole["tool"]:
            _what_was_measured(whole)
        rows.append(whole)
    return rows


def _what_was_measured(row: dict[str, str]) -> None:
    """A row of schema 1 to 4 in schema 5's terms: the tool from the overloaded backend,
    the backend the storage it read, gpu rows in their own phase."""
    tag = row["run_id"].split("-")[1:-1]
    if row["job"] == "gpu" and row["backend"] in GPU_DEVICES and row["phase"] == "restore":
        row.update(tool=OWN_TOOL, phase=GPU_PHASE, backend="-" if row["cache"] == "-" else POSIX)
    elif tag == ["loaders"] and row["backend"] != POSIX:   # the loader, in its backend cell
        row.update(tool=row["backend"], backend=POSIX)
    elif tag and tag[0] == row["backend"] and row["warnings"].startswith("imported from"):
        row["tool"] = row["backend"]
    else:
        row["tool"] = OWN_TOOL


def _finite(value: object) -> object:
    """NaN (no sample) becomes null: the sidecar stays strict JSON for every parser."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def sidecar_dir(archive: str | Path) -> Path:
    """Where an archive's runs keep their sidecars: ARCHIVE_STEM.runs/ beside it."""
    archive = Path(archive)
    return archive.with_name(f"{archive.stem}.runs")


def sidecar_path(archive: str | Path, run_id: str) -> Path:
    archive = Path(archive)
    return archive.with_name(f"{archive.stem}.runs") / f"{run_id}.json"


def write_sidecar(path: Path, document: Mapping[str, object]) -> None:
    """A run's full metadata as strict JSON into `path`, made durable (fsync). The recorder
    gives it a temporary name and renames it into place once the rows it describes are
    appended (stampede.results.recorder): a rewrite replaces the sidecar whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as stream:
        json.dump(_finite(document), stream, indent=1, sort_keys=True, default=str,
                  allow_nan=False)
        stream.flush()
        os.fsync(stream.fileno())
