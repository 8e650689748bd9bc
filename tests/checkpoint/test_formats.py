"""Checkpoint formats and integrity, end to end under a real mpiexec: files prepare writes
load with the formats' own libraries; runs parse headers inside the timed restore; a
corrupted byte, a broken header or a NaN is reported with file, rank and offsets, exits
non-zero and archives the run as invalid; cold runs say how cold they were."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stampede.filesystems import kind_of
from stampede.sysinfo import mount_of
from tests.helpers import requires
from tests.helpers.jobs import read_archive, small_job

pytestmark = pytest.mark.mpi


def _job(tmp_path: Path, fmt: str, **run: object) -> Path:
    return small_job(tmp_path, checkpoint={"format": fmt, "layout": ["shared", "sharded"]},
                     run={"verify": "xxh3", "check_finite": True, **run})


def _slices(tmp_path: Path, layout: str) -> list[dict[str, object]]:
    manifest = json.loads((tmp_path / "ckpt" / "stampede-manifest.json").read_text())
    slices: list[dict[str, object]] = manifest["layouts"][layout]["slices"]
    return slices


def test_safetensors_files_load_with_safe_open(stampede, tmp_path: Path) -> None:
    safetensors = requires.module("safetensors", "TORCH")
    job = _job(tmp_path, "safetensors")
    assert stampede("prepare", str(job), np=2).returncode == 0
    for layout, relpath in (("shared", "shared/checkpoint.safetensors"),
                            ("sharded", "sharded/shard-00001-of-00002.safetensors")):
        with safetensors.safe_open(tmp_path / "ckpt" / relpath, "np") as handle:
            names = list(handle.keys())
            tensors = {name: handle.get_tensor(name) for name in names}
        by_tensor = {s["tensor"]: s for s in _slices(tmp_path, layout) if s["path"] == relpath}
        assert sorted(names) == sorted(by_tensor) and names
        for name, tensor in tensors.items():
            assert tensor.dtype == np.float16 and np.isfinite(tensor).all()
            # the bytes safe_open returns are the bytes prepare hashed
            assert hashlib.sha256(tensor.tobytes()).hexdigest() == by_tensor[name]["sha256"]
        # the data starts on a 4 KiB boundary (O_DIRECT): 8 + header length
        header_length = struct.unpack("<Q", (tmp_path / "ckpt" / relpath).read_bytes()[:8])[0]
        assert (8 + header_length) % 4096 == 0


def test_hdf5_files_load_with_h5py(stampede, tmp_path: Path) -> None:
    h5py = requires.module("h5py", "HDF5")
    job = _job(tmp_path, "hdf5")
    assert stampede("prepare", str(job), np=2).returncode == 0
    with h5py.File(tmp_path / "ckpt" / "shared" / "checkpoint.h5", "r") as file:
        assert sorted(file) == ["shard-00000", "shard-00001"]
        by_tensor = {s["tensor"]: s for s in _slices(tmp_path, "shared")}
        for name in file:
            data = file[name][:]
            assert data.dtype == np.float16 and np.isfinite(data).all()
            assert file[name].id.get_offset() % 4096 == 0
            assert hashlib.sha256(data.tobytes()).hexdigest() == by_tensor[name]["sha256"]


@pytest.mark.parametrize("fmt", ["safetensors", "hdf5"])
def test_run_parses_headers_inside_the_restore(stampede, tmp_path: Path, fmt: str) -> None:
    job = _job(tmp_path, fmt, iterations=2, warmup=0)
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stderr + result.stdout
    rows = read_archive(tmp_path / "results" / "job.csv")
    for layout in ("shared", "sharded"):
        ops = {row["op"]: row for row in rows if row["layout"] == layout}
        assert all(row["valid"] == "true" and row["format"] == fmt for row in ops.values())
        # one header per file per rank per iteration; verify checked every byte
        assert int(ops["header"]["count"]) == 2 * 2 and int(ops["header"]["errors"]) == 0
        assert int(ops["verify"]["op_bytes"]) == int(ops["read"]["op_bytes"]) == 2 * 16 * 2**20
        assert ops["restore"]["check_finite"] == "true" and ops["restore"]["verify"] == "xxh3"


def _said(message: str, result: object) -> bool:
    """Is `message` in the command's output, whatever the terminal wrapping?"""
    output = result.stdout + result.stderr  # type: ignore[attr-defined]
    return "".join(message.split()) in "".join(output.split())


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as stream:
        stream.seek(offset)
        value = stream.read(1)[0]
        stream.seek(offset)
        stream.write(bytes([value ^ 0x01]))


