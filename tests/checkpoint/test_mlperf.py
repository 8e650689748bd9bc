"""MLPerf Storage's checkpointing layout: files per rank and their sizes, against the
rules' own numbers (mlpstorage's LLM_SIZE_BY_RANK, GB of 2**30 bytes, and the issue's
totals), the scale, subset mode, and the generated job files."""

import tomllib
from fractions import Fraction
from pathlib import Path

import pytest

from stampede.checkpoint.mlperf import MODELS, checkpoint_bytes, job_text, rank_files
from stampede.checkpoint.plan import checkpoint_files, plan_rank
from stampede.checkpoint.save_plan import save_plan
from stampede.errors import UsageError
from stampede.spec import WORKLOADS, build_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"
GIB = 2**30


@pytest.mark.parametrize(("name", "model_gib", "optimizer_gib"), [
    ("llama3-8b", 15, 90), ("llama3-70b", 130, 781), ("llama3-405b", 755, 4533)])
def test_sizes_match_the_rules(name, model_gib, optimizer_gib):
    model = MODELS[name]
    n = model.closed_ranks
    states = sum(b for r in range(n) for f, b in rank_files(model, r, n) if "model_states" in f)
    optimizer = checkpoint_bytes(model, n) - states
    assert states / GIB == pytest.approx(model_gib, rel=0.01)
    assert optimizer / GIB == pytest.approx(optimizer_gib, rel=0.01)


def test_405b_files_per_rank():
    model, n = MODELS["llama3-405b"], 512
    first = [name for name, _ in rank_files(model, 0, n)]
    assert first == [f"layer_{i}-model_0_model_states.pt" for i in range(5)] + \
        ["zero_pp_rank_0_mp_rank_0_optim_states.pt"]
    # ZeRO 1: data-parallel rank 1 writes its optimizer states only
    assert [name for name, _ in rank_files(model, 256, n)] == \
        ["zero_pp_rank_1_mp_rank_0_optim_states.pt"]
    last = [name for name, _ in rank_files(model, 255, n)]   # the last stage: lm_head, norm
    assert last[-3:-1] == ["layer_127-model_255_model_states.pt",
                           "layer_128-model_255_model_states.pt"]


def test_scale_and_subset_keep_the_layout():
    model = MODELS["llama3-70b"]
    full = rank_files(model, 3, 64)
    small = rank_files(model, 3, 8, subset=True, scale=Fraction(1, 1024))
    assert [name for name, _ in small] == [name for name, _ in full]
    assert all(b % 4096 == 0 and b <= a / 1024 for (_, a), (_, b) in zip(full, small))


def test_spec_and_plans():
    assert set(WORKLOADS) == {"none", *MODELS}
    document = {"target": {"path": "/nowhere"},
                "checkpoint": {"layout": ["mlperf"], "workload": "llama3-405b",
                               "scale": "1/1024", "subset": True}}
    spec = build_job("t", "t.toml", document)
    assert spec.scale == Fraction(1, 1024)
    files = dict(checkpoint_files(spec, "mlperf", 4))
    save = save_plan(spec, "mlperf", 4, 0, "v1")
    assert [f.relpath.removeprefix("v1/") for f in save.files] == \
        [name for name, _ in rank_files(MODELS["llama3-405b"], 0, 4, True, spec.scale)]
    assert save.hold.length == sum(files[f.relpath.removeprefix("v1/")] for f in save.files)
    shifted = replace_shift(spec, 2)
    assert plan_rank(shifted, "mlperf", 4, 0).files == \
        tuple(f.relpath.removeprefix("v1/") for f in save_plan(spec, "mlperf", 4, 2, "v1").files)


def replace_shift(spec, shift):
    from dataclasses import replace
    return replace(spec, rank_shift=shift)


@pytest.mark.parametrize(("table", "says"), [
    ({"layout": ["mlperf"]}, "needs checkpoint.workload"),
    ({"layout": ["mlperf"], "workload": "llama3-8b", "size": "1GiB"}, "its model sizes it"),
    ({"layout": ["sharded"], "size": "1GiB", "scale": 0.5}, "belong to checkpoint.layout"),
    ({"layout": ["mlperf"], "workload": "llama3-8b", "scale": 2}, "at most 1"),
])
def test_refused(table, says):
    with pytest.raises(UsageError, match=says):
        build_job("t", "t.toml", {"target": {"path": "/nowhere"}, "checkpoint": table})


def test_job_files_are_the_generators():
    for model in MODELS.values():
        path = JOBS / f"mlperf-checkpoint-{model.name.removeprefix('llama3-')}.toml"
        assert path.read_text() == job_text(model), f"regenerate {path}"


@pytest.mark.parametrize("job", sorted(JOBS.glob("mlperf-checkpoint-*.toml")), ids=lambda p: p.stem)
def test_plan_on_too_few_ranks_is_one_clear_error(job, tmp_path):
    """`stampede plan` on 1 rank of a model whose TP x PP is larger: exit 2 naming the
    workload and TP x PP (it was a ZeroDivisionError), nothing written; 8B's TP x PP is 8,
    so 8 ranks plan."""
    from stampede.cli import main

    model = MODELS[build_job("t", str(job), tomllib.loads(job.read_text())).workload]
    target = f"target.path={tmp_path / 'ck'}"
    if model.model_parallel > 1:
        assert main(["plan", str(job), "--set", target]) == 2
    assert main(["plan", str(job), "--set", target, "--np", str(model.model_parallel)]) == 0
    assert not (tmp_path / "ck").exists()
