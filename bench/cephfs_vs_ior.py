"""CephFS: stampede's read GB/s and stat / open rates against IOR and mdtest, on the same
files of one real Ceph, both ways a cluster meets it: a ceph-fuse mount (stampede's POSIX
backend against IOR's and mdtest's POSIX backends) and libcephfs (stampede's cephfs://
against IOR's and mdtest's CEPHFS backend, a client per rank on both sides).

The script starts its own single-node Ceph (tests/helpers/cephcluster.py: mon, mgr, an
OSD on memstore, an MDS, on 127.0.0.1, no auth) and mounts it with ceph-fuse. Through the
mount it prepares a shared checkpoint of --size per rank (`stampede prepare`: one file,
rank r's slice at r x size), and has mdtest create --items files per rank in one
directory (`mdtest -F -C -n ITEMS`, no -u), which it then rewrites as safetensors files
of --meta-size bytes each, with a Hugging Face index beside them naming every one: the
same files are then mdtest's tree and an existing checkpoint stampede restores
(checkpoint.source = existing, assign = files: each rank takes ITEMS whole files). Then,
in each of --rounds rounds, the order swapped every round, on the mount and on cephfs://
in turn:

  read     stampede `mpiexec -n RANKS stampede run` (layout shared, --block reads,
           --iterations iterations after one warm-up, cache warm, verify none): the read
           row's agg_gbps (bytes / first read's start to last read's stop), and the
           restore row's (barrier exit to each rank's last byte, its open included),
           medians over iterations
           IOR      `ior -a POSIX|CEPHFS -r -E -k -s 1 -b SIZE -t BLOCK -i ITERATIONS+1
           -o <the same file>`, its first repetition its warm-up (a new client's first
           open and first connection to the OSD), medians over the others from its JSON
           summary: against the read row, bytes / its wrRdTime (the earliest rank's first
           read to the latest rank's last: IOR reduces its timers MPI_MIN / MPI_MAX, ior.c,
           the read row's span); against the restore row, its own bandwidth (bytes / open
           + reads + close). Each repetition's bytes are checked (bandwidth x total time)
  metadata stampede on mdtest's files, each file of a rank once per iteration: --iterations
           runs of pattern.ops = [stat], one iteration and no warm-up each, the stat
           row's ops_per_s (median over the runs); then one run of [open, close] file
           by file (pattern.order = "file": each file opened and closed before the next,
           as mdtest -E does), one warm-up iteration and --iterations measured, open +
           close as pairs per second
           the way mdtest counts a phase: the opens of all ranks in one iteration /
           the slowest rank's time from its first open to its last close (from the
           run's trace, --trace; medians over iterations). mdtest times its phase
           between two barriers, so its time also holds the ranks' skew leaving the
           first one, which stampede's per-rank span leaves out (microseconds against
           the phase's tens of milliseconds). "o+c +index/s" is the same pairs over
           the slowest rank's barrier exit to its last close (the restore row's
           time_to_last_rank_s): it also holds each rank's one read of the index
           before its first open (its `index` row), a cost of a restore that mdtest's
           phase has not, against the same mdtest figure
           "first o+c/s": --iterations runs of the same [open, close] with no warm-up
           and one iteration, rated as "open+close/s": each a new client, each open the
           file's first call, so through libcephfs each asks the MDS (a lookup), as a
           restarted job's first opens do
           mdtest   `mdtest -F -T -E -e 0 -n ITEMS -i 1 -d <the tree>`, --iterations runs:
           File stat, and File read with -e 0 (an open and a close of each file, no byte
           read), medians over the runs; against "first o+c/s", --iterations runs
           without -T (its read phase its first calls on the files)
           So that each side meets the files in the same state: through libcephfs a
           process is a new client, mdtest's stats are its first requests for the files
           (the MDS asked), its opens come after them (the caps held); stampede's stat
           runs are new clients with no warm-up, its open runs have opened every file in
           their warm-up. Separate runs also keep one rank's stats out of the other's
           open span (mdtest has a barrier between its phases; a pattern has none). On
           the mount both meet ceph-fuse's one long-lived client.

Like with like, checked in mdtest.c (4.1): a phase's rate is the items of all ranks / the
longest rank time from the barrier before it to the barrier after it; a stat phase
(-T) stats each item once, as stampede's stat op does with pattern.stat_count = 1.
stampede's stat/s (count / first stat's start to last stat's stop over ranks) leaves out
the barriers' wake-up and so can only favour stampede: the stat gap is not a definition
gap. The pair is like for like too: stampede's open run has pattern.order = "file", so
it opens and closes each file in turn, as mdtest -E -e 0 does (one handle held at a
time; until that key, it opened all of a rank's files and then closed them all, 2,000
handles held at once, see docs/reference/ops.md). The index read a restore makes before
its first open is in "o+c +index/s" only.

The ratio of a pair is stampede / peer, the median of the per-round ratios (paired, so
the machine's load drifts on both sides alike); goal 0.95. GB = 1e9 bytes. Both sides
read the same file at the same offsets in the same transfers, and stat and open the same
files. IOR's and mdtest's CEPHFS clients get the settings stampede's client makes (in a
conf of their own): the object cacher off (`client_oc = false`), so every read of both
reaches the OSD (checked: with it on, IOR's second repetition read 2-2.8 GB/s from the
client's cache, with it off 0.9-1.1), and stampede's bounds (mount, monitor and OSD op,
shutdown: 20 s). A user of IOR meets libcephfs's defaults instead (the cacher on, no op
bound); a user of cephfs:// meets stampede's. What still differs (ceph_conf_get of every
option, both clients): IOR's reads the cluster's conf (its addresses, a log file, an
admin socket), nothing on a read's path. On the mount both sides share ceph-fuse's one
client and its caches: a warm read. Not the same: stampede's restore also reads the
index file once per rank (its `index` row), outside the rates compared. And on the mount
mdtest's File read phase opens each file read-write (mdtest.c passes O_RDONLY, which is 0,
where aiori-POSIX.c takes IOR_RDONLY, so its open falls through to O_RDWR: strace shows
openat(..., O_RDWR)), where stampede opens read-only as a restore does; through
libcephfs its open is read-only (aiori-CEPHFS.c maps 0 to CEPH_O_RDONLY). So the
mount's open+close pairs are not like for like, and their ratio (above 3) is mdtest's
write access, not stampede's speed. The verdict is printed; the script exits non-zero
only if a command failed.

Where the cephfs:// read gap went (0.86 = the median of two rounds, 0.80 and 0.93),
measured 2026-12-04 on the project's 2-core VM beside other work (load 2-6): nowhere in
stampede. Between two reads it spends 13 us (median of 180 gaps, --trace) beside 2.7 ms
per 4 MiB read (0.5 %); its clients spend 0.35-0.38 CPU s per GB read, IOR's 0.46-0.50,
the OSD 0.20-0.23 for either (rusage and /proc, a 42- less a 2-repetition run, medians
of 3 and of 5 rounds); a bare ctypes loop over ceph_read reads as fast; the one
setting on a read's path that differed, rados_osd_op_timeout (stampede's bound), moved
IOR by 1.007 (median of 10 paired rounds). A side reads 128 MiB in about 50 ms per
iteration, and per-round ratios swung 0.6-2.6: a median of two rounds says little, run
--rounds 7 or more. Until then the read pair set the read row (reads only, a warm-up
left out) against IOR's open + reads + close with its first repetition (a new client's)
among three: both in stampede's favour, by about 1 % here.

IOR and mdtest 4.1 (hpc/ior at 5fcf0ba, "4.1.0+dev"), built here with the venv's MPICH
(PyPI `mpich` 5.0.2 has mpicc) and Debian 12's libcephfs-dev 16.2.15, as root:

    apt-get install -y libcephfs-dev autoconf automake libtool pkg-config make gcc
    git clone https://github.com/hpc/ior /opt/ior-src && cd /opt/ior-src   # or an archive
    ./bootstrap
    ./configure --prefix=/opt/ior --with-cephfs MPICC=$VENV/bin/mpicc \\
                CPPFLAGS="-include sys/time.h"
    make -j2 && make install           # /opt/ior/bin/ior, /opt/ior/bin/mdtest

Ceph 16's cephfs/libcephfs.h uses struct timeval without including sys/time.h, so
aiori-CEPHFS.c does not compile without the CPPFLAGS above; nothing in IOR is changed.
`ior -h` then lists CEPHFS among its APIs. IOR is launched with the launcher of the MPI
it is linked with (ldd: here the venv's mpiexec), or --mpiexec. Needs root, Ceph
(`ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse libcephfs2`) and fusermount3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
from pathlib import Path

from common import (
    archive_rows,
    comma_separated,
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

from stampede.backends.cephfs import DEFAULT_TIMEOUT_S as CEPHFS_TIMEOUT_S
from stampede.results import trace as traces
from stampede.results.archive import sidecar_path
from stampede.results.importers import mdtest_rows
from stampede.results.readback import read_trace
from stampede.results.trace import trace_path
from stampede.units import format_plain, parse_size

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout: tests/helpers
from tests.helpers.cephcluster import CephCluster, running_cluster, unavailable  # noqa: E402

TARGET_RATIO = 0.95
PEER_TIMEOUT_S = 600
# IOR's and mdtest's CEPHFS clients strip this from their paths (--cephfs.prefix): a path
# they are given is PREFIX + the path in the file system
CEPHFS_PREFIX = "/cephfs"
WAYS = ("ceph-fuse", "cephfs://")
# "o+c +index/s": the open + close pairs with each rank's index read in the phase (as
# stampede's restore times it), against mdtest's same phase (open_close_rates); "first
# o+c/s": a new client's opens and closes, each open the file's first call (its lookup)
PAIRS = (("read GB/s", "IOR"), ("restore GB/s", "IOR"), ("stat/s", "mdtest"),
         ("open+close/s", "mdtest"), ("o+c +index/s", "mdtest"), ("first o+c/s", "mdtest"))
MDTEST_ROOT = "test-dir.0-0"   # the tree of mdtest's first (only) iteration under -d
MIB = 2**20                      # IOR's MiB
BYTES_PER_GB = 1e9
# IOR prints its times to 0.1 ms and its MiB/s to 4 decimals: a repetition's bytes, its
# bandwidth x its total time, are checked within this
IOR_TIME_RESOLUTION_S = 1e-4
IOR_BYTES_TOLERANCE = 0.01
PARTS = ("read", "metadata")    # --parts: what a round measures (the pairs of each)
METADATA_LOOPS: set[str] = set()   # the sidecars' node.metadata_loop: compiled or python


def peer_api(way: str, conf: Path) -> list[str]:
    """IOR's and mdtest's backend options for one way to the file system."""
    if way == "ceph-fuse":
        return ["-a", "POSIX"]
    return ["-a", "CEPHFS", "--cephfs.user=admin", f"--cephfs.conf={conf}",
            f"--cephfs.prefix={CEPHFS_PREFIX}"]


def peer_path(way: str, mountpoint: Path, relpath: str) -> str:
    return str(mountpoint / relpath) if way == "ceph-fuse" else f"{CEPHFS_PREFIX}/{relpath}"


def run_peer(command: list[str], env: dict[str, str]) -> str:
    """A peer's stdout; its output and exit status shown, and the bench ended, on failure."""
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=PEER_TIMEOUT_S)
    if done.returncode:
        raise SystemExit(f"FAILED ({done.returncode}): {' '.join(command)}\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def stampede_run(job: Path, nranks: int, archive: Path, target: str,
                 *options: str) -> dict[str, float]:
    """One `stampede run` of the job on `target`: op -> its row's rate (read and restore:
    agg_gbps, the others: ops_per_s); a run of opens and no read (traced) adds its open +
    close pair rates (open_close_rates)."""
    before = len(archive_rows(archive)) if archive.exists() else 0
    run_checked(mpiexec_command(nranks, sys.executable, "-m", "stampede", "run", str(job),
                                "--set", f"target.path={target}", *options))
    rates, rows = {}, {row["op"]: row for row in archive_rows(archive)[before:]}
    for op, row in rows.items():
        rate = row["agg_gbps"] if op in ("read", "restore") else row["ops_per_s"]
        if op in ("read", "restore", "stat", "open", "close") and rate:
            rates[op] = float(rate)   # a restore that reads nothing has no GB/s
    if "open" in rows and "read" not in rows:
        rates.update(open_close_rates(archive, rows["open"], rows["restore"]))
    if "read" not in rows:   # what ran the metadata pass: printed under the table
        run_id = next(iter(rows.values()))["run_id"]
        sidecar = json.loads(sidecar_path(archive, run_id).read_text())
        METADATA_LOOPS.add(str(sidecar["node"]["metadata_loop"]))
    return rates