def test_a_corrupted_byte_is_located(stampede, tmp_path: Path) -> None:
    job = _job(tmp_path, "safetensors", verify="sha256", check_finite=False)
    assert stampede("prepare", str(job), np=2).returncode == 0
    shard = tmp_path / "ckpt" / "sharded" / "shard-00001-of-00002.safetensors"
    data_start = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    _flip_byte(shard, data_start + 1_234_567)
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert _said("rank 1: verify sharded/shard-00001-of-00002.safetensors tensor shard-00001 "
                 "bytes 0..8388608: sha256 differs", result)
    assert _said(f"1 byte(s) differ of tensor shard-00001, first at offset 1234567, last at "
                 f"offset 1234567 (file offsets {data_start + 1_234_567}..{data_start + 1_234_567})",
                 result)
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["valid"] for row in rows if row["layout"] == "sharded"} == {"false"}
    assert {row["valid"] for row in rows if row["layout"] == "shared"} == {"true"}
    assert "read bytes that differ" in next(r for r in rows if r["layout"] == "sharded")["invalid_reason"]


def test_corruption_is_never_tolerated(stampede, tmp_path: Path) -> None:
    """max_error_fraction tolerates failed ops, never wrong bytes; raw files too."""
    job = small_job(tmp_path, checkpoint={"layout": "shared"},
                    run={"verify": "xxh3", "max_error_fraction": 0.9})
    assert stampede("prepare", str(job), np=2).returncode == 0
    _flip_byte(tmp_path / "ckpt" / "shared" / "checkpoint.raw", 9 * 2**20 + 5)
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert _said("rank 1: verify shared/checkpoint.raw bytes 8388608..16777216: xxh3 differs", result)
    assert _said("first at offset 9437189, last at offset 9437189", result)
    assert {row["valid"] for row in read_archive(tmp_path / "results" / "job.csv")} == {"false"}


def test_non_finite_values_are_reported(stampede, tmp_path: Path) -> None:
    job = _job(tmp_path, "safetensors", verify="none")
    assert stampede("prepare", str(job), np=2).returncode == 0
    shard = tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.safetensors"
    data_start = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    with open(shard, "r+b") as stream:   # two float16 NaNs and one +Inf
        stream.seek(data_start + 4096)
        stream.write(np.array([np.nan, np.nan, np.inf], dtype=np.float16).tobytes())
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert _said("rank 0: verify sharded/shard-00000-of-00002.safetensors tensor shard-00000 "
                 "bytes 0..8388608: 3 element(s) are NaN or Inf as float16", result)


def test_a_broken_header_fails_the_header_op(stampede, tmp_path: Path) -> None:
    job = _job(tmp_path, "safetensors", verify="none", check_finite=False)
    assert stampede("prepare", str(job), np=2).returncode == 0
    shard = tmp_path / "ckpt" / "sharded" / "shard-00001-of-00002.safetensors"
    with open(shard, "r+b") as stream:
        stream.write(struct.pack("<Q", 2**40))   # an absurd header length
    result = stampede("run", str(job), np=2)
    assert result.returncode == 1
    assert _said("rank 1: header sharded/shard-00001-of-00002.safetensors: safetensors header "
                 "length 1099511627776 is not plausible", result)


