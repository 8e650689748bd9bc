"""The contention model (stampede.model.contention.predict) against `stampede emulate-mds`, s and c known.

The quick form of bench/model_vs_emulator.py (its docstring has the whole argument): the
emulator with S = 10 ms per request and C = 2 slots, `stampede run` through it at N = 1,
2, 4 ranks, each layout's time to last rank against the model's prediction, within 15%.

Mapping (kernel caches off; path MOUNT/DIR/FILE; the mount's root is free): a stat is a
LOOKUP of DIR, a LOOKUP of FILE and a GETATTR; an open is the two LOOKUPs and an OPEN;
read and close make no metadata request. Both counts are measured here (the fastest op / S).
  sharded (plain emulator): every request takes a slot: model ops = requests (k = 6 per
          rank), s = S, c = C, RTT per request = the pass-through's per-op latency / 3.
  shared (--serialize-inode): the file's requests queue one at a time, the DIR lookup
          does not: model ops = stampede's ops (k = 2), s = 2 S, c_eff = 1,
          RTT = the pass-through's per-op latency + S (the DIR lookup).
RTT and the data term come from separate runs through the emulator at S = 0 (no
metadata service time), not from the runs predicted: RTT = mean of stat and open p50 at
N = 1; data term = that run's time to last rank - k RTT, fitted by project's fit_data.

Robust, and still able to fail. A single run per point failed on this busy 2-core machine
(measured +15% to +56% over the model), and so did the median of 3 runs on a day the
machine was noisier (runs of one point spread 75-156 ms; every point +4% to +40%): load
only ever adds time, so every point is the least-disturbed of RUNS = 5 runs (the minimum,
as timeit takes), taken in turn through the three mounts (base, plain, serial, then
again), so that a burst of load slows one run of each kind, not all runs of one. Then
the errors were within 5% (two runs). The server's own record is checked without wall-
clock: every request held S (p50 within 5%) and the slots bound (at most C in service
at once). And the same points must reject a wrong model: given S 30% too high or too
low, the model must miss at least half the points by more than the tolerance (the
metadata service is most of each time to last rank here, so a 30% error in S moves the
prediction by 25-28%; it missed 6 of 6 both ways).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.emulate.mount import read_summary, requests_per_op, running
from stampede.launcher import find_mpiexec
from stampede.model.contention import Params, predict
from stampede.model.fit import fit_data
from tests.helpers.jobs import read_archive, write_job

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("no_mount_left")]

SERVICE_S, THREADS, RANKS, TOLERANCE, RUNS = 0.010, 2, (1, 2, 4), 0.15, 5
BYTES_PER_RANK = 2 * 2**20
K = 2                                   # stat_count = open_count = 1: two metadata ops per rank
MEASURED_IN = {"sharded": "plain", "shared": "serial"}
WRONG = 0.30                            # a service time this far off must be rejected

# results[mount][layout][N] = the least over RUNS runs of (time to last rank, stat p50, open p50)
Results = dict[str, dict[str, dict[int, tuple[float, float, float]]]]


def model_params(layout: str, base: dict[int, tuple[float, float, float]],
                 service_s: float) -> Params:
    """The model's parameters for a layout, given the server's service time S (the module's
    mapping); RTT and the data term from the S = 0 mount's least-disturbed runs."""
    rtt_op = (base[1][1] + base[1][2]) / 2
    data_s = [max(base[n][0] - K * rtt_op, 1e-6) for n in RANKS]
    agg, client, _, _ = fit_data(RANKS, [BYTES_PER_RANK] * len(RANKS), data_s)
    if layout == "shared":          # the file's 2 requests per op queue; the DIR lookup not
        return Params(rtt_s=rtt_op + service_s, service_s=2 * service_s, threads=THREADS,
                      agg_bps=agg, client_bps=client, ops_per_rank=K,
                      bytes_per_rank=BYTES_PER_RANK, whole_rounds=True)
    return Params(rtt_s=rtt_op / 3, service_s=service_s, threads=THREADS, agg_bps=agg,
                  client_bps=client, ops_per_rank=3 * K, bytes_per_rank=BYTES_PER_RANK,
                  whole_rounds=True)


