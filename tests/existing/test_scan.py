"""stampede.existing.catalogue on real checkpoints no test wrote by hand (tests/checkpoints.py): a
published model's safetensors file, shards and an index re-split from it by the
safetensors library, a DCP checkpoint saved by torch.distributed.checkpoint on 2 gloo
ranks, HDF5 files written by h5py. scan must agree with the formats' own libraries,
assign must read every tensor byte exactly once, and nothing may change on disk."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stampede.checkpoint.formats import parse_header
from stampede.checkpoint.plan import Extent
from stampede.dtypes import ITEMSIZE
from stampede.errors import UsageError
from stampede.existing.assign import assign, balance
from stampede.existing.catalogue import Catalogue, TensorInfo
from stampede.existing.scan import scan
from stampede.spec import ASSIGN_POLICIES as POLICIES
from tests.helpers import checkpoints

RANKS = range(1, 8)


# ------------------------------------------------------------------------------ fixtures


# published, sharded, hdf5_dir and dcp_dir are session fixtures in tests/conftest.py


CHECKPOINTS = ("published", "sharded", "hdf5_dir", "dcp_dir")


@pytest.fixture(params=CHECKPOINTS)
def any_checkpoint(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(request.param)
    return path


# ------------------------------------------------------------------------------- helpers


class _Pread:
    """The smallest backend parse_header needs: read_into by pread."""

    @staticmethod
    def read_into(handle: int, view: memoryview, offset: int) -> int:
        return os.preadv(handle, [view], offset)


def _locate(catalogue: Catalogue) -> dict[tuple[str, str], tuple[int, int]]:
    """(relpath, tensor) -> (file offset, bytes), located as a run locates them: by
    stampede.checkpoint.formats.parse_header, not by the catalogue under test."""
    if catalogue.format == "dcp":
        return {}
    located = {}
    scratch = memoryview(bytearray(1 << 16))
    for relpath, _ in catalogue.files:
        path = os.path.join(catalogue.root, relpath)
        wanted = [t.name for t in catalogue.tensors if t.relpath == relpath]
        fd = os.open(path, os.O_RDONLY)
        try:
            found = parse_header(catalogue.format, _Pread(), path, fd, scratch, wanted)
        finally:
            os.close(fd)
        located.update({(relpath, name): where for name, where in found.items()})
    return located


def _ranges(catalogue: Catalogue, policy: str, nranks: int,
            located: dict[tuple[str, str], tuple[int, int]]) -> dict[str, list[tuple[int, int, int]]]:
    """relpath -> sorted (start, end, rank) file ranges every rank reads."""
    ranges: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for rank in range(nranks):
        for extent in assign(catalogue, policy, nranks, rank):
            assert isinstance(extent, Extent) and extent.length > 0
            base = 0
            if extent.tensor:
                base, size = located[(extent.relpath, extent.tensor)]
                assert extent.offset + extent.length <= size
            ranges[extent.relpath].append((base + extent.offset, base + extent.offset
                                           + extent.length, rank))
    return {relpath: sorted(spans) for relpath, spans in ranges.items()}


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start == merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        elif end > start:
            merged.append((start, end))
    return merged


def _tensor_regions(catalogue: Catalogue) -> dict[str, list[tuple[int, int]]]:
    regions: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for tensor in catalogue.tensors:
        regions[tensor.relpath].append((tensor.file_offset, tensor.file_offset + tensor.nbytes))
    return {relpath: _merge(spans) for relpath, spans in regions.items() if _merge(spans)}


def _assert_exactly_once(catalogue: Catalogue, ranges: dict[str, list[tuple[int, int, int]]]) -> None:
    for relpath, spans in ranges.items():
        for (_, end, rank), (start, _, other) in zip(spans, spans[1:]):
            assert start >= end, f"{relpath}: ranks {rank} and {other} both read byte {start}"
    union = {relpath: _merge([(s, e) for s, e, _ in spans]) for relpath, spans in ranges.items()}
    assert union == _tensor_regions(catalogue)


def _snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every name under root with its mtime, size and mode (and root's own)."""
    snap = {".": (root.stat().st_mtime_ns, root.stat().st_size, root.stat().st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            snap[str(path.relative_to(root))] = (info.st_mtime_ns, info.st_size, info.st_mode)
    return snap


def _root(path: Path) -> Path:
    return path if path.is_dir() else path.parent


# ---------------------------------------------------------------- scan, against libraries


def test_published_safetensors_as_safe_open_reads_it(published: Path) -> None:
    from safetensors import safe_open

    catalogue = scan(str(published.parent))
    assert scan(str(published)) == catalogue            # the file or its directory
    assert catalogue.format == "safetensors" and catalogue.index_file == ""
    assert catalogue.root == str(published.parent) and catalogue.saving_ranks == 0
    assert catalogue.files == (("model.safetensors", published.stat().st_size),)
    by_name = {t.name: t for t in catalogue.tensors}
    fd = os.open(published, os.O_RDONLY)
    try:
        with safe_open(published, framework="np") as handle:
            assert sorted(handle.keys()) == sorted(by_name) and len(by_name) > 100
            for name in handle.keys():  # noqa: SIM118
                tensor, info = handle.get_tensor(name), by_name[name]
                piece = handle.get_slice(name)
                assert (info.dtype, list(info.shape)) == (piece.get_dtype(), piece.get_shape())
                assert info.nbytes == tensor.nbytes
                # the bytes at the catalogued offset are the tensor safe_open returns
                assert os.pread(fd, info.nbytes, info.file_offset) == tensor.tobytes()
    finally:
        os.close(fd)
    assert catalogue.total_bytes == sum(t.nbytes for t in catalogue.tensors)
    assert {t.dtype for t in catalogue.tensors} == {"F32", "I64"}


def test_sharded_safetensors_with_index(published: Path, sharded: Path) -> None:
    whole, catalogue = scan(str(published)), scan(str(sharded))
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert catalogue.format == "safetensors"
    assert catalogue.index_file == "model.safetensors.index.json"
    assert scan(str(sharded / "model.safetensors.index.json")) == catalogue
    assert [name for name, _ in catalogue.files] == [
        f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert all(size == (sharded / name).stat().st_size for name, size in catalogue.files)
    assert {t.name: t.relpath for t in catalogue.tensors} == index["weight_map"]
    assert catalogue.total_bytes == whole.total_bytes == index["metadata"]["total_size"]
    strip = {(t.name, t.dtype, t.shape, t.nbytes) for t in whole.tensors}
    assert {(t.name, t.dtype, t.shape, t.nbytes) for t in catalogue.tensors} == strip


def test_hdf5_as_h5py_reads_it(hdf5_dir: Path) -> None:
    import h5py

    catalogue = scan(str(hdf5_dir))
    assert catalogue.format == "hdf5" and catalogue.index_file == ""
    assert catalogue.files == (("model.h5", (hdf5_dir / "model.h5").stat().st_size),)
    by_name = {t.name: t for t in catalogue.tensors}
    fd = os.open(hdf5_dir / "model.h5", os.O_RDONLY)
    try:
        with h5py.File(hdf5_dir / "model.h5", "r") as file:
            datasets: list[str] = []
            file.visititems(lambda name, item: datasets.append(name)
                            if isinstance(item, h5py.Dataset) else None)
            assert sorted(datasets) == sorted(by_name)
            assert "encoder/layer_0/attention/qkv" in by_name
            for name in datasets:
                dataset, info = file[name], by_name[name]
                assert info.shape == dataset.shape and info.file_offset == dataset.id.get_offset()
                assert info.nbytes == dataset.id.get_storage_size() == dataset[()].nbytes
                assert os.pread(fd, info.nbytes, info.file_offset) == np.asarray(
                    dataset[()]).tobytes()
    finally:
        os.close(fd)
    assert {by_name[n].dtype for n in ("embeddings/word", "embeddings/position",
                                       "encoder/layer_0/attention/qkv", "tokens", "counts",
                                       "tiny", "encoder/layer_0/mask")} == {
        "F32", "F16", "F64", "I64", "I32", "U8", "BOOL"}
    assert by_name["step"].shape == () and by_name["step"].nbytes == 8


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_dcp_as_torch_reads_it(dcp_dir: Path) -> None:
    torch = checkpoints.require_torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    catalogue = scan(str(dcp_dir))
    metadata = FileSystemReader(str(dcp_dir)).read_metadata()
    assert catalogue.format == "dcp" and catalogue.index_file == ".metadata"
    assert catalogue.saving_ranks == 2
    assert catalogue.files == tuple((name, (dcp_dir / name).stat().st_size)
                                    for name in ("__0_0.distcp", "__1_0.distcp"))
    saved = sorted((info.relative_path, info.offset, info.length)
                   for info in metadata.storage_data.values())
    assert sorted((t.relpath, t.file_offset, t.nbytes) for t in catalogue.tensors) == saved
    assert catalogue.total_bytes == sum(length for *_, length in saved)
    # DCP writes each file as its items end to end: reading them all reads the files
    assert catalogue.total_bytes == sum(size for _, size in catalogue.files)
    by_name = {t.name: t for t in catalogue.tensors}
    assert {"0.weight#0", "0.weight#1", "1.weight#0", "3.weight#1", "1.bias", "step",
            "extra.epoch"} <= set(by_name)
    assert (by_name["3.weight#0"].dtype, by_name["3.weight#0"].shape) == ("BF16", (128, 1024))
    assert (by_name["1.weight#1"].dtype, by_name["1.weight#1"].shape) == ("F32", (1024, 128))
    assert (by_name["2.weight"].dtype, by_name["extra.epoch"].dtype) == ("F16", "")
    # each byte range holds what torch restores: the chunk of the full tensor dcp.load gives
    full = {name: torch.zeros(tuple(meta.size), dtype=meta.properties.dtype)
            for name, meta in metadata.state_dict_metadata.items()
            if isinstance(meta, TensorStorageMetadata)}
    restored: dict[str, Any] = {**full, "extra": {"epoch": 0, "lr": 0.0}}
    dcp.load(restored, checkpoint_id=str(dcp_dir), no_dist=True)
    assert restored["extra"] == {"epoch": 3, "lr": 0.001}
    for index, info in metadata.storage_data.items():
        with open(dcp_dir / info.relative_path, "rb") as stream:
            stream.seek(info.offset)
            item = torch.load(io.BytesIO(stream.read(info.length)), weights_only=True)
        if index.fqn not in full:
            continue
        where = tuple(slice(o, o + n) for o, n in zip(index.offset, item.shape))
        assert torch.equal(item, restored[index.fqn][where])


def _described(path: Path) -> str:
    """What `stampede plan --checkpoint PATH` prints about the checkpoint itself."""
    import io

    from stampede.present.report import make_console
    from stampede.present.report_plan import render_existing_plan

    stream = io.StringIO()
    render_existing_plan(scan(str(path)), 2, [], make_console(stream, width=200))
    return stream.getvalue()


def test_describe_says_what_the_checkpoint_holds(published: Path, sharded: Path) -> None:
    text = _described(sharded)
    assert "safetensors" in text.splitlines()[0] and "files: 3" in text
    assert "tensors: 104 (F32 103, I64 1)" in text
    assert "index file: model.safetensors.index.json" in text and "GiB" in text
    assert "saving ranks" not in text


def test_describe_dcp(dcp_dir: Path) -> None:
    text = _described(dcp_dir)
    assert "PyTorch DCP" in text and "saving ranks: 2" in text and "index file: .metadata" in text


# ---------------------------------------------------------------- assign, on real files


@pytest.mark.parametrize("policy", ["files", "tensor-slices"])
def test_every_tensor_byte_is_read_exactly_once(any_checkpoint: Path, policy: str) -> None:
    catalogue = scan(str(any_checkpoint))
    located = _locate(catalogue)
    for nranks in RANKS:
        _assert_exactly_once(catalogue, _ranges(catalogue, policy, nranks, located))


@pytest.mark.parametrize("policy", ["files", "tensor-slices", "saved"])
@pytest.mark.parametrize("nranks", [1, 2, 4])
def test_the_bytes_read_are_the_tensors_bytes(any_checkpoint: Path, policy: str,
                                              nranks: int) -> None:
    """SHA-256 of what the ranks read together (plain pread at the extents) against the
    plain file's bytes of the tensor regions."""
    catalogue = scan(str(any_checkpoint))
    if policy == "saved" and catalogue.format != "dcp":
        with pytest.raises(UsageError, match="saved"):
            assign(catalogue, policy, nranks, 0)
        return
    ranges = _ranges(catalogue, policy, nranks, _locate(catalogue))
    _assert_exactly_once(catalogue, ranges)
    for relpath, spans in ranges.items():
        path = os.path.join(catalogue.root, relpath)
        read = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY)
        try:
            for start, end, _ in spans:
                read.update(os.pread(fd, end - start, start))
        finally:
            os.close(fd)
        data = Path(path).read_bytes()
        plain = hashlib.sha256()
        for start, end in _tensor_regions(catalogue)[relpath]:
            plain.update(data[start:end])
        assert read.hexdigest() == plain.hexdigest(), relpath


def test_files_are_balanced_largest_first(sharded: Path) -> None:
    catalogue = scan(str(sharded))
    sizes = dict(catalogue.files)
    largest = sorted(sizes, key=lambda name: (-sizes[name], name))
    owners = balance(catalogue.files, 2)
    assert owners[largest[0]] == 0 and owners[largest[1]] == 1
    assert owners == balance(catalogue.files, 2)
    for nranks in (1, 2, 3, 4):
        per_rank = [assign(catalogue, "files", nranks, rank) for rank in range(nranks)]
        files = [{e.relpath for e in extents} for extents in per_rank]
        assert sum(len(f) for f in files) == 3
        # a rank reading a file reads every tensor of it, tensor-relative from byte 0
        for extents in per_rank:
            for extent in extents:
                info = next(t for t in catalogue.tensors
                            if (t.relpath, t.name) == (extent.relpath, extent.tensor))
                assert (extent.offset, extent.length) == (0, info.nbytes)
    assert assign(catalogue, "files", 4, 3) == ()   # three files, four ranks


def test_tensor_slices_split_on_elements(hdf5_dir: Path, published: Path) -> None:
    for catalogue in (scan(str(hdf5_dir)), scan(str(published))):
        for nranks in (2, 3, 4, 7):
            per_tensor: dict[str, list[int]] = defaultdict(list)
            for rank in range(nranks):
                for extent in assign(catalogue, "tensor-slices", nranks, rank):
                    size = ITEMSIZE[next(t.dtype for t in catalogue.tensors
                                         if t.name == extent.tensor)]
                    assert extent.offset % size == 0 and extent.length % size == 0
                    per_tensor[extent.tensor].append(extent.length // size)
            for tensor in catalogue.tensors:
                counts = per_tensor[tensor.name]
                elements = tensor.nbytes // ITEMSIZE[tensor.dtype]
                assert sum(counts) == elements
                assert len(counts) == min(nranks, elements)
                assert max(counts) - min(counts) <= 1     # as equal as possible
    tiny = [e for rank in range(4) for e in assign(scan(str(hdf5_dir)), "tensor-slices", 4, rank)
            if e.tensor == "tiny"]
    assert len(tiny) == 3                               # 3 elements, 4 ranks: one reads none


def test_saved_reads_back_what_each_rank_saved(dcp_dir: Path) -> None:
    catalogue = scan(str(dcp_dir))
    for nranks in (1, 2, 3, 4):
        for rank in range(nranks):
            files = {e.relpath for e in assign(catalogue, "saved", nranks, rank)}
            assert files == {f"__{saver}_0.distcp" for saver in (0, 1) if saver % nranks == rank}
    mine = assign(catalogue, "saved", 2, 1)
    assert all(e.tensor == "" for e in mine)          # raw extents: file offsets
    assert sorted((e.offset, e.length) for e in mine) == sorted(
        (t.file_offset, t.nbytes) for t in catalogue.tensors if t.relpath == "__1_0.distcp")
    assert not any(e.relpath == ".metadata" for r in range(2)
                   for e in assign(catalogue, "saved", 2, r))


def test_scan_and_assign_change_nothing_on_disk(any_checkpoint: Path) -> None:
    root = _root(any_checkpoint)
    before = _snapshot(root)
    catalogue = scan(str(any_checkpoint))
    for policy in POLICIES:
        if policy == "saved" and catalogue.format != "dcp":
            continue
        for rank in range(3):
            assign(catalogue, policy, 3, rank)
    _described(Path(catalogue.root))
    assert _snapshot(root) == before


def test_policy_and_rank_are_checked(published: Path) -> None:
    catalogue = scan(str(published))
    with pytest.raises(UsageError, match="policy 'stripes' is not one of files"):
        assign(catalogue, "stripes", 2, 0)
    with pytest.raises(UsageError, match="PyTorch DCP"):
        assign(catalogue, "saved", 2, 0)
    with pytest.raises(ValueError):
        assign(catalogue, "files", 2, 2)


# --------------------------------------------------------------- assign, as a property


@st.composite
def catalogues(draw: st.DrawFn) -> Catalogue:
    fmt = draw(st.sampled_from(["safetensors", "hdf5", "dcp"]))
    nfiles = draw(st.integers(1, 4))
    tensors, files = [], []
    for number in range(nfiles):
        relpath, offset = f"f{number}", draw(st.integers(0, 64))
        for index in range(draw(st.integers(0, 5))):
            dtype = draw(st.sampled_from(["F32", "BF16", "F64", "U8", "F4", ""]))
            elements = draw(st.integers(0, 40))
            nbytes = elements * ITEMSIZE.get(dtype, 1)
            tensors.append(TensorInfo(f"t{number}.{index}", relpath, dtype, (elements,),
                                      nbytes, offset))
            offset += nbytes + draw(st.integers(0, 8))
        files.append((relpath, offset))
    return Catalogue(root="/nowhere", format=fmt, files=tuple(files), tensors=tuple(tensors),
                     index_file="", saving_ranks=0)


@settings(max_examples=300, deadline=None)
@given(catalogue=catalogues(), nranks=st.integers(1, 9),
       policy=st.sampled_from(["files", "tensor-slices"]))
def test_assign_covers_every_byte_once_for_any_catalogue(catalogue: Catalogue, nranks: int,
                                                         policy: str) -> None:
    located = {(t.relpath, t.name): (t.file_offset, t.nbytes) for t in catalogue.tensors}
    ranges = _ranges(catalogue, policy, nranks, located)
    _assert_exactly_once(catalogue, ranges)
    if policy == "files":   # a file is read whole by one rank
        owners = {relpath: {rank for *_, rank in spans} for relpath, spans in ranges.items()}
        assert all(len(ranks) == 1 for ranks in owners.values())
    raw = catalogue.format == "dcp"
    for rank in range(nranks):
        assert all((e.tensor == "") == raw for e in assign(catalogue, policy, nranks, rank))