def open_close_rates(archive: Path, open_row: dict[str, str],
                     restore_row: dict[str, str]) -> dict[str, float]:
    """A run's open + close pairs per second in mdtest's terms: the opens of all ranks in
    one iteration / the phase's time, medians over the measured iterations.
    "open+close/s": the phase is the slowest rank's own span, its first open's start to its
    last close's stop (from the run's trace): what mdtest times between the barriers around
    its phase, less the ranks' skew leaving the first barrier (mdtest's holds it).
    "o+c +index/s": the phase is the slowest rank's barrier exit to its last close (the
    restore row's time_to_last_rank_s), which also holds each rank's read of the index
    before its first open: a cost mdtest's phase has not."""
    per_iteration = int(open_row["count"]) / int(open_row["iterations"])
    found = read_trace(trace_path(sidecar_path(archive, open_row["run_id"])))
    if found.value is None:
        raise SystemExit(f"cephfs_vs_ior: the open run's trace: {'; '.join(found.notes)}")
    trace = found.value
    (rows,) = trace.layouts.values()
    opens = rows[(rows[:, traces.OP] == trace.code("open")) & (rows[:, traces.ITERATION] >= 0)]
    closes = rows[(rows[:, traces.OP] == trace.code("close"))
                  & (rows[:, traces.ITERATION] >= 0)]
    phases_s = []
    for iteration in traces.iterations(opens):
        spans_ns = []
        for rank in sorted(set(opens[:, traces.RANK].tolist())):
            mine = opens[(opens[:, traces.ITERATION] == iteration)
                         & (opens[:, traces.RANK] == rank)]
            shut = closes[(closes[:, traces.ITERATION] == iteration)
                          & (closes[:, traces.RANK] == rank)]
            spans_ns.append(int(shut[:, traces.STOP].max()) - int(mine[:, traces.START].min()))
        phases_s.append(max(spans_ns) / 1e9)
    return {"open+close/s": per_iteration / statistics.median(phases_s),
            "o+c +index/s": per_iteration / float(restore_row["time_to_last_rank_s"])}


