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
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from stampede import mpi
from stampede.errors import StampedeError
from stampede.results.model import LayoutRun, RunContext
from stampede.targets import capabilities_for

if TYPE_CHECKING:
    from stampede.backends.base import Backend
    from stampede.filesystems import FsKind
    from stampede.sysinfo import Mount

# Called on rank 0 after each layout, collectively (its error is every rank's): archive it.
AfterLayout = Callable[[RunContext, LayoutRun], None]
READ_BACK_FILES = 4   # the files whose layout is read back per layout (a few: one lfs each)
FILE_LAYOUTS = "file_layouts"   # the sidecar's key, in each layout


def layouts_in_turn(comm: mpi.Comm, backend: Backend, target: str, layouts: tuple[str, ...],
                    measure: Callable[[str], LayoutRun], files: Callable[[str], list[Path]],
                    context: RunContext, after_layout: AfterLayout | None) -> list[LayoutRun]:
    """Each layout measured in turn (`measure`, on every rank), with what the file system
    said around it on rank 0 (`files`: rank 0's, the layout's files whose layout is read
    back), handed to `after_layout`; a layout interrupted (a signal) is the last."""
    client = _client(comm, backend, target)
    runs: list[LayoutRun] = []
    for layout in layouts:
        start = _read(client)
        run = measure(layout)
        if client is not None:
            # beside what the measure kept there (a cephfs:// backend's MDS counts)
            run = replace(run, file_system={**run.file_system,
                                            **_around(client, start, files, layout)})
        runs.append(run)
        if after_layout is not None:
            mpi.on_root(comm, f"archiving {layout}", partial(after_layout, context, run))
        if run.interrupted:
            break
    return runs


# Rank 0's client of the target: its kind (what counts, what stripes), its mount (None:
# the backend's own client, cephfs://), and where a file to read back is for its striper
Client = tuple["FsKind", "Mount | None", Callable[[Path], PurePath]]


def _client(comm: mpi.Comm, backend: Backend, target: str) -> Client | None:
    """Rank 0, a POSIX target: its mount's kind, where it counts or stripes; a backend
    that stripes through its own client (cephfs://): that striper, no counters (its MDS's
    are stampede.run.mds_counts'); else None."""
    if comm.Get_rank() != 0:
        return None
    from stampede.filesystems import FsKind, backend_striping, kind_for  # rank 0 reads

    if not capabilities_for(target).local_files:
        striping = backend_striping(backend)
        if striping is None:
            return None
        return (FsKind(backend.name, "the backend's own client", striper=striping.striper()),
                None, lambda path: striping.fs_path(str(path.relative_to(Path(target)))))
    kind, mount = kind_for(target)
    if kind.counters is None and kind.striper is None:
        return None
    return kind, mount, lambda path: path


def _read(client: Client | None) -> object:
    counters = client[0].counters if client is not None else None
    if client is None or counters is None or client[1] is None:
        return None
    try:
        return counters.read(client[1])
    except (OSError, subprocess.SubprocessError):   # unreadable: the layout's not counted
        return None


def _around(client: Client, start: object, files: Callable[[str], list[Path]],
            layout: str) -> dict[str, object]:
    """The counters' deltas since `start`, and the layout its files got."""
    (kind, mount, where), said = client, dict[str, object]()
    if kind.counters is not None and mount is not None:
        try:
            moved = kind.counters.since(mount, start)
        except (OSError, subprocess.SubprocessError):   # a hung or missing tool
            moved = None
        if moved is not None:
            said[kind.counters.key] = moved
    if kind.striper is not None:
        try:
            paths = [where(path) for path in list(dict.fromkeys(files(layout)))[:READ_BACK_FILES]]
            said[FILE_LAYOUTS] = {"how": kind.striper.how, "files": kind.striper.read(paths)}
        # ValueError: a file outside the target (an existing checkpoint's elsewhere)
        except (OSError, ValueError, subprocess.SubprocessError, StampedeError) as error:
            said[FILE_LAYOUTS] = f"not read back: {error}"
    return said
