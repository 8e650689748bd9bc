"""Restoring on another rank count than the save's (policy reshard): a real DCP checkpoint
4 gloo ranks saved (weights cut by rows and by columns, replicated vectors, a scalar,
pickled values), restored at 2 and 3 ranks. Each rank's byte ranges, read from the files,
are exactly its new rows of every tensor as torch loads them (every element once, nothing
else), the pickled items are read whole by one rank; under a real mpiexec the CLI restores
it at 2 and 3 ranks with the bytes of its new shards as needed_bytes, 1.0x read
amplification, and every range read hashed as a plain read hashes it."""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path
from typing import Any

import pytest

from stampede.existing.assign import assign
from stampede.existing.scan import scan
from tests.helpers.checkpoints import require_torch
from tests.helpers.existing import read_digests
from tests.helpers.jobs import read_archive, write_job


def _read(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as stream:
        stream.seek(offset)
        return stream.read(length)


def _torch_view(torch: Any, root: Path) -> tuple[dict[str, Any], list[tuple[Any, Any, Any]]]:
    """torch's own reading: every tensor whole, and each saved item with its storage info
    and what torch.load makes of it (a chunk, or a pickled value)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(root)).read_metadata()
    full = {fqn: torch.zeros(tuple(meta.size), dtype=meta.properties.dtype)
            for fqn, meta in metadata.state_dict_metadata.items() if hasattr(meta, "size")}
    items = []
    for index, info in metadata.storage_data.items():
        value = torch.load(io.BytesIO(_read(root / info.relative_path, info.offset,
                                            info.length)), weights_only=False)
        if index.fqn in full:
            full[index.fqn][tuple(slice(o, o + n) for o, n in
                                  zip(index.offset, value.shape, strict=True))] = value
        items.append((index, info, value))
    return full, items


def _as_bytes(tensor: Any) -> bytes:
    return tensor.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes()


@pytest.mark.parametrize("nranks", [2, 3])
def test_each_rank_reads_exactly_its_new_rows(dcp4_dir: Path, nranks: int) -> None:
    torch = require_torch()
    full, items = _torch_view(torch, dcp4_dir)
    catalogue = scan(str(dcp4_dir))
    assert catalogue.saving_ranks == 4
    whole_reads: list[tuple[str, int, int]] = []
    for rank in range(nranks):
        held = {fqn: torch.zeros_like(tensor) for fqn, tensor in full.items()}
        seen = {fqn: torch.zeros(tensor.shape, dtype=torch.int32) for fqn, tensor in full.items()}
        for extent in assign(catalogue, "reshard", nranks, rank):
            index, info, value = next(
                item for item in items if item[1].relative_path == extent.relpath
                and item[1].offset <= extent.offset < item[1].offset + item[1].length)
            if index.fqn not in full or value.dim() == 0:   # pickled, or a scalar: whole
                assert (extent.offset, extent.length) == (info.offset, info.length)
                whole_reads.append((extent.relpath, extent.offset, extent.length))
                continue
            # where torch.load's chunk lies in its item: found by its bytes, not by a zip parser
            item = _read(dcp4_dir / info.relative_path, info.offset, info.length)
            start = info.offset + item.index(_as_bytes(value))
            row_bytes = len(_as_bytes(value[0]))
            low, rest = divmod(extent.offset - start, row_bytes)
            count, part = divmod(extent.length, row_bytes)
            assert rest == 0 and part == 0 and low + count <= value.shape[0], extent
            data = _read(dcp4_dir / extent.relpath, extent.offset, extent.length)
            assert data == _as_bytes(value[low:low + count])
            where = (slice(index.offset[0] + low, index.offset[0] + low + count),
                     *(slice(o, o + n) for o, n in zip(index.offset[1:], value.shape[1:],
                                                       strict=True)))
            held[index.fqn][where] = value[low:low + count]
            seen[index.fqn][where] += 1
        for fqn, tensor in full.items():
            if tensor.dim() == 0:
                continue
            rows = tensor.shape[0]
            first, last = rows * rank // nranks, rows * (rank + 1) // nranks
            assert bool((seen[fqn][first:last] == 1).all()), f"{fqn}: rows read once"
            assert int(seen[fqn].sum()) == (last - first) * math.prod(tensor.shape[1:])
            assert torch.equal(held[fqn][first:last], tensor[first:last]), fqn
    # the pickled values and the scalar: each read whole by one rank of the new count
    unsliced = sorted((info.relative_path, info.offset, info.length)
                      for index, info, value in items
                      if index.fqn not in full or full[index.fqn].dim() == 0)
    assert sorted(whole_reads) == unsliced


def test_what_the_ranks_need_is_the_elements_not_the_records(dcp4_dir: Path) -> None:
    """The new shards' bytes over all ranks: every element once, the unsliced items whole;
    the same at any rank count, below the files' bytes (torch.save's records around them
    are not read)."""
    require_torch()
    catalogue = scan(str(dcp4_dir))
    totals = {nranks: sum(extent.length for rank in range(nranks)
                          for extent in assign(catalogue, "reshard", nranks, rank))
              for nranks in (1, 2, 3, 4, 5)}
    assert len(set(totals.values())) == 1
    assert totals[1] < catalogue.total_bytes


def _job(tmp_path: Path) -> Path:
    return write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                     checkpoint={"assign": ["reshard"], "block_size": "256KiB"},
                     run={"iterations": 2, "warmup": 1, "verify": "sha256"},
                     archive={"path": str(tmp_path / "results" / "existing.csv")})


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [2, 3])
def test_a_dcp_checkpoint_saved_at_4_restored_at_2_and_3(stampede, tmp_path: Path,
                                                         dcp4_dir: Path, nranks: int) -> None:
    require_torch()
    result = stampede("run", str(_job(tmp_path)), "--checkpoint", str(dcp4_dir), np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    restore = next(row for row in rows if row["op"] == "restore")
    catalogue = scan(str(dcp4_dir))
    planned = [extent for rank in range(nranks)
               for extent in assign(catalogue, "reshard", nranks, rank)]
    needed = sum(extent.length for extent in planned)
    assert (restore["layout"], restore["format"], restore["valid"]) == ("reshard", "dcp", "true")
    assert int(restore["nranks"]) == nranks
    assert int(restore["needed_bytes"]) == needed == int(restore["bytes_total"])
    assert float(restore["read_amplification"]) == 1.0
    assert float(restore["read_amplification_rank_max"]) == 1.0
    assert float(restore["storage_bytes_per_iteration"]) == needed
    # every range read, hashed by the rank that read it, is a planned range of the file
    digests = read_digests(tmp_path)["reshard"]
    read = sorted((str(d["path"]), int(d["file_offset"]), int(d["length"])) for d in digests)
    assert read == sorted((e.relpath, e.offset, e.length) for e in planned)
    for entry in digests:
        data = _read(dcp4_dir / str(entry["path"]), int(entry["file_offset"]),
                     int(entry["length"]))
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]


@pytest.mark.mpi
def test_stampedes_own_save_at_4_restored_at_3(stampede, tmp_path: Path) -> None:
    """A version `stampede save` wrote at 4 ranks (sharded, safetensors: one tensor per
    shard file) restored in place at 3: every rank 1/3 of each shard's rows, 1.0x."""
    save = write_job(tmp_path, "save", target={"path": str(tmp_path / "ckpt")},
                     checkpoint={"size": "8MiB", "layout": ["sharded"], "format": "safetensors",
                                 "block_size": "1MiB"},
                     run={"iterations": 1, "warmup": 0},
                     archive={"path": str(tmp_path / "results" / "save.csv")})
    saved = stampede("save", str(save), np=4)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    version = tmp_path / "ckpt" / "saves" / "sharded" / "v000001" / "sharded"
    assert len(list(version.glob("*.safetensors"))) == 4
    result = stampede("run", str(_job(tmp_path)), "--checkpoint", str(version), np=3)
    assert result.returncode == 0, result.stdout + result.stderr
    restore = next(row for row in read_archive(tmp_path / "results" / "existing.csv")
                   if row["op"] == "restore")
    assert (restore["format"], restore["valid"], int(restore["nranks"])) == ("safetensors",
                                                                             "true", 3)
    assert int(restore["needed_bytes"]) == 8 * 1024 * 1024
    assert float(restore["read_amplification"]) == 1.0
    catalogue = scan(str(version))
    for rank in range(3):   # a third of every shard's elements, from each of the 4 files
        extents = assign(catalogue, "reshard", 3, rank)
        assert sorted({extent.relpath for extent in extents}) == sorted(
            relpath for relpath, _ in catalogue.files)
