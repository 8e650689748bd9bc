"""`stampede loaders`' refusals: one line and exit 2 before any loader runs (nothing
archived): a job without an existing checkpoint, unknown loaders or devices, an object
store URL, a policy the checkpoint's format does not take, nothing that can run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.jobs import small_job, write_job


def _existing(tmp_path: Path, assign: list[str] | None = None) -> Path:
    return write_job(tmp_path, "loaders", target={"path": "set-by-checkpoint"},
                     checkpoint={"assign": assign or ["files"]},
                     archive={"path": str(tmp_path / "results" / "loaders.csv")})


@pytest.mark.parametrize(("arguments", "said"), [
    (["--loaders", "safetensors,pickle"], "not pickle"),
    (["--loaders", ""], "--loaders ''"),
    (["--devices", "tpu"], "of cpu, cuda"),
])
def test_unknown_loaders_and_devices(stampede, tmp_path: Path, published: Path,
                                     arguments: list[str], said: str) -> None:
    result = stampede("loaders", str(_existing(tmp_path)), "--checkpoint", str(published),
                      *arguments)
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert not (tmp_path / "results").exists()


def test_a_job_without_an_existing_checkpoint(stampede, tmp_path: Path) -> None:
    result = stampede("loaders", str(small_job(tmp_path)))
    assert result.returncode == 2 and "loads an existing checkpoint" in result.stderr
    assert "--checkpoint PATH" in result.stderr


def test_an_object_store_url(stampede, tmp_path: Path) -> None:
    result = stampede("loaders", str(_existing(tmp_path)), "--checkpoint", "s3://bucket/ckpt")
    assert result.returncode == 2 and "the loaders read POSIX paths" in result.stderr


def test_a_policy_the_format_does_not_take(stampede, tmp_path: Path, published: Path) -> None:
    result = stampede("loaders", str(_existing(tmp_path, ["files", "saved"])), "--checkpoint",
                      str(published))
    assert result.returncode == 2 and "saved" in result.stderr and "DCP" in result.stderr
    assert not (tmp_path / "results" / "loaders.csv").exists()


def test_nothing_to_run(stampede, tmp_path: Path, published: Path) -> None:
    result = stampede("loaders", str(_existing(tmp_path)), "--checkpoint", str(published),
                      "--loaders", "torch.load,dcp")
    assert result.returncode == 2 and "nothing to run" in result.stderr
    assert "torch.load: reads torch checkpoints; this one is safetensors" in result.stderr
    assert not (tmp_path / "results" / "loaders.csv").exists()
