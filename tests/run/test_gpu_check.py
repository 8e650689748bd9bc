"""bench/gpu_check.py, the device check prepared for the first GPU: on a machine without
one it runs up to "no CUDA device visible", lists what it would run, and exits 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is visible: the check would run")
@pytest.mark.parametrize("flags", [("--quick", "--budget-s", "60"), ()])
def test_without_a_gpu_it_lists_what_it_would_run_and_exits_0(tmp_path: Path,
                                                              flags: tuple[str, ...]) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), *flags, "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "no CUDA device visible" in out and "dry run: on a CUDA device" in out
    size = "256MiB" if flags else "1024MiB"
    for step in ("h2d pageable, pinned", "file / gds / safetensors -> HBM",
                 "NCCL init, broadcast", f"--sizes {size}", "nvbandwidth"):
        assert step in out, out
    assert list(tmp_path.iterdir()) == []   # its scratch directory is gone


def test_dry_run_and_bad_budgets(tmp_path: Path) -> None:
    listed = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "dry run" in listed.stdout, listed.stderr
    # the default budget fits the 4 minutes a lent GPU gives, and every step fits in it
    worst_s, budget_s = map(float, re.search(r"worst cases: (\S+) s of the (\S+) s budget",
                                             listed.stdout).groups())
    assert worst_s <= budget_s < 240
    bad = subprocess.run([sys.executable, str(SCRIPT), "--budget-s", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--budget-s must be > 0" in bad.stderr
