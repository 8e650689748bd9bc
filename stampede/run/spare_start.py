"""A spare rank's own start-up after the loss, as `stampede startup` stamps it: run by
stampede.run.rejoin on each spare rank as `python -P -m stampede.run.spare_start` (the
interpreter, stampede's run modules, MPI initialised as a process of its own), its record
(stampede.run.startup.StartupRecord) printed as one JSON line. A hot spare's processes are
started once its node is chosen, so this is the T_pod_init of the rejoin path: what the
spare node pays before its ranks can join, measured rather than assumed."""

from __future__ import annotations

import json

from stampede import mpi
from stampede.run.startup import measure


def main() -> None:
    _, record = measure(mpi.world, ())
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
