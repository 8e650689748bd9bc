"""Every real loader that installs here, under a real mpiexec at 1 and 2 ranks, on real
checkpoints (the published model, its shards with an index, a .bin torch.save wrote, a
DCP checkpoint 2 gloo ranks saved, a tensorizer file): each rank holds exactly what the
assignment gives it (digests against a plain reference read), the loader's rows carry the
same bytes as stampede's own restore of the same run, and a missing loader or device is
a skip that says why."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from stampede.existing.scan import scan
from stampede.results.cells import typed
from stampede.results.loaders import loader_lines
from tests.helpers import checkpoints
from tests.helpers.jobs import read_archive, write_job
from tests.helpers.loaders import (
    expected_dcp,
    expected_safetensors,
    expected_whole,
    loader_package,
    sidecar,
)

pytestmark = pytest.mark.mpi
SAFETENSORS_LOADERS = ("safetensors", "runai", "fastsafetensors")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _run(stampede: Any, tmp_path: Path, checkpoint: Path, loaders: str, nranks: int,
         assign: list[str], cache: str = "cold", devices: str = "cpu") -> list[dict[str, str]]:
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": assign, "block_size": "1MiB"},
                    run={"iterations": 2, "warmup": 1, "cache": cache},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(checkpoint), "--loaders", loaders,
                      "--devices", devices, np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Real loaders beside the storage ceiling" in result.stdout
    return read_archive(tmp_path / "results" / "loaders.csv")


def _held(tmp_path: Path, loader: str, policy: str) -> list[dict[str, list[Any]]]:
    document = sidecar(tmp_path / "results" / "loaders.csv")
    entry = document["loaders"][f"{loader} cpu {policy}"]
    assert entry["valid"] and not entry["messages"], entry["messages"]
    return list(entry["digests"])


def _beside_the_ceiling(rows: list[dict[str, str]], loader: str, policy: str,
                        total_bytes: int) -> None:
    """The loader's restore row and the ceiling's: one run, the same bytes, an efficiency."""
    restores = {row["tool"]: row for row in rows
                if row["op"] == "restore" and row["layout"] == policy}
    assert set(restores) >= {"stampede", loader}
    assert {restores[name]["backend"] for name in ("stampede", loader)} == {"posix"}
    assert {restores[name]["run_id"] for name in ("stampede", loader)} == {rows[0]["run_id"]}
    assert int(restores[loader]["bytes_total"]) == int(restores["stampede"]["bytes_total"]) \
        == total_bytes
    assert restores[loader]["valid"] == "true" and restores[loader]["device"] == "cpu"
    line = next(line for line in loader_lines([typed(row) for row in rows])
                if line.loader == loader and line.policy == policy)
    assert math.isfinite(line.efficiency) and line.efficiency > 0 and line.dominant


@pytest.mark.parametrize("nranks", [1, 2])
@pytest.mark.parametrize("loader", SAFETENSORS_LOADERS)
def test_safetensors_loaders_hold_their_assignment(stampede, tmp_path: Path, published: Path,
                                                   loader: str, nranks: int) -> None:
    loader_package(loader)
    rows = _run(stampede, tmp_path, published, loader, nranks, ["files", "tensor-slices"])
    for policy in ("files", "tensor-slices"):
        _beside_the_ceiling(rows, loader, policy, scan(str(published)).total_bytes)
        assert _held(tmp_path, loader, policy) == expected_safetensors(published, policy, nranks)
    phases = {row["op"] for row in rows if row["tool"] == loader}
    assert phases >= {"header", "load", "restore"}


def test_sharded_safetensors_with_an_index_warm(stampede, tmp_path: Path, sharded: Path) -> None:
    for loader in SAFETENSORS_LOADERS:
        loader_package(loader)
    rows = _run(stampede, tmp_path, sharded, ",".join(SAFETENSORS_LOADERS), 2,
                ["files", "tensor-slices"], cache="warm")
    assert {row["cache"] for row in rows} == {"warm"}
    for loader in SAFETENSORS_LOADERS:
        for policy in ("files", "tensor-slices"):
            _beside_the_ceiling(rows, loader, policy, scan(str(sharded)).total_bytes)
            assert _held(tmp_path, loader, policy) == expected_safetensors(sharded, policy, 2)


@pytest.mark.parametrize("nranks", [1, 2])
def test_torch_load_of_a_bin(stampede, tmp_path: Path, torch_bin: Path, nranks: int) -> None:
    torch = checkpoints.require_torch()
    rows = _run(stampede, tmp_path, torch_bin, "torch.load", nranks, ["files", "tensor-slices"])
    whole = expected_whole(torch.load(torch_bin, weights_only=True), torch_bin.name)
    for policy in ("files", "tensor-slices"):
        _beside_the_ceiling(rows, "torch.load", policy, scan(str(torch_bin)).total_bytes)
        held = _held(tmp_path, "torch.load", policy)
        # one file: `files` gives it to rank 0 alone; every rank loads it for its slices
        loading = [0] if policy == "files" else list(range(nranks))
        assert [rank for rank, part in enumerate(held) if part] == loading
        assert all(part == whole for part in held if part)
        # what it loaded over what the ranks needed: every loading rank loads the file
        restore = next(row for row in rows if row["tool"] == "torch.load"
                       and row["layout"] == policy and row["op"] == "restore")
        assert int(restore["needed_bytes"]) == scan(str(torch_bin)).total_bytes
        assert float(restore["read_amplification"]) == pytest.approx(len(loading), rel=0.01)
        # one node: its ranks load the file once each; a loading rank's file over its share
        assert float(restore["read_amplification_node_max"]) == pytest.approx(len(loading),
                                                                               rel=0.01)
        assert float(restore["read_amplification_rank_max"]) == pytest.approx(len(loading),
                                                                               rel=0.01)
        line = next(line for line in loader_lines([typed(row) for row in rows])
                    if line.loader == "torch.load" and line.policy == policy)
        assert line.amplification == pytest.approx((len(loading),) * 3, rel=0.01)


@pytest.mark.parametrize("nranks", [1, 2])
def test_dcp_load_of_a_checkpoint_2_ranks_saved(stampede, tmp_path: Path, dcp_dir: Path,
                                                nranks: int) -> None:
    rows = _run(stampede, tmp_path, dcp_dir, "dcp", nranks, ["saved", "tensor-slices"])
    expected = expected_dcp(dcp_dir, tmp_path)
    for policy in ("saved", "tensor-slices"):
        _beside_the_ceiling(rows, "dcp", policy, scan(str(dcp_dir)).total_bytes)
        held = _held(tmp_path, "dcp", policy)
        assert set().union(*held) == set(expected)   # every tensor, by some rank
        for part in held:
            assert part == {name: expected[name] for name in part}
    phases = {row["op"] for row in rows if row["tool"] == "dcp"}
    assert phases == {"index", "plan", "load", "restore"}


def test_tensorizer_of_a_tensors_file(stampede, tmp_path: Path, tensorizer_file: Path,
                                      published: Path) -> None:
    from safetensors.torch import load_file

    rows = _run(stampede, tmp_path, tensorizer_file, "tensorizer", 2, ["tensor-slices"])
    _beside_the_ceiling(rows, "tensorizer", "tensor-slices", tensorizer_file.stat().st_size)
    whole = expected_whole(load_file(published), tensorizer_file.name)
    assert _held(tmp_path, "tensorizer", "tensor-slices") == [whole, whole]


def test_a_loader_of_another_format_and_a_missing_gpu_are_skipped_with_why(
        stampede, tmp_path: Path, published: Path) -> None:
    loader_package("safetensors")
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    run={"iterations": 1, "warmup": 0},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(published), "--loaders",
                      "safetensors,torch.load", np=1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipped: torch.load: reads torch checkpoints; this one is safetensors" in result.stdout
    if not cuda_available():
        assert "skipped: cuda: --device cuda: PyTorch sees no CUDA device" in result.stdout
    rows = read_archive(tmp_path / "results" / "loaders.csv")
    assert {(row["tool"], row["backend"]) for row in rows} == \
        {("stampede", "posix"), ("safetensors", "posix")}


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is visible here")
def test_only_cuda_without_a_gpu_runs_nothing(stampede, tmp_path: Path, published: Path) -> None:
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(published), "--devices", "cuda",
                      np=2)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "nothing to run" in result.stderr and "no CUDA device" in result.stderr
    assert not (tmp_path / "results" / "loaders.csv").exists()


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device visible to torch on this machine")
def test_the_device_path_on_a_gpu(stampede, tmp_path: Path, published: Path) -> None:
    loader_package("safetensors")
    rows = _run(stampede, tmp_path, published, "safetensors", 1, ["files"], devices="cpu,cuda")
    devices = {row["device"] for row in rows if row["tool"] == "safetensors"}
    assert "cpu" in devices and any(device.startswith("cuda:0 ") for device in devices)


def test_a_loader_that_raises_on_one_rank_is_archived_invalid(stampede, tmp_path: Path) -> None:
    """torch.load(weights_only=True) refuses a pickled object stampede's restore never
    unpickles: rank 0 fails, rank 1 (given no file) does not hang; exit 1, rows invalid."""
    import datetime

    torch = checkpoints.require_torch()
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    torch.save({"w": torch.ones(1024, 256), "saved_on": datetime.date(2026, 1, 1)},
               checkpoint / "model.pt")
    job = write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                    run={"iterations": 2, "warmup": 0},
                    archive={"path": str(tmp_path / "results" / "loaders.csv")})
    result = stampede("loaders", str(job), "--checkpoint", str(checkpoint), "--loaders",
                      "torch.load", np=2)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "loaders finished with errors, archived as invalid" in result.stderr
    assert "rank 0: torch.load: UnpicklingError" in result.stdout
    rows = read_archive(tmp_path / "results" / "loaders.csv")
    assert {row["valid"] for row in rows if row["tool"] == "torch.load"} == {"false"}
    assert {row["valid"] for row in rows if row["tool"] == "stampede"} == {"true"}
