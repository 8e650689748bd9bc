"""run.exchange = "torch" under a real mpiexec: gloo on host memory at 2 and 4 ranks holds
every byte the MPI exchange does (run.verify = xxh3 on every member, the readers and the
ranks that only received), archives the process group's initialisation (pg_init) and its
first collective apart from the steady state; the GPU paths (nccl, cuda-gds) refuse
clearly where there is no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import requires
from tests.helpers.jobs import read_archive, small_job

MiB = 2**20
ITERATIONS = 2


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _ops(rows: list[dict[str, str]], layout: str) -> dict[str, dict[str, str]]:
    return {row["op"]: row for row in rows if row["layout"] == layout}


@pytest.fixture
def torch_installed() -> None:
    requires.module("torch", "TORCH")


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 4])
def test_gloo_holds_every_byte_the_mpi_exchange_does(stampede, tmp_path: Path, nranks: int,
                                                     torch_installed: None) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["broadcast", "striped"], "replicas": 2},
                    run={"verify": "xxh3", "iterations": ITERATIONS})
    assert stampede("prepare", str(job), np=nranks).returncode == 0
    by_exchange = {}
    for exchange in ("mpi", "torch"):
        archive = tmp_path / f"{exchange}.csv"
        result = stampede("run", str(job), "--set", f"run.exchange={exchange}", "--set",
                          f"archive.path={archive}", np=nranks)
        assert result.returncode == 0, result.stdout + result.stderr
        by_exchange[exchange] = read_archive(archive)
    samples = nranks * ITERATIONS
    for layout, op in (("broadcast", "bcast"), ("striped", "allgather")):
        mpi_ops, torch_ops = (_ops(by_exchange[e], layout) for e in ("mpi", "torch"))
        for ops in (mpi_ops, torch_ops):
            assert {row["valid"] for row in ops.values()} == {"true"}
            # every rank checked the shard it holds, the ranks that only received included
            assert int(ops["verify"]["count"]) == samples and ops["verify"]["errors"] == "0"
            assert int(ops["restore"]["op_bytes"]) == samples * 16 * MiB // (nranks // 2)
        # the same bytes crossed the network, as the same op, in both
        assert int(torch_ops[op]["count"]) == samples
        assert torch_ops[op]["op_bytes"] == mpi_ops[op]["op_bytes"]
        assert torch_ops["restore"]["op_bytes"] == mpi_ops["restore"]["op_bytes"]
        # the process group, made before each iteration, and its first collective, apart
        assert int(torch_ops["pg_init"]["count"]) == samples
        assert float(torch_ops["pg_init"]["elapsed_s"]) > 0
        assert int(torch_ops[f"{op}_first"]["count"]) == samples
        assert torch_ops[f"{op}_first"]["op_bytes"] == torch_ops[op]["op_bytes"]
        assert "pg_init" not in mpi_ops and {r["exchange"] for r in mpi_ops.values()} == {"mpi"}
        assert {r["exchange"] for r in torch_ops.values()} == {"torch"}
        assert "exchange through torch.distributed gloo (host memory)" in \
            torch_ops["restore"]["warnings"]
        assert f"pg_init and {op}_first ran before the phase's start barrier" in \
            torch_ops["restore"]["warnings"]


@pytest.mark.mpi
def test_gloo_then_the_device_copy_as_the_mpi_exchange_does(stampede, tmp_path: Path,
                                                            torch_installed: None) -> None:
    # run.h2d = host is not a GPU: gloo moves host memory, then the whole shard is copied
    # on to the device inside the restore, as after an MPI exchange
    job = small_job(tmp_path, checkpoint={"layout": ["broadcast"], "replicas": 2},
                    run={"verify": "xxh3", "exchange": "torch", "h2d": "host"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    ops = _ops(read_archive(tmp_path / "results" / "job.csv"), "broadcast")
    assert int(ops["h2d"]["count"]) == 2 * ITERATIONS
    assert int(ops["h2d"]["op_bytes"]) == int(ops["restore"]["op_bytes"]) == 2 * ITERATIONS * 16 * MiB
    assert "gloo (host memory)" in ops["restore"]["warnings"] and "d2h" not in ops


@pytest.mark.mpi
def test_stripes_out_of_rank_order_and_of_unequal_length(stampede, tmp_path: Path,
                                                         torch_installed: None) -> None:
    # rank_shift = 1: member i of a group (stripe i) is not its i-th lowest rank, which
    # torch's in-place all_gather would assume; 8196 KiB shards: stripes of 1024 and 1025
    # pages. Both are gathered stripe by stripe, and every byte still arrives.
    job = small_job(tmp_path, checkpoint={"layout": ["striped"], "replicas": 2,
                                          "size": "16392KiB"},
                    run={"verify": "xxh3", "rank_shift": 1, "exchange": "torch"})
    assert stampede("prepare", str(job), np=4).returncode == 0
    result = stampede("run", str(job), np=4)
    assert result.returncode == 0, result.stdout + result.stderr
    ops = _ops(read_archive(tmp_path / "results" / "job.csv"), "striped")
    assert {row["valid"] for row in ops.values()} == {"true"}
    assert int(ops["verify"]["count"]) == 4 * ITERATIONS and ops["verify"]["errors"] == "0"
    assert int(ops["allgather"]["count"]) == 4 * ITERATIONS


@pytest.mark.mpi
def test_a_corrupt_byte_reaches_the_receivers_through_gloo(stampede, tmp_path: Path,
                                                           torch_installed: None) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["broadcast"], "replicas": 2},
                    run={"verify": "xxh3", "exchange": "torch", "iterations": 1})
    assert stampede("prepare", str(job), np=2).returncode == 0
    shard = next((tmp_path / "ckpt").rglob("*.raw"))   # broadcast reads the shard files
    with open(shard, "r+b") as stream:
        stream.seek(4321)
        byte = stream.read(1)
        stream.seek(4321)
        stream.write(bytes([byte[0] ^ 0x01]))
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    # the reader and the rank that only received both hold the corrupt byte, and say so
    said = " ".join((result.stdout + result.stderr).split())
    assert "2 rank(s) read bytes that differ" in said
    for rank in (0, 1):
        assert f"rank {rank}: verify" in said
    assert said.count("first at offset 4321, last at offset 4321") >= 2


@pytest.mark.parametrize(("overrides", "message"), [
    (("checkpoint.layout=[\"sharded\"]",), "exchange nothing"),
    (("checkpoint.layout=[\"broadcast\"]", "checkpoint.replicas=2", "run.h2d=\"cuda-gds\""),
     "the MPI exchange moves host memory"),
    (("target.path=\"s3://bucket/ckpt\"", "run.h2d=\"cuda-gds\""), "cuFile reads POSIX files"),
])
def test_combinations_the_exchange_and_cuda_gds_cannot_run(stampede, tmp_path: Path,
                                                           overrides: tuple[str, ...],
                                                           message: str) -> None:
    job = small_job(tmp_path, run={"exchange": "torch"} if "exchange nothing" in message else {})
    sets = [word for text in overrides for word in ("--set", text)]
    result = stampede("run", str(job), *sets)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2   # one line, and its hint


@pytest.mark.mpi
@pytest.mark.skipif(cuda_available(), reason="a CUDA device is visible here")
@pytest.mark.parametrize("h2d", ["cuda-pinned", "cuda-gds"])
def test_nccl_and_cuda_gds_without_a_gpu_are_refused(stampede, tmp_path: Path, h2d: str) -> None:
    # run.exchange = torch with run.h2d = cuda-* is nccl on device memory: it needs a GPU,
    # and is never replaced by gloo or a host copy
    job = small_job(tmp_path, checkpoint={"layout": ["broadcast"], "replicas": 2},
                    run={"exchange": "torch", "h2d": h2d})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs PyTorch" in result.stderr or "sees no CUDA device" in result.stderr
    assert not (tmp_path / "results" / "job.csv").exists()


@pytest.mark.parametrize(("where", "refused"), [
    ([("a", 0), ("a", 1), ("b", 0), ("b", 1)], False),
    ([("a", 0), ("b", 0), ("a", 0)], True),
])
def test_nccl_takes_one_rank_per_gpu(where: list[tuple[str, int]], refused: bool) -> None:
    from stampede.errors import UsageError
    from stampede.run.torch_exchange import one_rank_per_gpu

    if not refused:
        one_rank_per_gpu(where)
        return
    with pytest.raises(UsageError, match="ranks 0 and 2 would share cuda:0 on a"):
        one_rank_per_gpu(where)
