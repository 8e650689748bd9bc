"""A rank's work for a loader is the assignment itself (stampede.existing.assign): the same
extents stampede's restore reads, in loaders' words (files, tensors, whole or a slice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.existing.assign import assign
from stampede.existing.scan import scan
from stampede.run.loaders.work import rank_work


@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("policy", ["files", "tensor-slices"])
def test_the_work_is_the_assignment(published: Path, policy: str, nranks: int) -> None:
    catalogue = scan(str(published))
    sizes = {t.name: t.nbytes for t in catalogue.tensors}
    total = 0
    for rank in range(nranks):
        work = rank_work(catalogue, policy, nranks, rank)
        extents = assign(catalogue, policy, nranks, rank)
        assert [(p.relpath, p.name, p.offset, p.length) for p in work.wanted] == \
            [(e.relpath, e.tensor, e.offset, e.length) for e in extents]
        assert all(p.whole == (p.offset == 0 and p.length == sizes[p.name]) for p in work.wanted)
        assert work.files == tuple(dict.fromkeys(e.relpath for e in extents))
        assert work.index_file == ""   # safetensors loaders read no index
        total += work.assigned_bytes
    assert total == catalogue.total_bytes
    sliced = rank_work(catalogue, policy, nranks, 0).sliced
    assert sliced == (policy == "tensor-slices" and nranks > 1)


def test_raw_items_are_whole_when_they_start_and_end_an_item(torch_bin: Path) -> None:
    catalogue = scan(str(torch_bin))
    whole = rank_work(catalogue, "files", 1, 0)
    assert all(piece.whole and not piece.name for piece in whole.wanted)
    assert whole.assigned_bytes == catalogue.total_bytes
    halves = [rank_work(catalogue, "tensor-slices", 2, rank) for rank in (0, 1)]
    assert not any(piece.whole for work in halves for piece in work.wanted
                   if piece.length < max(t.nbytes for t in catalogue.tensors))
    assert sum(work.assigned_bytes for work in halves) == catalogue.total_bytes


def test_dcp_work_names_its_metadata(dcp_dir: Path, published: Path) -> None:
    catalogue = scan(str(dcp_dir))
    assert rank_work(catalogue, "saved", 2, 1).index_file == ".metadata"
    with pytest.raises(UsageError, match="saved"):   # as `stampede run` refuses it
        rank_work(scan(str(published)), "saved", 1, 0)
