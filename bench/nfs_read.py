"""NFS read throughput: stampede's nfs:// backend against libnfs's own `nfs-cat`, the same
files on the same nfs-ganesha, one run.

The script starts its own ganesha (NFSv4 on 127.0.0.1, tests/helpers/nfsserver.py),
writes --files files of --size random bytes into its export, and reads each whole, each
way, as a whole process (start-up and mount included on both sides):

  stampede   python: the backend as a rank builds it (one client, mounted), then open,
             read_into() of --block blocks into one page-aligned buffer, close
  nfs-cat    libnfs-utils' nfs-cat URL > /dev/null (its own reads: libnfs's, to a pipe)

Rounds alternate the sides file by file (the order rotated each round), so the machine's
load falls on both. A side's GB/s per round = bytes / the wall time of its processes; the
same on an empty file gives each side's start-up, printed apart, and the read rate with
it taken out. Ratios are medians of the per-round ratios (paired). The reference IOR's
LIBNFS backend is not built here (it needs IOR from source against libnfs-dev); nfs-cat is
the same library's own reader. GB = 1e9 bytes. Needs root, nfs-ganesha, libnfs-utils.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import docstring_parser, load_average_text, machine_text, scratch_directory

from stampede.units import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.nfsserver import running_server, unavailable  # noqa: E402

READER = """
import sys
from stampede.backends import open_backend
from stampede.buffers import AlignedBuffer
backend = open_backend(sys.argv[1])
block = int(sys.argv[3])
handle = backend.opener(False)(backend.path(sys.argv[2]))
offset = 0
with AlignedBuffer(block) as buffer:
    while (got := backend.read_into(handle, buffer.view, offset)):
        offset += got
backend.close(handle)
print(offset)
"""


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--block", default="1MiB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    reason = unavailable() or ("" if shutil.which("nfs-cat") else
                               "nfs-cat is not installed (apt-get install libnfs-utils)")
    if reason:
        raise SystemExit(f"nfs_read: {reason}")
    size, block = parse_size(args.size), parse_size(args.block)
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}")
    with scratch_directory("stampede-nfs-read-", None) as scratch, \
            running_server(scratch / "server") as server:
        names = [f"f{index}.raw" for index in range(args.files)]
        for name in names:
            (server.export / name).write_bytes(os.urandom(size))
        (server.export / "empty.raw").write_bytes(b"")
        root = server.url("")[:-1]

        def sides(name: str) -> dict[str, list[str]]:
            return {"stampede": [sys.executable, "-c", READER, root, name, str(block)],
                    "nfs-cat": ["nfs-cat", f"nfs://127.0.0.1/export/{name}?version=4&"
                                           f"nfsport={server.port}"]}

        start_up = {side: statistics.median(timed(command) for _ in range(5))
                    for side, command in sides("empty.raw").items()}
        rates: dict[str, list[float]] = {"stampede": [], "nfs-cat": []}
        pure: dict[str, list[float]] = {"stampede": [], "nfs-cat": []}
        for round_number in range(args.rounds):
            seconds = {"stampede": 0.0, "nfs-cat": 0.0}
            for index, name in enumerate(names):
                order = list(sides(name).items())
                if (round_number + index) % 2:
                    order.reverse()
                for side, command in order:
                    seconds[side] += timed(command)
            total = size * len(names)
            for side in seconds:
                rates[side].append(total / seconds[side] / 1e9)
                pure[side].append(total / (seconds[side] - len(names) * start_up[side]) / 1e9)
    print(f"ganesha 4.3 NFSv4 on 127.0.0.1; {args.files} files of {args.size}, block "
          f"{args.block}, {args.rounds} rounds; start-up (empty file, median of 5): "
          + ", ".join(f"{side} {seconds * 1e3:.0f} ms" for side, seconds in start_up.items()))
    for label, table in (("whole process", rates), ("start-up taken out", pure)):
        line = ", ".join(f"{side} {statistics.median(values):.3g} GB/s "
                         f"({min(values):.3g}-{max(values):.3g})" for side, values in table.items())
        ratio = statistics.median(a / b for a, b in zip(table["stampede"], table["nfs-cat"]))
        print(f"{label}: {line}; stampede / nfs-cat {ratio:.2f} (median of per-round ratios)")
    print(f"load after: {load_average_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
