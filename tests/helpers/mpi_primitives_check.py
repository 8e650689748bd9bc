"""Run under mpiexec by test_mpi_primitives.py: stampede.mpi on a real communicator.

Every rank checks; the verdicts are gathered (a collective), so a failing check cannot
leave another rank waiting. Rank 0 prints one line per check and exits non-zero on any.
"""

from __future__ import annotations

import sys

import numpy as np

from stampede import mpi
from stampede.errors import StampedeError, UsageError


def checks(comm) -> dict[str, bool]:
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}
    # ranks send different row counts, rank 1 none at all
    rows = np.arange(rank * 6 * 10, (rank * 6 + 6 * (0 if rank == 1 else rank + 1)) * 10,
                     dtype=np.int64)[: 6 * (0 if rank == 1 else rank + 1)].reshape(-1, 6)
    gathered = mpi.gather_rows(comm, rows)
    if rank == 0:
        results["gather_rows"] = gathered is not None and all(
            part.shape == (0 if r == 1 else r + 1, 6) for r, part in enumerate(gathered))
    else:
        results["gather_rows"] = gathered is None
    reduced = mpi.allreduce_sum(comm, np.array([rank, 1]))
    results["allreduce_sum"] = reduced is not None and list(reduced) == [size * (size - 1) // 2, size]
    results["bcast"] = mpi.bcast(comm, "root" if rank == 0 else "other") == "root"
    results["barrier"] = mpi.barrier(comm, timeout_s=30)

    def fail_on_last() -> int:
        if rank == size - 1:
            raise UsageError("bad thing on the last rank")
        return rank

    try:
        mpi.collective(comm, "checking", fail_on_last)
        results["collective_raises_everywhere"] = False
    except StampedeError as error:
        text = str(error)
        # one rank: said as it is; several: which ranks failed, each named
        said = text == "checking: bad thing on the last rank" if size == 1 else (
            f"checking failed on 1 of {size} ranks" in text
            and f"rank {size - 1}: bad thing on the last rank" in text)
        results["collective_raises_everywhere"] = said and error.exit_status == 2
    results["collective_passes_result"] = mpi.collective(comm, "ok", lambda: rank * 2) == rank * 2
    return results


def main() -> int:
    comm = mpi.world()
    verdicts = mpi.gather(comm, checks(comm))
    if comm.Get_rank() != 0:
        return 0
    assert verdicts is not None
    failed = 0
    for name in verdicts[0]:
        ok = all(verdict[name] for verdict in verdicts)
        failed += not ok
        bad_ranks = [r for r, verdict in enumerate(verdicts) if not verdict[name]]
        print(f"{name}: {'ok' if ok else f'FAILED on ranks {bad_ranks}'}")
    print(f"ranks={comm.Get_size()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