def least_disturbed(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    last, stat, opened = (min(column) for column in zip(*points))
    return last, stat, opened


def errors(results: Results, service_s: float) -> dict[tuple[str, int], tuple[float, float]]:
    """(layout, N) -> (measured, the model's prediction given service_s)."""
    compared = {}
    for layout, mount in MEASURED_IN.items():
        params = model_params(layout, results["base"][layout], service_s)
        for n in RANKS:
            compared[layout, n] = (results[mount][layout][n][0], predict(params, n, layout).total_s)
    return compared


def outside(compared: dict[tuple[str, int], tuple[float, float]]) -> list[str]:
    return [f"{layout} N={n}: measured {measured * 1e3:.1f} ms, model {model * 1e3:.1f} ms, "
            f"error {(measured - model) / measured:+.1%}"
            for (layout, n), (measured, model) in compared.items()
            if abs(measured - model) / measured > TOLERANCE]


def run_through(stampede, job: Path, archive: Path, mountpoint: Path, layouts: str,
                nranks: int) -> dict[str, tuple[float, float, float]]:
    archive.unlink(missing_ok=True)
    result = stampede("run", str(job), "--set", f"target.path={mountpoint}",
                      "--set", f"checkpoint.layout={layouts}", np=nranks, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {(row["layout"], row["op"]): row for row in read_archive(archive)}
    return {layout: (float(rows[layout, "restore"]["time_to_last_rank_s"]),
                     float(rows[layout, "stat"]["lat_p50_s"]),
                     float(rows[layout, "open"]["lat_p50_s"]))
            for layout in ("shared", "sharded") if (layout, "restore") in rows}


# the layouts each mount is read through: base (S = 0) both, plain sharded, serial shared
THROUGH = {"base": '["shared", "sharded"]', "plain": '["sharded"]', "serial": '["shared"]'}
Runs = dict[str, dict[str, dict[int, list[tuple[float, float, float]]]]]


def measure(stampede, job: Path, backing: Path,
            mounts: dict[str, Path]) -> tuple[Runs, dict[str, dict[str, int]]]:
    """Every run through the three mounts at each N, RUNS times in turn; and the emulator
    requests of a stat and an open (measured on the first checkpoint)."""
    archive = job.parent / "results" / "job.csv"
    options = ("--threads", str(THREADS))
    runs: Runs = {}
    requests: dict[str, dict[str, int]] = {}
    with running(backing, mounts["base"], "--service-s", "0", *options), \
            running(backing, mounts["plain"], "--service-s", str(SERVICE_S), *options), \
            running(backing, mounts["serial"], "--service-s", str(SERVICE_S), *options,
                     "--serialize-inode"):
        for nranks in RANKS:
            if nranks > 1:
                assert stampede("clean", str(job)).returncode == 0
            prepared = stampede("prepare", str(job), np=nranks)
            assert prepared.returncode == 0, prepared.stderr
            if not requests:
                shard = next((mounts["plain"] / "sharded").iterdir())
                requests["sharded"] = requests_per_op(shard, SERVICE_S)
                shared = mounts["serial"] / "shared" / "checkpoint.raw"
                requests["shared"] = requests_per_op(shared, SERVICE_S)
            for _ in range(RUNS):       # in turn: a burst of load slows one run of each mount
                for mount, layouts in THROUGH.items():
                    for layout, measured in run_through(stampede, job, archive, mounts[mount],
                                                        layouts, nranks).items():
                        runs.setdefault(mount, {}).setdefault(layout, {}).setdefault(
                            nranks, []).append(measured)
    return runs, requests


def test_time_to_last_rank_agrees_with_the_model(stampede, fuse_ready: None,
                                                 tmp_path: Path) -> None:
    if find_mpiexec() is None:
        pytest.fail("mpiexec not found: pip install -e '.[mpi,test]'")
    backing = tmp_path / "ckpt"
    backing.mkdir()
    job = write_job(tmp_path, target={"path": str(backing)},
                    checkpoint={"size_per_rank": "2MiB", "layout": ["shared", "sharded"],
                                "block_size": "1MiB"},
                    pattern={"ops": ["stat", "open", "read", "close"], "stat_count": 1,
                             "open_count": 1},
                    run={"iterations": 3, "warmup": 1, "verify": "none", "cache": "warm"},
                    archive={"path": str(tmp_path / "results" / "job.csv")})
    mounts = {mount: tmp_path / mount for mount in THROUGH}
    runs, requests = measure(stampede, job, backing, mounts)
    assert requests == {"sharded": {"stat": 3, "open": 3}, "shared": {"stat": 3, "open": 3}}
    served = {mount: read_summary(mountpoint) for mount, mountpoint in mounts.items()}
    for mount in ("plain", "serial"):       # the server's record: S held, the slots bound
        for op in ("getattr", "open"):
            held_s = served[mount]["ops"][op]["held_p50_s"]
            assert SERVICE_S <= held_s <= 1.05 * SERVICE_S, (mount, op, held_s)
        assert 1 <= served[mount]["peak_in_service"] <= THREADS
    assert served["plain"]["peak_in_service"] == THREADS     # 4 ranks outnumber the slots
    results: Results = {mount: {layout: {n: least_disturbed(points) for n, points in by_n.items()}
                                for layout, by_n in by_layout.items()}
                        for mount, by_layout in runs.items()}
    compared = errors(results, SERVICE_S)
    print("\n".join(f"{layout} N={n}: measured {measured * 1e3:.1f} ms (runs "
                    + ", ".join(f"{run[0] * 1e3:.1f}" for run in runs[MEASURED_IN[layout]][layout][n])
                    + f"), model {model * 1e3:.1f} ms, error {(measured - model) / measured:+.1%}"
                    for (layout, n), (measured, model) in compared.items()))
    missed = outside(compared)
    assert not missed, "outside 15%:\n" + "\n".join(missed)
    for wrong in (1 + WRONG, 1 - WRONG):    # the same points reject a wrong service time
        rejected = outside(errors(results, wrong * SERVICE_S))
        print(f"given S x {wrong:g}: {len(rejected)} of {len(compared)} points outside 15%")
        assert len(rejected) >= len(compared) / 2, (wrong, rejected)
