"""NFS read throughput: `stampede run` on an nfs:// target against IOR's LIBNFS backend, the
same file on the same nfs-ganesha, one run.

The script starts its own ganesha (NFSv4 on 127.0.0.1, tests/helpers/nfsserver.py),
prepares a sharded checkpoint of --size for one rank there (`stampede prepare`), then in
each of --rounds rounds, the order swapped every round:

  stampede   `mpiexec -n 1 stampede run` (--iterations reads of the file in --block
             blocks, cache warm, verify none): the read row's agg GB/s, median over its
             iterations (bytes / first start to last stop of the reads)
  IOR        `ior -a LIBNFS --libnfs.url=nfs://127.0.0.1/export/?version=4&nfsport=P -r -E
             -k -t BLOCK -b SIZE -i ITERATIONS -o /ck/sharded/<the file> -O
             summaryFormat=JSON -O summaryFile=FILE`: its read bandwidth (bytes / open +
             reads + close), median over its iterations' own results, read from the JSON
             summary by `stampede import`'s reader (never the summary's max or mean)

Both are one user-space libnfs client reading the same bytes in the same transfers. The
ratio stampede / IOR is the median of the per-round ratios (paired); goal 0.95, the
verdict printed (the exit status says only whether a command failed). GB = 1e9 bytes.

IOR from source (hpc/ior) with `./configure --with-libnfs`: its LIBNFS backend calls
nfs_read(nfs, fh, buf, count), libnfs 5's order, and Debian's libnfs 4.0 (libnfs13) takes
nfs_read(nfs, fh, count, buf): built as is it compiles with int-conversion warnings and
every read fails ("nfs_service failed"). The numbers below used IOR with those two calls'
arguments swapped to 4.0's order (nfs_read and nfs_write in src/aiori-LIBNFS.c), nothing
else changed. Give its binary with --ior; it is launched with the launcher of the MPI it
is linked with (found through ldd: the venv's mpiexec for the venv's MPICH,
mpiexec.mpich for Debian's), or --mpiexec. Needs root and nfs-ganesha.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import (
    archive_rows,
    docstring_parser,
    load_average_text,
    machine_text,
    median_min_max,
    mpi_launcher_of,
    mpiexec_command,
    ratio_verdict,
    run_checked,
    scratch_directory,
    write_job_toml,
)
from common import ior_read_gbps as common_ior_read_gbps

from stampede.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.nfsserver import running_server, unavailable  # noqa: E402

TARGET_RATIO = 0.95


def ior_read_gbps(summary: Path) -> float:
    """IOR's read GB/s from its JSON summary (common.ior_read_gbps: the median of its
    repetitions' own results, never the summary's max or mean)."""
    return common_ior_read_gbps(summary, "nfs_vs_ior")


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ior", default=shutil.which("ior") or "ior")
    parser.add_argument("--mpiexec", default=None,
                        help="the launcher of the MPI IOR was built with (default: found "
                             "from the library ldd shows IOR linked with)")
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--block", default="1MiB")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    reason = unavailable() or ("" if shutil.which(args.ior) else
                               f"no IOR at {args.ior} (give --ior; see --help)")
    if reason:
        raise SystemExit(f"nfs_vs_ior: {reason}")
    size, block = parse_size(args.size), parse_size(args.block)
    mpiexec = args.mpiexec or mpi_launcher_of(shutil.which(args.ior) or args.ior)
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    with scratch_directory("stampede-nfs-ior-", None) as scratch, \
            running_server(scratch / "server") as server:
        archive = scratch / "runs.csv"
        job = write_job_toml(scratch / "job.toml", {
            "target": {"path": server.url("ck")},
            "checkpoint": {"size_per_rank": args.size, "layout": ["sharded"],
                           "block_size": args.block},
            "run": {"iterations": args.iterations, "warmup": 1, "cache": "warm",
                    "verify": "none"},
            "archive": {"path": archive}})
        run_checked(mpiexec_command(1, sys.executable, "-m", "stampede", "prepare", str(job)))
        shard = next((server.export / "ck" / "sharded").iterdir()).name
        url = f"nfs://127.0.0.1/export/?version=4&nfsport={server.port}"
        ior = [mpiexec, "-n", "1", args.ior, "-a", "LIBNFS", f"--libnfs.url={url}",
               "-r", "-E", "-k", "-t", str(block), "-b", str(size), "-i",
               str(args.iterations), "-o", f"/ck/sharded/{shard}", "-O", "summaryFormat=JSON"]
        sides: dict[str, list[float]] = {"stampede": [], "IOR": []}
        for round_number in range(args.rounds):
            order = ("stampede", "IOR") if round_number % 2 == 0 else ("IOR", "stampede")
            for side in order:
                if side == "stampede":
                    before = len(archive_rows(archive)) if archive.exists() else 0
                    run_checked(mpiexec_command(1, sys.executable, "-m", "stampede", "run",
                                                str(job)))
                    read = next(row for row in archive_rows(archive)[before:]
                                if row["op"] == "read")
                    sides[side].append(float(read["agg_gbps"]))
                else:
                    summary = scratch / f"ior-{round_number}.json"
                    subprocess.run([*ior, "-O", f"summaryFile={summary}"], capture_output=True,
                                   check=True, timeout=600)
                    sides[side].append(ior_read_gbps(summary))
    ratio = statistics.median(a / b for a, b in zip(sides["stampede"], sides["IOR"]))
    print(f"ganesha 4.3 NFSv4 on 127.0.0.1, libnfs 4.0; one {args.size} file read in "
          f"{args.block} transfers, {args.iterations} iterations per run, {args.rounds} rounds")
    for side, values in sides.items():
        print(f"{side:>9}: {statistics.median(values):.3g} GB/s ({min(values):.3g}-"
              f"{max(values):.3g})")
    verdict = ratio_verdict(ratio, TARGET_RATIO, [median_min_max(values)
                                                  for values in sides.values()])
    print(f"stampede / IOR: {ratio:.2f} (median of per-round ratios): {verdict}")
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
