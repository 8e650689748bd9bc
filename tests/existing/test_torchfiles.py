"""torch.save zips and tensorizer files as existing checkpoints: storages found at their
byte offsets from the zip alone (checked against what torch.load rebuilds), files that
are not what they say refused with one message, and `stampede run --checkpoint x.bin`
restoring every storage byte once at 1 and 2 ranks."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from stampede.errors import CheckpointError
from stampede.existing.scan import scan
from tests.helpers import checkpoints
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import read_archive, write_job


def _storage_hashes(path: Path) -> set[str]:
    """What torch.load rebuilds: the sha256 of every tensor's whole storage (as one uint8
    tensor over it: bytes(storage) walks it an element at a time, minutes per MiB)."""
    torch = checkpoints.require_torch()
    state = torch.load(path, map_location="cpu", weights_only=True)
    return {hashlib.sha256(torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
                           .numpy().tobytes()).hexdigest()
            for tensor in state.values()}


def test_a_torch_save_zip_is_its_storages_at_their_offsets(torch_bin: Path) -> None:
    catalogue = scan(str(torch_bin))
    assert catalogue.format == "torch" and catalogue.index_file == ""
    assert catalogue.files == (("pytorch_model.bin", torch_bin.stat().st_size),)
    data = torch_bin.read_bytes()
    found = {hashlib.sha256(data[t.file_offset:t.file_offset + t.nbytes]).hexdigest()
             for t in catalogue.tensors}
    assert found == _storage_hashes(torch_bin)
    assert all(t.name.startswith("data/") and t.file_offset % 64 == 0 for t in catalogue.tensors)
    assert scan(str(torch_bin.parent)).tensors == catalogue.tensors   # the directory too


def test_a_directory_with_safetensors_beside_a_bin_is_safetensors(tmp_path: Path,
                                                                   published: Path,
                                                                   torch_bin: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(published.read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(torch_bin.read_bytes())
    assert scan(str(tmp_path)).format == "safetensors"   # as Hugging Face's loaders choose


def test_a_directory_of_two_formats_is_refused_naming_both(tmp_path: Path, published: Path,
                                                           torch_bin: Path) -> None:
    """a.safetensors beside b.pt: two checkpoints, not one (the safetensors half was once
    read alone, without a word)."""
    (tmp_path / "a.safetensors").write_bytes(published.read_bytes())
    (tmp_path / "b.pt").write_bytes(torch_bin.read_bytes())
    with pytest.raises(CheckpointError, match=r"holds both safetensors \(a\.safetensors\) and "
                                              r"torch\.save \(b\.pt\) files: which is the "
                                              "checkpoint"):
        scan(str(tmp_path))
    assert scan(str(tmp_path / "b.pt")).format == "torch"       # one of them, named


def test_torch_files_that_are_not_torch_save_zips_are_refused(tmp_path: Path,
                                                              torch_bin: Path) -> None:
    torch = checkpoints.require_torch()
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(4)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy.pt: not a torch.save zip.*does not read"):
        scan(str(legacy))
    compressed = tmp_path / "compressed.bin"
    with zipfile.ZipFile(torch_bin) as source, \
            zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info))
    with pytest.raises(CheckpointError, match="compressed"):
        scan(str(compressed))
    with zipfile.ZipFile(tmp_path / "other.pth", "w") as other:
        other.writestr("notes/readme.txt", "no storages")
    with pytest.raises(CheckpointError, match="without torch storages"):
        scan(str(tmp_path / "other.pth"))


def test_a_tensorizer_file_is_one_whole_item(tensorizer_file: Path) -> None:
    catalogue = scan(str(tensorizer_file.parent))
    size = tensorizer_file.stat().st_size
    assert catalogue.format == "tensorizer"
    assert [(t.name, t.file_offset, t.nbytes) for t in catalogue.tensors] == \
        [("model.tensors", 0, size)]


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2])
def test_run_restores_a_torch_bin_at_1_and_2_ranks(stampede, tmp_path: Path, torch_bin: Path,
                                                    nranks: int) -> None:
    job = write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["files", "tensor-slices"], "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 1, "verify": "sha256", "cache": "cold"},
                    archive={"path": str(tmp_path / "results" / "existing.csv")})
    result = stampede("run", str(job), "--checkpoint", str(torch_bin), np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {row["format"] for row in rows} == {"torch"}
    assert {row["valid"] for row in rows} == {"true"}
    for digests in read_digests(tmp_path).values():
        accounted(torch_bin.parent, digests, str(torch_bin))
