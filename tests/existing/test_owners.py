"""Existing checkpoints restored whole on every rank (a replicated restore): whole-file,
every rank reading every tensor (N-fold reads), against owners, each tensor read once by
an owner chosen by bytes and then Allgatherv'd (PyTorch's cooperative DCP load). The
published safetensors model at 2 ranks and a DCP checkpoint torch saved, at 3, under a
real mpiexec: needed bytes, read amplification for the job, its node and its worst rank,
and every rank's copy of the whole checkpoint hashed as a plain read of the tensors in
the owners' order hashes it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from stampede.existing.assign import assign, owned
from stampede.existing.catalogue import Catalogue
from stampede.existing.scan import scan
from tests.helpers.existing import read_digests
from tests.helpers.jobs import read_archive, write_job


def _bytes_of(root: Path, catalogue: Catalogue, relpath: str, offset: int, length: int,
              tensor: str) -> bytes:
    """An extent's bytes from the file: raw offsets, or from its tensor's first byte."""
    if tensor:
        offset += next(t.file_offset for t in catalogue.tensors if t.name == tensor)
    with open(root / relpath, "rb") as stream:
        stream.seek(offset)
        return stream.read(length)


@pytest.mark.parametrize("nranks", [2, 3, 5])
def test_every_tensor_has_one_owner_largest_first(published: Path, nranks: int) -> None:
    catalogue = scan(str(published))
    parts = owned(catalogue, nranks)
    names = [extent.tensor for part in parts for extent in part]
    assert sorted(names) == sorted(t.name for t in catalogue.tensors if t.nbytes)
    loads = [sum(extent.length for extent in part) for part in parts]
    assert sum(loads) == catalogue.total_bytes
    # largest first to the least loaded: no rank ends more than one tensor above another
    assert max(loads) - min(loads) <= max(t.nbytes for t in catalogue.tensors)
    assert [assign(catalogue, "owners", nranks, rank) for rank in range(nranks)] == parts
    every = assign(catalogue, "whole-file", nranks, 0)
    assert sum(extent.length for extent in every) == catalogue.total_bytes


@pytest.mark.mpi
@pytest.mark.parametrize(("fixture", "nranks"), [("published", 2), ("dcp_dir", 3)])
def test_owners_read_each_tensor_once_whole_file_n_times(stampede, tmp_path: Path,
                                                         request: pytest.FixtureRequest,
                                                         fixture: str, nranks: int) -> None:
    checkpoint = Path(request.getfixturevalue(fixture))
    job = write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["whole-file", "owners"], "block_size": "1MiB"},
                    run={"iterations": 1, "warmup": 1, "verify": "sha256"},
                    archive={"path": str(tmp_path / "results" / "existing.csv")})
    result = stampede("run", str(job), "--checkpoint", str(checkpoint), np=nranks)
    assert result.returncode == 0, result.stdout + result.stderr
    catalogue = scan(str(checkpoint))
    total = catalogue.total_bytes
    restores = {row["layout"]: row for row in read_archive(tmp_path / "results" / "existing.csv")
                if row["op"] == "restore"}
    assert {row["valid"] for row in restores.values()} == {"true"}
    assert {int(row["needed_bytes"]) for row in restores.values()} == {total}
    whole, owners = restores["whole-file"], restores["owners"]
    assert float(whole["storage_bytes_per_iteration"]) == nranks * total
    assert float(whole["read_amplification"]) == nranks
    assert float(whole["read_amplification_node_max"]) == nranks   # one node: N reads of it
    assert float(whole["read_amplification_rank_max"]) == 1.0      # a rank reads what it needs
    assert float(owners["storage_bytes_per_iteration"]) == total
    assert float(owners["read_amplification"]) == 1.0
    assert float(owners["read_amplification_node_max"]) == 1.0
    parts = owned(catalogue, nranks)
    largest = max(sum(extent.length for extent in part) for part in parts)
    assert float(owners["read_amplification_rank_max"]) == pytest.approx(largest / total)
    # after the Allgatherv every rank holds the whole checkpoint, in the owners' order
    expected = hashlib.sha256(b"".join(
        _bytes_of(checkpoint.parent if checkpoint.is_file() else checkpoint, catalogue,
                  extent.relpath, extent.offset, extent.length, extent.tensor)
        for part in parts for extent in part)).hexdigest()
    held = read_digests(tmp_path)["owners"]
    assert sorted(int(entry["rank"]) for entry in held) == list(range(nranks))
    assert {entry["sha256"] for entry in held} == {expected}