def ior_read_rates(summary: Path, nbytes: int, who: str) -> dict[str, float]:
    """IOR's read repetitions in stampede's two definitions, medians over the repetitions
    after the first (IOR's warm-up, as stampede's run.warmup = 1): "read GB/s", `nbytes`
    over the read span (wrRdTime: the earliest rank's first read to the latest rank's last,
    IOR's MPI_MIN/MPI_MAX reduction of its timers, as stampede's read row spans its ranks'
    reads) and "restore GB/s", IOR's own bandwidth (bwMiB: open + reads + close). Each
    repetition must have moved `nbytes` (its bandwidth x its total time), else it exits."""
    tests = json.loads(summary.read_text()).get("tests") or [{}]
    results = [result for entry in tests[0].get("Results", [])
               for result in (entry if isinstance(entry, list) else [entry])
               if result.get("access") == "read"]
    if len(results) < 2:
        raise SystemExit(f"{who}: {summary}: {len(results)} read repetitions, need a warm-up "
                         "and at least one more")
    spans, own = [], []
    for result in results[1:]:
        moved = result["bwMiB"] * MIB * result["totalTime"]
        slack = IOR_BYTES_TOLERANCE * nbytes + result["bwMiB"] * MIB * IOR_TIME_RESOLUTION_S
        if abs(moved - nbytes) > slack:
            raise SystemExit(f"{who}: {summary}: a repetition moved {moved:.0f} bytes, "
                             f"not {nbytes}")
        if result["wrRdTime"] <= 0:
            raise SystemExit(f"{who}: {summary}: a read time of 0 (IOR prints 0.1 ms): "
                             "read more bytes (--size)")
        spans.append(nbytes / result["wrRdTime"] / BYTES_PER_GB)
        own.append(result["bwMiB"] * MIB / BYTES_PER_GB)
    return {"read GB/s": statistics.median(spans), "restore GB/s": statistics.median(own)}


