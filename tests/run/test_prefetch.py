"""checkpoint.prefetch: what it asks the kernel for and when (each extent's bytes up to the
window ahead of each block, in read order, once each, never past the extent), that the
pages it asks for come in on a real file evicted first, the job key's refusals (one clear
error, exit 2, before any I/O), and a real resharding restore under mpiexec with it on:
the same bytes read, the same 1.0x amplification, the option in every row."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.filesystems import kind_for
from stampede.run.prefetch import Prefetch
from stampede.run.residency import resident_bytes
from stampede.spec import load_job
from tests.helpers.jobs import read_archive, small_job, write_job

KIB = 1024


def _reads(prefetch: Prefetch, fd: int, extents: list[tuple[int, int]], block: int) -> None:
    """What the read loop does: before each block of each extent, ask ahead."""
    for start, length in extents:
        for offset in range(start, start + length, block):
            prefetch.ahead("f", fd, start, start + length, offset)


def test_each_byte_of_an_extent_is_asked_for_once_ahead_of_its_reads(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_bytes(b"\0" * (1024 * KIB))
    fd = os.open(path, os.O_RDONLY)
    try:
        prefetch = Prefetch(window_bytes=256 * KIB)
        _reads(prefetch, fd, [(0, 600 * KIB), (700 * KIB, 100 * KIB)], block=128 * KIB)
    finally:
        os.close(fd)
    assert prefetch.advised == [
        ("f", 0, 256 * KIB),               # the first block: the whole window
        ("f", 256 * KIB, 128 * KIB),       # then one block more per block read
        ("f", 384 * KIB, 128 * KIB),
        ("f", 512 * KIB, 88 * KIB),        # never past the extent's end (600 KiB)
        ("f", 700 * KIB, 100 * KIB),       # the next extent: its own bytes only
    ]
    # every byte of each extent once, none outside them
    assert sum(length for _, _, length in prefetch.advised) == 700 * KIB
    prefetch.next_iteration()
    assert prefetch.advised == []


def test_a_window_smaller_than_a_block_and_a_handle_that_is_no_descriptor() -> None:
    prefetch = Prefetch(window_bytes=4 * KIB)
    _reads(prefetch, 0, [(0, 64 * KIB)], block=16 * KIB)   # stdin's fd: advice is harmless
    assert [offset for _, offset, _ in prefetch.advised] == [0, 16 * KIB, 32 * KIB, 48 * KIB]
    assert {length for _, _, length in prefetch.advised} == {4 * KIB}
    objects = Prefetch(window_bytes=4 * KIB)
    objects.ahead("f", object(), 0, 64 * KIB, 0)   # an object store's handle: nothing asked
    assert objects.advised == []


def test_the_pages_asked_for_come_in_after_eviction(tmp_path: Path) -> None:
    kind, _ = kind_for(tmp_path)
    if not kind.evictable:
        pytest.skip(f"the test's directory is on {kind.name}: {kind.unevictable}")
    path = tmp_path / "cold"
    with open(path, "wb") as stream:
        stream.write(os.urandom(8 * 1024 * KIB))
        stream.flush()
        os.fsync(stream.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert resident_bytes(str(path), 0, 8 * 1024 * KIB)[0] == 0
        Prefetch(window_bytes=2 * 1024 * KIB).ahead("cold", fd, 0, 8 * 1024 * KIB, 0)
        deadline = time.monotonic() + 30   # the disk's pace is not the test's concern
        while resident_bytes(str(path), 0, 2 * 1024 * KIB)[0] == 0 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert resident_bytes(str(path), 0, 2 * 1024 * KIB)[0] > 0
        # nothing past the window was asked for (the kernel's own readahead aside, which
        # a WILLNEED does not extend: the last 4 MiB stay out)
        assert resident_bytes(str(path), 4 * 1024 * KIB, 4 * 1024 * KIB)[0] == 0
    finally:
        os.close(fd)


@pytest.mark.parametrize(("overrides", "says"), [
    (["checkpoint.prefetch=-1MiB"], "checkpoint.prefetch"),
    (["checkpoint.prefetch=lots"], "checkpoint.prefetch"),
    (["checkpoint.prefetch=1MiB", "run.cache=direct"], "O_DIRECT"),
    (["checkpoint.prefetch=1MiB", "target.path=s3://bucket/ckpt"], "POSIX path"),
])
def test_bad_values_are_refused_before_any_io(tmp_path: Path, overrides: list[str],
                                              says: str) -> None:
    job = small_job(tmp_path)
    with pytest.raises(UsageError) as refused:
        load_job(job, overrides)
    assert says in str(refused.value)


def test_the_cli_exits_2_on_a_bad_prefetch(stampede, tmp_path: Path) -> None:
    result = stampede("plan", str(small_job(tmp_path)), "--set", "checkpoint.prefetch=-1")
    assert result.returncode == 2
    assert "checkpoint.prefetch" in result.stderr


@pytest.mark.mpi
def test_a_resharding_restore_with_prefetch(stampede, tmp_path: Path, dcp4_dir: Path) -> None:
    job = write_job(tmp_path, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["reshard"], "block_size": "64KiB",
                                "prefetch": "256KiB"},
                    run={"iterations": 2, "warmup": 1, "cache": "cold", "verify": "sha256"},
                    archive={"path": str(tmp_path / "results" / "existing.csv")})
    result = stampede("run", str(job), "--checkpoint", str(dcp4_dir), np=2)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "existing.csv")
    assert {row["prefetch_bytes"] for row in rows} == {str(256 * KIB)}
    restore = next(row for row in rows if row["op"] == "restore")
    assert restore["valid"] == "true"
    assert float(restore["read_amplification"]) == 1.0   # prefetched bytes are not reads
