"""Host -> device: `stampede gpu` and run.h2d with the `host` device under mpiexec, and a
clear refusal where no GPU can be used. GPU tests run only where torch sees a device."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from stampede.run.devices import HOST_LABEL
from stampede.run.h2d import write_safetensors
from tests.helpers import requires
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import read_archive, small_job, write_job

pytestmark = pytest.mark.mpi
MiB = 2**20


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return bool(torch.cuda.is_available())


def test_gpu_sweep_on_the_host_device_is_labelled_everywhere(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "gpu.csv"
    result = stampede("gpu", "--device", "host", "--sizes", "4MiB,16MiB", "--modes",
                      "pageable,file", "--trials", "3", "--archive", str(archive), np=2)
    assert result.returncode == 0, result.stderr
    assert HOST_LABEL in result.stdout
    rows = read_archive(archive)
    assert {row["device"] for row in rows} == {HOST_LABEL}
    assert all(HOST_LABEL in row["warnings"] for row in rows)
    h2d = [row for row in rows if row["op"] == "h2d"]
    assert sorted((row["layout"], int(row["block_bytes"])) for row in h2d) == [
        ("file", 4 * MiB), ("file", 16 * MiB), ("pageable", 4 * MiB), ("pageable", 16 * MiB)]
    for row in h2d:
        assert int(row["count"]) == 2 * 3 and int(row["op_bytes"]) == 2 * 3 * int(row["block_bytes"])
        assert float(row["agg_gbps"]) > 0
    reads = [row for row in rows if row["op"] == "read"]
    assert {row["layout"] for row in reads} == {"file"} and {row["cache"] for row in reads} == {"cold"}
    # what was measured: stampede's copies, in their own phase, from files or from memory
    assert {(row["layout"], row["tool"], row["phase"], row["backend"]) for row in rows} == {
        ("file", "stampede", "h2d", "posix"), ("pageable", "stampede", "h2d", "-")}
    again = stampede("report", str(archive))   # re-rendered from the archive alone
    assert again.returncode == 0 and "Host -> device" in again.stdout and HOST_LABEL in again.stdout


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is visible here")
def test_cuda_without_a_gpu_is_refused_never_replaced(stampede, tmp_path: Path) -> None:
    result = stampede("gpu", "--device", "cuda", "--archive", str(tmp_path / "g.csv"), np=2)
    assert result.returncode == 2
    assert ("needs PyTorch" in result.stderr) or ("sees no CUDA device" in result.stderr)
    assert not (tmp_path / "g.csv").exists()


def test_bad_gpu_requests_exit_2(stampede, tmp_path: Path) -> None:
    for args, message in [
        (("--device", "host", "--modes", "pinned"), "need a CUDA device"),
        (("--device", "host", "--modes", "teleport"), "modes of pageable"),
        (("--device", "host", "--sizes", "4XB"), "--sizes '4XB'"),
    ]:
        result = stampede("gpu", *args, "--archive", str(tmp_path / "g.csv"))
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_run_h2d_puts_every_restored_byte_on_the_device(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": ["sharded", "broadcast"], "replicas": 2},
                    run={"h2d": "host"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    for layout, per_iteration in (("sharded", 16), ("broadcast", 1)):  # blocks, or one shard
        ops = {row["op"]: row for row in rows if row["layout"] == layout}
        h2d, restore = ops["h2d"], ops["restore"]
        assert int(h2d["count"]) == 2 * 2 * per_iteration           # 2 ranks, 2 iterations
        assert int(h2d["op_bytes"]) == int(restore["op_bytes"]) == 2 * 2 * 16 * MiB
        assert h2d["device"] == HOST_LABEL and "stand-in for tests" in h2d["warnings"]
        assert float(restore["time_to_last_rank_s"]) >= float(h2d["lat_max_s"])


@pytest.mark.parametrize("fixture", ["published", "sharded", "dcp_dir"])
def test_run_h2d_with_an_existing_checkpoint_copies_every_tensor_byte(
        stampede, tmp_path: Path, fixture: str, request: pytest.FixtureRequest) -> None:
    checkpoint = request.getfixturevalue(fixture)
    policies = ["saved", "tensor-slices"] if fixture == "dcp_dir" else ["files", "tensor-slices"]
    job = write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": policies, "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 1, "verify": "sha256", "h2d": "host"},
                    archive={"path": str(tmp_path / "results" / "existing.csv")})
    result = stampede("run", str(job), "--checkpoint", str(checkpoint), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    for policy in policies:
        ops = {row["op"]: row for row in rows if row["layout"] == policy}
        assert {row["valid"] for row in ops.values()} == {"true"}
        # every byte restored was copied on to the device, as it was read
        assert int(ops["h2d"]["op_bytes"]) == int(ops["restore"]["op_bytes"]) > 0
        assert int(ops["h2d"]["count"]) == int(ops["read"]["count"])
        assert ops["h2d"]["device"] == HOST_LABEL
    root = checkpoint.parent if checkpoint.is_file() else checkpoint
    for digests in read_digests(tmp_path).values():   # the bytes read are the files' own
        accounted(root, digests, str(checkpoint))


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is visible here")
def test_gpu_gds_without_kvikio_or_a_gpu_is_refused_before_any_io(stampede,
                                                                  tmp_path: Path) -> None:
    for device in ("cuda", "host"):
        result = stampede("gpu", "--device", device, "--modes", "gds", "--dir",
                          str(tmp_path / "files"), "--archive", str(tmp_path / "g.csv"))
        assert result.returncode == 2, result.stderr
        said = result.stderr
        assert ("needs kvikio" in said and "[gds]" in said) or "need a CUDA device" in said \
            or "sees no CUDA device" in said or "needs PyTorch" in said, said
        assert not (tmp_path / "g.csv").exists() and not (tmp_path / "files").exists()


def test_written_safetensors_files_load_with_the_format_library(tmp_path: Path) -> None:
    requires.module("safetensors", "TORCH", "pip install -e '.[gpu]' (or the test extra)")
    from safetensors.numpy import load_file
    path = tmp_path / "shard.safetensors"
    write_safetensors(path, 150 * MiB + 6)
    tensors = load_file(str(path))
    assert sum(array.nbytes for array in tensors.values()) == 150 * MiB + 6
    assert len(tensors) == 3 and all(str(array.dtype) == "float16" for array in tensors.values())


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device visible to torch on this machine")
def test_gpu_sweep_on_a_real_gpu(stampede, tmp_path: Path) -> None:
    archive = tmp_path / "gpu.csv"
    result = stampede("gpu", "--sizes", "64MiB", "--modes", "pageable,pinned,pin+copy,file,safetensors",
                      "--trials", "3", "--archive", str(archive))
    assert result.returncode == 0, result.stderr
    rows = read_archive(archive)
    assert all(row["device"].startswith("cuda:") for row in rows)
    pinned = next(row for row in rows if row["layout"] == "pinned" and row["op"] == "h2d")
    assert float(pinned["agg_gbps"]) > 1


def test_a_rank_failing_alone_aborts_the_job_instead_of_hanging(stampede, tmp_path: Path) -> None:
    # rank 1 cannot create its file (a directory stands where it goes); rank 0 can, and
    # would wait for rank 1 in the next barrier forever if the failure were not fatal.
    (tmp_path / "files" / f"rank-00001-{4 * MiB}.raw").mkdir(parents=True)
    result = stampede("gpu", "--device", "host", "--modes", "file", "--sizes", "4MiB",
                      "--dir", str(tmp_path / "files"), "--archive", str(tmp_path / "g.csv"),
                      np=2, timeout=60)
    assert result.returncode != 0
    assert "Is a directory" in result.stderr
    assert not (tmp_path / "g.csv").exists()
