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
RTT and the data term come from a separate run through the emulator at S = 0 (no
metadata service time), not from the runs predicted: RTT = mean of stat and open p50 at
N = 1; data term = that run's time to last rank - k RTT, fitted by project's fit_data.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.emulate.mount import requests_per_op, running
from stampede.launcher import find_mpiexec
from stampede.model.contention import Params, predict
from stampede.model.fit import fit_data
from tests.helpers.jobs import read_archive, write_job

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("no_mount_left")]

SERVICE_S, THREADS, RANKS, TOLERANCE = 0.010, 2, (1, 2, 4), 0.15
BYTES_PER_RANK = 2 * 2**20
K = 2                                   # stat_count = open_count = 1: two metadata ops per rank


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
    archive = tmp_path / "results" / "job.csv"
    options = ("--threads", str(THREADS))
    # results[mount][layout][N] = (time to last rank, stat p50, open p50)
    results: dict[str, dict[str, dict[int, tuple[float, float, float]]]] = {}
    requests: dict[str, dict[str, int]] = {}
    through = {"base": '["shared", "sharded"]', "plain": '["sharded"]', "serial": '["shared"]'}
    with running(backing, tmp_path / "base", "--service-s", "0", *options), \
            running(backing, tmp_path / "plain", "--service-s", str(SERVICE_S), *options), \
            running(backing, tmp_path / "serial", "--service-s", str(SERVICE_S), *options,
                     "--serialize-inode"):
        for nranks in RANKS:
            if nranks > 1:
                assert stampede("clean", str(job)).returncode == 0
            prepared = stampede("prepare", str(job), np=nranks)
            assert prepared.returncode == 0, prepared.stderr
            if not requests:
                shard = next((tmp_path / "plain" / "sharded").iterdir())
                requests["sharded"] = requests_per_op(shard, SERVICE_S)
                shared = tmp_path / "serial" / "shared" / "checkpoint.raw"
                requests["shared"] = requests_per_op(shared, SERVICE_S)
            for mount, layouts in through.items():
                archive.unlink(missing_ok=True)
                result = stampede("run", str(job), "--set", f"target.path={tmp_path / mount}",
                                  "--set", f"checkpoint.layout={layouts}", np=nranks, timeout=60)
                assert result.returncode == 0, result.stderr
                rows = {(row["layout"], row["op"]): row for row in read_archive(archive)}
                for layout in ("shared", "sharded"):
                    if (layout, "restore") in rows:
                        results.setdefault(mount, {}).setdefault(layout, {})[nranks] = (
                            float(rows[layout, "restore"]["time_to_last_rank_s"]),
                            float(rows[layout, "stat"]["lat_p50_s"]),
                            float(rows[layout, "open"]["lat_p50_s"]))
    assert requests == {"sharded": {"stat": 3, "open": 3}, "shared": {"stat": 3, "open": 3}}

    report, errors = [], {}
    for layout, mount in (("sharded", "plain"), ("shared", "serial")):
        base = results["base"][layout]
        rtt_op = (base[1][1] + base[1][2]) / 2
        data_s = [max(base[n][0] - K * rtt_op, 1e-6) for n in RANKS]
        agg, client, _, _ = fit_data(RANKS, [BYTES_PER_RANK] * len(RANKS), data_s)
        if layout == "shared":          # the file's 2 requests per op queue; the DIR lookup not
            params = Params(rtt_s=rtt_op + SERVICE_S, service_s=2 * SERVICE_S, threads=THREADS,
                            agg_bps=agg, client_bps=client, ops_per_rank=K,
                            bytes_per_rank=BYTES_PER_RANK, whole_rounds=True)
        else:                           # every request a slot: 3 requests per op
            params = Params(rtt_s=rtt_op / 3, service_s=SERVICE_S, threads=THREADS, agg_bps=agg,
                            client_bps=client, ops_per_rank=3 * K, bytes_per_rank=BYTES_PER_RANK,
                            whole_rounds=True)
        for n in RANKS:
            measured, model = results[mount][layout][n][0], predict(params, n, layout).total_s
            errors[layout, n] = (measured - model) / measured
            report.append(f"{layout} N={n}: measured {measured * 1e3:.1f} ms, model "
                          f"{model * 1e3:.1f} ms, error {errors[layout, n]:+.1%}")
    print("\n".join(report))
    outside = [line for line, error in zip(report, errors.values()) if abs(error) > TOLERANCE]
    assert not outside, "outside 15%:\n" + "\n".join(outside)