def safetensors_tree(root: Path, nbytes: int) -> Path:
    """mdtest's files under `root` (made by `mdtest -C`), each rewritten as a safetensors
    file of one `nbytes` tensor, and a Hugging Face index naming them all, so that
    stampede restores the very files mdtest stats and opens (names and places unchanged)."""
    weight_map = {}
    for path in sorted((root / "mdtest_tree.0").iterdir()):
        name = path.name.replace(".", "_")
        header = json.dumps({name: {"dtype": "U8", "shape": [nbytes],
                                    "data_offsets": [0, nbytes]}}).encode()
        header += b" " * (-len(header) % 8)   # the data 8-byte aligned, as writers do
        path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(nbytes))
        weight_map[name] = f"mdtest_tree.0/{path.name}"
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def mdtest_rates(stdout: str, stat: bool = True) -> dict[str, float]:
    """mdtest's File stat (where `stat`: run with -T) and File read (-e 0: open + close)
    mean rates."""
    rows = {str(row["op"]): row["ops_per_s"] for row in
            mdtest_rows(stdout, "cephfs_vs_ior", "warm", "mdtest")}
    rates = {"stat/s": rows.get("stat"), "open+close/s": rows.get("read")}
    if not stat:
        del rates["stat/s"]
    missing = [name for name, rate in rates.items() if not isinstance(rate, float)]
    if missing:
        raise SystemExit(f"cephfs_vs_ior: mdtest printed no rate for {missing}:\n{stdout}")
    return {name: float(rate) for name, rate in rates.items() if isinstance(rate, float)}


