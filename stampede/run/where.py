"""--trace's file and offset of each op: recorded beside the samples, only when tracing.

A sample row (stampede.results.samples) says what an op was and when; the trace also
says where: which file (an id, the names in a table) and at what offset. Kept apart from
the sample rows so that an untraced run records nothing more: the timed loops append
`(row index, file id, offset)` here after the sample's own append, outside its stamps,
when `RankSetup.where` / the saver's `where` is not None. File ids are this rank's; rank 0
turns them into ids of one table per layout when it gathers the trace (`gathered`).
"""

from __future__ import annotations

import numpy as np

from stampede import mpi

NOWHERE = -1   # an op of no file (a barrier, an exchange) or no offset (a stat)


class Where:
    """One rank's record: `rows` of (sample index, file id, offset), `names` by id."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []
        self.ids: dict[str, int] = {}

    def file_id(self, name: str) -> int:
        """The id of a file (a path relative to the target), given once per name."""
        return self.ids.setdefault(name, len(self.ids))

    @property
    def names(self) -> list[str]:
        return list(self.ids)

    def columns(self, samples: int, keep: np.ndarray) -> np.ndarray:
        """(file id, offset) per sample of a log of `samples` rows, NOWHERE where none
        was recorded, then only the rows `keep` keeps (measured_rows' mask)."""
        found = np.full((samples, 2), NOWHERE, dtype=np.int64)
        if self.rows:
            recorded = np.array(self.rows, dtype=np.int64)
            found[recorded[:, 0]] = recorded[:, 1:]
        return found[keep]


def gathered(comm: mpi.Comm, columns: np.ndarray, names: list[str]) -> tuple[np.ndarray, list[str]] | None:
    """Every rank's (file, offset) columns on rank 0, in rank order, the file ids turned
    into indexes of one table of names (in order of first appearance); None elsewhere.
    Collective."""
    parts = mpi.gather_rows(comm, columns)
    all_names = mpi.gather(comm, names)
    if parts is None or all_names is None:
        return None
    table: dict[str, int] = {}
    remapped = []
    for part, mine in zip(parts, all_names):
        lookup = np.array([table.setdefault(name, len(table)) for name in mine] or [0],
                          dtype=np.int64)
        files = part[:, 0]
        part = part.copy()
        part[:, 0] = np.where(files >= 0, lookup[np.clip(files, 0, None)], NOWHERE)
        remapped.append(part)
    rows = np.concatenate(remapped) if remapped else np.empty((0, 2), dtype=np.int64)
    return rows, list(table)
