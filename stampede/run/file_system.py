"""The one loop a restore (stampede.run.job) and a save (stampede.run.save) go through:
a job's layouts in turn, each measured, then archived, and around each what the target's
file-system client says (stampede.filesystems): its own per-op counters (a kernel NFS
mount's RPCs, Lustre's llite stats) read before and after the layout, and the layout
its files got read back (Lustre's stripes, CephFS's). Rank 0 alone reads them, untimed,
outside the phases, so nothing is added to a timed op; the counters are the whole
mount's on rank 0's node (every process using it, the node's other ranks included)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from stampede import mpi
from stampede.errors import StampedeError
from stampede.results.model import LayoutRun, RunContext
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from stampede.filesystems import FsKind
    from stampede.sysinfo import Mount

# Called on rank 0 after each layout, collectively (its error is every rank's): archive it.
AfterLayout = Callable[[RunContext, LayoutRun], None]
READ_BACK_FILES = 4   # the files whose layout is read back per layout (a few: one lfs each)
FILE_LAYOUTS = "file_layouts"   # the sidecar's key, in each layout


def layouts_in_turn(comm: mpi.Comm, target: str, layouts: tuple[str, ...],
                    measure: Callable[[str], LayoutRun], files: Callable[[str], list[Path]],
                    context: RunContext, after_layout: AfterLayout | None) -> list[LayoutRun]:
    """Each layout measured in turn (`measure`, on every rank), with what the file system
    said around it on rank 0 (`files`: rank 0's, the layout's files whose layout is read
    back), handed to `after_layout`; a layout interrupted (a signal) is the last."""
    client = _client(comm, target)
    runs: list[LayoutRun] = []
    for layout in layouts:
        start = _read(client)
        run = measure(layout)
        if client is not None:
            run = replace(run, file_system=_around(client, start, files, layout))
        runs.append(run)
        if after_layout is not None:
            mpi.on_root(comm, f"archiving {layout}", partial(after_layout, context, run))
        if run.interrupted:
            break
    return runs


def _client(comm: mpi.Comm, target: str) -> tuple[FsKind, Mount] | None:
    """Rank 0, a POSIX target: its mount's kind, where it counts or stripes (else None)."""
    if comm.Get_rank() != 0 or not capabilities_for(target).local_files:
        return None
    from stampede.filesystems import kind_for  # every rank imports this module: rank 0 reads

    kind, mount = kind_for(target)
    return (kind, mount) if kind.counters is not None or kind.striper is not None else None


def _read(client: tuple[FsKind, Mount] | None) -> object:
    counters = client[0].counters if client is not None else None
    if client is None or counters is None:
        return None
    try:
        return counters.read(client[1])
    except (OSError, subprocess.SubprocessError):   # unreadable: the layout's not counted
        return None


def _around(client: tuple[FsKind, Mount], start: object, files: Callable[[str], list[Path]],
            layout: str) -> dict[str, object]:
    """The counters' deltas since `start`, and the layout its files got."""
    (kind, mount), said = client, dict[str, object]()
    if kind.counters is not None:
        try:
            moved = kind.counters.since(mount, start)
        except (OSError, subprocess.SubprocessError):   # a hung or missing tool
            moved = None
        if moved is not None:
            said[kind.counters.key] = moved
    if kind.striper is not None:
        try:
            paths = list(dict.fromkeys(files(layout)))[:READ_BACK_FILES]
            said[FILE_LAYOUTS] = {"how": kind.striper.how, "files": kind.striper.read(paths)}
        except (OSError, subprocess.SubprocessError, StampedeError) as error:
            said[FILE_LAYOUTS] = f"not read back: {error}"
    return said
