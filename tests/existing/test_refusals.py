"""Checkpoints that are not what stampede reads, or not safely: each refused with one
message naming what was found and what is supported (exit 2), never a traceback."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from stampede.errors import CheckpointError
from stampede.existing.scan import scan
from tests.helpers import checkpoints, requires


def _expect(path: Path, *words: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        scan(str(path))
    assert caught.value.exit_status == 2
    for word in words:
        assert word in str(caught.value), str(caught.value)
    return caught.value


def test_an_empty_directory(tmp_path: Path) -> None:
    error = _expect(tmp_path, "empty")
    assert "safetensors" in error.hint and "DCP" in error.hint and "HDF5" in error.hint


def test_files_of_no_supported_format(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 64)
    (tmp_path / "notes.txt").write_text("hello")
    _expect(tmp_path, "pytorch_model.bin", "does not read")
    (tmp_path / "pytorch_model.bin").unlink()
    _expect(tmp_path, "notes.txt", "1 entry")
    _expect(tmp_path / "notes.txt", "not a checkpoint file")
    _expect(tmp_path / "nowhere", "No such file")


def test_a_stampede_prepared_target(tmp_path: Path, published: Path) -> None:
    shutil.copy(published, tmp_path / "model.safetensors")
    (tmp_path / "stampede-manifest.json").write_text("{}")
    error = _expect(tmp_path, "stampede-manifest.json", "prepared")
    assert "stampede run" in error.hint
    (tmp_path / "sharded").mkdir()
    _expect(tmp_path / "sharded", "prepared")


def test_a_chunked_compressed_hdf5_dataset(tmp_path: Path) -> None:
    requires.module("h5py", "HDF5")
    path = checkpoints.write_chunked_hdf5(tmp_path)
    error = _expect(path, "layers/weight", "chunked", "gzip", "contiguous")
    assert "chunks=" in error.hint


def test_a_shard_the_index_names_is_missing(tmp_path: Path, sharded: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(sharded, copy)
    (copy / "model-00002-of-00003.safetensors").unlink()
    _expect(copy, "model.safetensors.index.json", "model-00002-of-00003.safetensors", "missing")


def test_the_index_names_a_tensor_its_shard_lacks(tmp_path: Path, sharded: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(sharded, copy)
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    index["weight_map"]["pooler.weight"] = "model-00001-of-00003.safetensors"
    (copy / "model.safetensors.index.json").write_text(json.dumps(index))
    _expect(copy, "pooler.weight", "does not hold it")


@pytest.mark.parametrize("cut", [5, 8 + 1000, 1_000_000])
def test_a_truncated_safetensors_file(tmp_path: Path, published: Path, cut: int) -> None:
    with open(published, "rb") as stream:
        (tmp_path / "model.safetensors").write_bytes(stream.read(cut))
    _expect(tmp_path, "model.safetensors", "truncated?")


def test_a_corrupt_safetensors_header(tmp_path: Path, published: Path) -> None:
    data = bytearray(published.read_bytes()[:4096])
    data[0:8] = (2**40).to_bytes(8, "little")
    (tmp_path / "a.safetensors").write_bytes(bytes(data))
    _expect(tmp_path, "header length", "not plausible")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
    (tmp_path / "a.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    _expect(tmp_path, "'w'", "needs 16 bytes", "corrupt header")
    (tmp_path / "a.safetensors").write_bytes((4).to_bytes(8, "little") + b"{{{{")
    _expect(tmp_path, "not valid JSON")
    nested = b"[" * 200_000 + b"]" * 200_000   # valid JSON too deep for the parser
    (tmp_path / "a.safetensors").write_bytes(len(nested).to_bytes(8, "little") + nested)
    _expect(tmp_path, "not valid JSON")


def test_a_dcp_shard_is_missing(tmp_path: Path, dcp_dir: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(dcp_dir, copy)
    (copy / "__1_0.distcp").unlink()
    _expect(copy, ".metadata", "__1_0.distcp", "No such file")
    with open(dcp_dir / "__1_0.distcp", "rb") as stream:
        (copy / "__1_0.distcp").write_bytes(stream.read(1000))
    _expect(copy, "__1_0.distcp", "truncated?")


def test_dcp_without_torch_says_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".metadata").write_bytes(b"not read")
    (tmp_path / "__0_0.distcp").write_bytes(b"\0" * 16)
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch now fails
    error = _expect(tmp_path, "PyTorch DCP checkpoints need torch to read .metadata")
    assert "pip install torch" in error.hint


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.getcwd, ())   # harmless, but code: never run it from a checkpoint


def test_dcp_metadata_is_unpickled_with_torch_classes_only(tmp_path: Path) -> None:
    checkpoints.require_torch()
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Payload()))
    _expect(tmp_path, "not a readable PyTorch DCP metadata file", "refusing posix.getcwd")
    (tmp_path / ".metadata").write_bytes(b"\x80\x04garbage")
    _expect(tmp_path, "not a readable PyTorch DCP metadata file")
    # through a torch.distributed.checkpoint module to what it imported: a dotted name
    # (protocol 4), or the imported module itself (protocol 0)
    module = b"torch.distributed.checkpoint.filesystem"
    # ... and a DCP class that is not part of the metadata (one starts a process group)
    (tmp_path / ".metadata").write_bytes(
        b"\x80\x04\x8c" + bytes([len(module)]) + module + b"\x8c\x10FileSystemWriter\x93)R.")
    _expect(tmp_path, "not a readable PyTorch DCP metadata file", "refusing")
    for name in (b"os.getcwd", b"os"):
        (tmp_path / ".metadata").write_bytes(
            b"\x80\x04\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)])
            + name + b"\x93)R.")
        _expect(tmp_path, "not a readable PyTorch DCP metadata file", "refusing")


