"""The workload at the target (stampede.model.workload) and its model presets: the bytes
and files of MLPerf's Llama 3 checkpoints at any rank count, from two data-parallel ranks,
are those of every rank summed; the flags refuse what they cannot mean."""

from __future__ import annotations

import pytest

from stampede.checkpoint.mlperf import MODELS, at_scale, checkpoint_bytes, rank_files
from stampede.errors import UsageError
from stampede.model.workload import Workload, workload_of


@pytest.mark.parametrize(("name", "nranks"), [("llama3-8b", 1), ("llama3-8b", 24),
                                              ("llama3-70b", 64), ("llama3-70b", 8),
                                              ("llama3-405b", 512), ("llama3-1t", 1024)])
def test_a_presets_bytes_and_files_at_scale_are_every_ranks(name: str, nranks: int) -> None:
    model = MODELS[name]
    largest, total, files = at_scale(model, nranks)
    every = [rank_files(model, rank, nranks) for rank in range(nranks)]
    assert total == checkpoint_bytes(model, nranks)
    assert largest == max(sum(nbytes for _, nbytes in mine) for mine in every)
    assert files == max(len(mine) for mine in every)


def test_the_workload_line_names_what_is_projected() -> None:
    largest, total, files = at_scale(MODELS["llama3-70b"], 16384)
    workload = workload_of(16384, 8, preset=("Llama 3 70B", "TP 8 x PP 1 x DP 2048, ZeRO 3",
                                             float(largest), float(total), files))
    assert workload.describe(8, float(largest)) == (
        "Llama 3 70B (TP 8 x PP 1 x DP 2048, ZeRO 3), 918.7 GiB, 16384 ranks on 2048 node(s) "
        "of 8, 57.42 MiB per rank, 2 file(s) per rank")
    # ZeRO 1: data-parallel rank 0 holds the model states; every rank taken as it, said
    largest, total, files = at_scale(MODELS["llama3-405b"], 16384)
    zero1 = workload_of(16384, 8, preset=("Llama 3 405B", "", float(largest), float(total), files))
    assert "the largest rank's, 331.7 MiB on average" in zero1.describe(8, float(largest))
    total_given = workload_of(1000, None, total_bytes=4e12)
    assert total_given.bytes_per_rank == 4e9
    assert Workload(4).describe(0, float("nan")) == (   # nothing projected: no more than asked
        "the job's checkpoint as archived, 4 ranks, bytes per rank as each layout's runs had "
        "them")


def test_the_workload_flags_refuse_what_they_cannot_mean(stampede) -> None:
    with pytest.raises(UsageError, match="given twice"):
        workload_of(64, bytes_per_rank=1.0, total_bytes=2.0)
    with pytest.raises(UsageError, match="ranks per node 9: must be from 1"):
        Workload(8, ranks_per_node=9)
    for flags, said in ((["--target-model", "llama3-70b", "--target-ranks", "100"],
                         "--target-model llama3-70b: 100 ranks: llama3-70b needs a multiple of "
                         "TP x PP"),
                        (["--target-model", "llama3-70b", "--target-size", "1TB",
                          "--target-ranks", "64"], "given twice (checkpoint size and model)"),
                        (["--target-size", "lots", "--target-ranks", "64"],
                         "argument --target-size: 'lots' is not a size")):
        result = stampede("project", "nothing.csv", *flags)
        assert result.returncode == 2, result.stderr
        assert said in " ".join(result.stderr.split()), result.stderr