def client_conf(cluster: CephCluster, scratch: Path) -> Path:
    """The cluster's conf with the settings stampede's cephfs:// client makes, for IOR's and
    mdtest's CEPHFS clients: the object cacher off, and its bounds (a dead monitor, OSD or
    mount an error after timeout_s: libcephfs's defaults wait without end, 300 s and 30 s)."""
    conf = scratch / "peer-client.conf"
    settings = {"client_oc": "false", **dict.fromkeys(
        ("client_mount_timeout", "rados_mon_op_timeout", "rados_osd_op_timeout",
         "client_shutdown_timeout"), str(CEPHFS_TIMEOUT_S))}
    conf.write_text(cluster.conf.read_text() + "\n[client]\n" + "".join(
        f"{option.replace('_', ' ')} = {value}\n" for option, value in settings.items()))
    return conf


def part_named(text: str) -> str:
    """One of --parts' words (argparse's error names the option and the words allowed)."""
    if text not in PARTS:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(PARTS)}")
    return text


def way_named(text: str) -> str:
    """One of --ways' words."""
    if text not in WAYS:
        raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(WAYS)}")
    return text


def main() -> int:
    parser = docstring_parser(__doc__)
    parser.add_argument("--ior", default=shutil.which("ior") or "/opt/ior/bin/ior")
    parser.add_argument("--mdtest", default=None, help="default: mdtest beside --ior")
    parser.add_argument("--mpiexec", default=None,
                        help="the launcher of the MPI IOR and mdtest were built with "
                             "(default: found from the library ldd shows IOR linked with)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="64MiB", help="read: bytes per rank")
    parser.add_argument("--block", default="4MiB", help="read: bytes per read")
    parser.add_argument("--items", type=int, default=500, help="metadata: files per rank")
    parser.add_argument("--meta-size", default="4KiB", help="metadata: tensor bytes per file")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="parent of the scratch directory")
    parser.add_argument("--ways", default=",".join(WAYS),
                        type=lambda text: comma_separated(text, way_named),
                        help=f"which ways to the file system, comma-separated: "
                             f"{', '.join(WAYS)} (default: both)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        type=lambda text: comma_separated(text, part_named),
                        help=f"what each round measures, comma-separated: {', '.join(PARTS)} "
                             "(default: both)")
    args = parser.parse_args()
    parts = set(args.parts)
    args.ways = [way for way in WAYS if way in args.ways]   # in the table's order
    mdtest = args.mdtest or str(Path(args.ior).parent / "mdtest")
    reason = unavailable() or next((f"no {name} at {path} (see --help)" for name, path in
                                    (("IOR", args.ior), ("mdtest", mdtest))
                                    if not os.access(path, os.X_OK)), "")
    if reason:
        raise SystemExit(f"cephfs_vs_ior: {reason}")
    mpiexec = args.mpiexec or mpi_launcher_of(args.ior)
    size, block = parse_size(args.size), parse_size(args.block)
    print(f"{machine_text(with_ram=True)}; load {load_average_text()}", flush=True)
    results: dict[tuple[str, str, str], list[float]] = {}   # (way, pair, side) -> per round
    with scratch_directory("stampede-ceph-ior-", args.dir) as scratch, \
            running_cluster(scratch / "ceph") as cluster, \
            cluster.mounted(scratch / "mnt") as mountpoint:
        env, conf = cluster.env(), client_conf(cluster, scratch)
        archive = scratch / "runs.csv"
        common_keys = {"iterations": args.iterations, "warmup": 1, "cache": "warm",
                       "verify": "none"}
        read_job = write_job_toml(scratch / "read.toml", {
            "target": {"path": mountpoint / "ck"},
            "checkpoint": {"size_per_rank": args.size, "layout": ["shared"],
                           "block_size": args.block},
            "pattern": {"ops": ["open", "read", "close"]},
            "run": common_keys, "archive": {"path": archive}})
        run_checked(mpiexec_command(args.ranks, sys.executable, "-m", "stampede", "prepare",
                                    str(read_job)))
        (shared,) = [path for path in (mountpoint / "ck" / "shared").iterdir()
                     if path.is_file() and path.stat().st_size == size * args.ranks]
        shared_relpath = str(shared.relative_to(mountpoint))
        items = ["-F", "-n", str(args.items), "-i", "1"]
        tree = mountpoint / "mdt" / MDTEST_ROOT
        if "metadata" in parts:
            run_peer([mpiexec, "-n", str(args.ranks), mdtest, *items, "-C", "-d",
                      str(mountpoint / "mdt")], env)
            safetensors_tree(tree, parse_size(args.meta_size))
        stat_job, open_job, first_open_job = (write_job_toml(scratch / f"{name}.toml", {
            "target": {"path": tree},
            "checkpoint": {"source": "existing", "assign": ["files"]},
            "pattern": {"ops": ops, "order": "file"}, "run": {**common_keys, **run},
            "archive": {"path": archive}}) for name, ops, run in (
                ("stat", ["stat"], {"iterations": 1, "warmup": 0}),
                ("open", ["open", "close"], {}),   # file by file: as mdtest -E, in turn
                ("first-open", ["open", "close"], {"iterations": 1, "warmup": 0})))
        targets = {"ceph-fuse": (str(mountpoint / "ck"), str(tree)),
                   "cephfs://": (cluster.url("ck"), cluster.url(f"mdt/{MDTEST_ROOT}"))}

        def measure_read(way: str, side: str, round_number: int) -> dict[str, float]:
            if side == "stampede":
                read = stampede_run(read_job, args.ranks, archive, targets[way][0])
                return {"read GB/s": read["read"], "restore GB/s": read["restore"]}
            summary = scratch / f"ior-{way[:6]}-{round_number}.json"
            run_peer([mpiexec, "-n", str(args.ranks), args.ior, *peer_api(way, conf),
                      "-r", "-E", "-k", "-s", "1", "-b", str(size), "-t", str(block),
                      "-i", str(args.iterations + 1), "-o",   # the first: its warm-up
                      peer_path(way, mountpoint, shared_relpath),
                      "-O", "summaryFormat=JSON", "-O", f"summaryFile={summary}"], env)
            return ior_read_rates(summary, size * args.ranks, "cephfs_vs_ior")

        def measure_metadata(way: str, side: str, round_number: int) -> dict[str, float]:
            meta_target = targets[way][1]
            if side == "stampede":
                stats = [stampede_run(stat_job, args.ranks, archive, meta_target)["stat"]
                         for _ in range(args.iterations)]
                opens = stampede_run(open_job, args.ranks, archive, meta_target, "--trace")
                firsts = [stampede_run(first_open_job, args.ranks, archive, meta_target,
                                       "--trace")["open+close/s"]
                          for _ in range(args.iterations)]
                rates = {"stat/s": statistics.median(stats),
                         "open+close/s": opens["open+close/s"],
                         "o+c +index/s": opens["o+c +index/s"],
                         "first o+c/s": statistics.median(firsts)}
            else:
                runs = [mdtest_rates(run_peer(
                    [mpiexec, "-n", str(args.ranks), mdtest, *peer_api(way, conf), *items,
                     "-T", "-E", "-e", "0", "-d", peer_path(way, mountpoint, "mdt")], env))
                    for _ in range(args.iterations)]
                rates = {what: statistics.median(run[what] for run in runs)
                         for what in runs[0]}
                rates["o+c +index/s"] = rates["open+close/s"]
                firsts = [mdtest_rates(run_peer(   # no -T: the opens are the first calls
                    [mpiexec, "-n", str(args.ranks), mdtest, *peer_api(way, conf), *items,
                     "-E", "-e", "0", "-d", peer_path(way, mountpoint, "mdt")], env),
                    stat=False)["open+close/s"] for _ in range(args.iterations)]
                rates["first o+c/s"] = statistics.median(firsts)
            return rates

        measures = {"read": measure_read, "metadata": measure_metadata}
        for round_number in range(args.rounds):
            order = ("stampede", "peer") if round_number % 2 == 0 else ("peer", "stampede")
            for way in args.ways:
                for side in order:
                    for part in PARTS:   # in a side's run, the read first, as always
                        if part in parts:
                            for pair, rate in measures[part](way, side, round_number).items():
                                results.setdefault((way, pair, side), []).append(rate)
            print(f"round {round_number + 1}/{args.rounds} done; load {load_average_text()}",
                  flush=True)
    print_table(results, args, mpiexec)
    return 0