def test_cold_runs_say_how_cold_they_were(stampede, tmp_path: Path) -> None:
    """Residency (mincore) after every eviction: ~0%. A rank that could not evict (here:
    the pages it reads are pinned warm by a second reader mapping them) shows up."""
    job = small_job(tmp_path, checkpoint={"layout": "sharded"}, run={"verify": "none"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    assert stampede("run", str(job), "--set", "run.cache=cold", np=2).returncode == 0
    assert stampede("run", str(job), np=2).returncode == 0
    shard = tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.raw"
    pin = ("import mmap, sys\n"
           f"f = open({str(shard)!r}, 'rb')\n"
           "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
           "sum(m[i] for i in range(0, len(m), 4096)); print('pinned', flush=True)\n"
           "sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", pin], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "pinned"
        pinned = stampede("run", str(job), "--set", "run.cache=cold", np=2)
    finally:
        holder.communicate("", timeout=30)
    assert pinned.returncode == 0
    rows = read_archive(tmp_path / "results" / "job.csv")
    resident = [(row["cache"], row["cache_resident_pct"]) for row in rows if row["op"] == "restore"]
    assert resident[1] == ("warm", "")    # nothing asked: asking would open the files
    assert float(resident[0][1]) < 5       # evicted: cold
    # mapped pages survive DONTNEED: half the bytes (rank 0's shard) were still cached
    assert 45 < float(resident[2][1]) < 55, resident
    assert _said("cache=cold, yet 50% of the bytes to read were in the page cache", pinned)


def test_rank_shift_reads_another_ranks_bytes(stampede, tmp_path: Path) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"},
                    run={"rank_shift": 1, "verify": "sha256", "iterations": 1, "warmup": 0})
    assert stampede("prepare", str(job), np=2).returncode == 0
    # rank 1 wrote shard 1; with the shift rank 0 reads it: delete shard 0 and rank 1 fails
    os.unlink(tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.raw")
    result = stampede("run", str(job), np=2)
    assert _said("rank 1: stat sharded/shard-00000-of-00002.raw: No such file", result)
    assert "rank 0:" not in result.stdout + result.stderr


def test_stripe_options_where_the_file_system_does_not_stripe_say_so(stampede,
                                                                     tmp_path: Path) -> None:
    """The test directory's file system (a local disk's, here) has no striper: prepare
    says so for each directory it makes, and writes the checkpoint all the same."""
    fs_type = mount_of(tmp_path).fs_type
    if kind_of(fs_type).striper is not None:
        pytest.skip(f"the test directory is on {fs_type}, which stripes")
    job = small_job(tmp_path, target={"stripe_count": 4, "stripe_size": "1MiB"},
                    checkpoint={"layout": "sharded"})
    result = stampede("prepare", str(job), np=2)
    assert result.returncode == 0
    assert _said(f"target.stripe_* (stripe_count=4, stripe_size=1048576) not applied: "
                 f"{tmp_path / 'ckpt' / 'sharded'} is on {fs_type}, which does not stripe "
                 "(Lustre and CephFS do)", result)


def test_rank_shift_with_exchanges(stampede, tmp_path: Path) -> None:
    """Shifted ranks still form their groups in replica order: each striped member reads
    its own stripe, every held shard verifies."""
    job = small_job(tmp_path, checkpoint={"layout": ["striped", "broadcast"], "replicas": 2},
                    run={"rank_shift": 1, "verify": "sha256", "iterations": 1, "warmup": 0})
    assert stampede("prepare", str(job), np=4).returncode == 0
    result = stampede("run", str(job), np=4)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["valid"] for row in rows} == {"true"}
    assert all(int(row["errors"]) == 0 for row in rows if row["op"] == "verify")


def test_direct_reads_headers_and_locates_corruption(stampede, tmp_path: Path) -> None:
    """O_DIRECT: the safetensors header is read in whole aligned pages, and a corrupt
    byte is located by re-reading through a handle of its own."""
    job = _job(tmp_path, "safetensors", cache="direct", check_finite=False, iterations=1)
    assert stampede("prepare", str(job), np=2).returncode == 0
    clean = stampede("run", str(job), np=2)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    shard = tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.safetensors"
    data_start = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    _flip_byte(shard, data_start + 777)
    result = stampede("run", str(job), "--set", "run.cache=direct", np=2)
    assert result.returncode == 1
    assert _said("1 byte(s) differ of tensor shard-00000, first at offset 777, last at offset 777",
                 result)


def test_drop_caches_as_root(stampede, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("drop_caches needs root")
    job = small_job(tmp_path, checkpoint={"layout": "sharded"},
                    run={"cache": "cold", "drop_caches": True, "iterations": 1})
    assert stampede("prepare", str(job), np=2).returncode == 0
    result = stampede("run", str(job), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["drop_caches"] for row in rows} == {"true"}
    assert float(rows[0]["cache_resident_pct"]) < 5
    assert "drop_caches" not in rows[0]["warnings"]   # it was permitted: no note
