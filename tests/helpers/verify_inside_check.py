"""Run under mpiexec by tests/run/test_verify_inside.py: with run.verify on, every layout's
restore ends after the rank's last check (inside the restore, for layouts that hash
between reads and for those that exchange and hash the held shard alike). Rank 0 prints
one line per layout: OK, or what broke."""

from __future__ import annotations

import sys
import tempfile

from stampede import mpi
from stampede.backends import open_backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.manifest import read_manifest
from stampede.checkpoint.prepare import prepare
from stampede.ops import OP_CODE
from stampede.results.samples import ITER, OP, START, STOP
from stampede.run.layout import plan_for, run_phases
from stampede.run.setup import build_setup
from stampede.spec import build_job

LAYOUTS = ["sharded", "replicated", "broadcast", "striped", "metadata-first"]


def main() -> int:
    comm = mpi.world()
    root = mpi.bcast(comm, tempfile.mkdtemp(prefix="stampede-verify-") if comm.Get_rank() == 0
                     else "")
    spec = build_job("inside", "inside.toml", {
        "target": {"path": f"{root}/ckpt"},
        "checkpoint": {"size_per_rank": "4MiB", "layout": LAYOUTS, "replicas": 2,
                       "block_size": "1MiB"},
        "run": {"iterations": 3, "warmup": 1, "verify": "xxh3"},
        "archive": {"path": f"{root}/a.csv"}})
    prepare(comm, spec)
    backend = open_backend(spec.target_path)
    manifest = mpi.bcast(comm, read_manifest(backend, spec.target_path))
    verdicts = []
    for layout in LAYOUTS:
        plan = plan_for(spec, None, layout, comm.Get_size(), comm.Get_rank())
        with AlignedBuffer(plan.hold.length if plan.exchange else spec.block_bytes,
                           populate=True) as buffer:
            setup = build_setup(comm, spec, plan, backend, manifest["layouts"][layout],
                                buffer, None, None)
            phases = run_phases(comm, spec, setup)
            if setup.group is not None:
                mpi.free(setup.group, comm)
        broken = []
        for row in phases.log:
            if row[OP] != OP_CODE["restore"]:
                continue
            checks = [r for r in phases.log if r[ITER] == row[ITER] and r[OP] == OP_CODE["verify"]]
            if not checks:
                broken.append(f"iteration {row[ITER]}: no verify op")
            elif max(r[STOP] for r in checks) > row[STOP] or \
                    min(r[START] for r in checks) < row[START]:
                broken.append(f"iteration {row[ITER]}: a check outside the restore")
        if phases.invalid_reason:
            broken.append(phases.invalid_reason)
        verdicts.append((layout, broken))
    everyone = mpi.gather(comm, verdicts)
    if everyone is None:
        return 0
    failed = 0
    for index, layout in enumerate(LAYOUTS):
        problems = [f"rank {rank}: {text}" for rank, part in enumerate(everyone)
                    for text in part[index][1]]
        failed += bool(problems)
        print(f"{layout}: {'OK' if not problems else '; '.join(problems[:3])}")
    import shutil
    shutil.rmtree(root, ignore_errors=True)
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