def print_table(results: dict[tuple[str, str, str], list[float]], args: argparse.Namespace,
                mpiexec: str) -> None:
    """Medians (min-max) of each side, the paired ratio and its verdict, per pair."""
    print(f"\nCeph 16.2 single node (memstore OSD) on 127.0.0.1; {args.ranks} ranks; read: "
          f"one shared file, {args.size} per rank in {args.block} transfers; metadata: "
          f"{args.items} ops per rank; {args.iterations} iterations per run, "
          f"{args.rounds} rounds; peers launched with {mpiexec}")
    header = (f"{'way':<10} {'what':<13} {'stampede':>26} {'peer':>7} {'peer rate':>26} "
              f"{'ratio':>6}  verdict")
    print(header)
    print("-" * len(header))
    for way, pair, peer in measured(results):
        ours = results[(way, pair, "stampede")]
        theirs = results[(way, pair, "peer")]
        ratio = statistics.median(a / b for a, b in zip(ours, theirs))
        mine, other = median_min_max(ours), median_min_max(theirs)
        verdict = ratio_verdict(ratio, TARGET_RATIO, (mine, other))
        print(f"{way:<10} {pair:<13} {spread_text(mine):>26} {peer:>7} "
              f"{spread_text(other):>26} {ratio:>6.3f}  {verdict}")
    print("medians (min-max) over rounds; ratio = stampede / peer, the median of per-round "
          "ratios; GB = 1e9 B\nper-round ratios, in round order:")
    for way, pair, _ in measured(results):
        ratios = [a / b for a, b in zip(results[(way, pair, "stampede")],
                                        results[(way, pair, "peer")])]
        print(f"  {way:<10} {pair:<13} {' '.join(f'{ratio:.2f}' for ratio in ratios)}")
    if METADATA_LOOPS:
        print(f"stampede's stat, open and close passes ran: {', '.join(sorted(METADATA_LOOPS))} "
              "(docs/concepts/measured.md)")
    print(f"load after: {load_average_text()}")


def measured(results: dict[tuple[str, str, str], list[float]]) -> list[tuple[str, str, str]]:
    """(way, pair, peer) of every pair measured (--ways, --parts), in the table's order."""
    return [(way, pair, peer) for way in WAYS for pair, peer in PAIRS
            if (way, pair, "stampede") in results]


def spread_text(summary: tuple[float, float, float]) -> str:
    return f"{format_plain(summary[0])} ({format_plain(summary[1])}-{format_plain(summary[2])})"


if __name__ == "__main__":
    sys.exit(main())
