"""The runner in-process at one rank (stampede.mpi.SingleRank, no mpiexec): prepare, the
job's layouts, the statistics on rank 0, exactly as `stampede run` makes them. The same
code paths run under a real mpiexec in tests/run/test_restore.py."""

from __future__ import annotations

import json
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from stampede.checkpoint.prepare import prepare
from stampede.commands.job import Archiver
from stampede.filesystems import kind_for
from stampede.mpi import SingleRank
from stampede.results.archive import read_rows, write_sidecar
from stampede.results.rows import archive_rows, sidecar
from stampede.results.warnings import save_warnings
from stampede.run.interrupt import Interrupts
from stampede.run.job import run_job
from stampede.run.save import save_job
from stampede.spec import build_job
from tests.helpers.json_schema import sidecar_problems


def job(tmp_path: Path, **run: object) -> object:
    return build_job("inproc", str(tmp_path / "inproc.toml"), {
        "target": {"path": str(tmp_path / "ckpt")},
        "checkpoint": {"size": "4MiB", "layout": ["shared", "sharded", "metadata-first"],
                       "block_size": "1MiB", "index_size": "64KiB"},
        "run": {"iterations": 2, "warmup": 1, "verify": "xxh3", **run},
        "archive": {"path": str(tmp_path / "inproc.csv")}})


def test_every_layout_restores_its_bytes_at_one_rank(tmp_path: Path) -> None:
    spec = job(tmp_path, cache="cold")
    comm = SingleRank()
    prepare(comm, spec)
    context, runs = run_job(comm, spec)
    assert context.nranks == 1 and [run.layout for run in runs] == list(spec.layouts)
    for run in runs:
        assert run.invalid_reason == "" and run.stats is not None, run.messages
        assert run.bytes_per_rank == 4 * 2**20
        ops = {op.op: op for op in run.stats.ops}
        assert ops["read"].count == 2 * 4 and ops["read"].bytes == 2 * 4 * 2**20
        assert ops["verify"].errors == 0 and ops["restore"].count == 2
        assert run.stats.restore.time_to_last_rank_s.median > 0
        assert len(run.resident_fraction) == 2   # cold: residency asked each iteration
        rows = archive_rows(spec, context, run)
        assert {row["op"] for row in rows} >= {"stat", "open", "read", "close", "restore"}
        assert all(row["valid"] == "true" and row["nranks"] == "1" for row in rows)
    assert "index" in {op.op for op in runs[-1].stats.ops}


def test_a_corrupt_byte_is_found_in_process(tmp_path: Path) -> None:
    spec = job(tmp_path)
    comm = SingleRank()
    prepare(comm, spec)
    shard = tmp_path / "ckpt" / "sharded" / "shard-00000-of-00001.raw"
    with open(shard, "r+b") as stream:
        stream.seek(12345)
        byte = stream.read(1)
        stream.seek(12345)
        stream.write(bytes([byte[0] ^ 0xFF]))
    _, runs = run_job(comm, spec)
    by_layout = {run.layout: run for run in runs}
    assert by_layout["shared"].invalid_reason == ""
    assert "differ from the checkpoint" in by_layout["sharded"].invalid_reason
    assert any("first at offset 12345, last at offset 12345" in text
               for text in by_layout["sharded"].messages)


def test_an_existing_checkpoints_slices_land_at_their_own_places_on_the_device(
        tmp_path: Path, published: Path) -> None:
    """run.h2d with --checkpoint: every tensor slice a rank reads is copied on to its
    device, one after another; none lands on another (their offsets are each in its own
    tensor). Rank 1 of 2 under tensor-slices reads a slice of every tensor."""
    import time

    from stampede.backends import open_backend
    from stampede.buffers import AlignedBuffer
    from stampede.existing.assign import plan_existing
    from stampede.existing.scan import scan
    from stampede.run.devices import HostDevice
    from stampede.run.pattern import run_pattern
    from stampede.run.setup import build_setup

    spec = build_job("existing", str(tmp_path / "existing.toml"), {
        "target": {"path": str(published)},
        "checkpoint": {"source": "existing", "assign": ["tensor-slices"], "block_size": "64KiB"},
        "run": {"h2d": "host", "verify": "xxh3", "iterations": 1, "warmup": 0},
        "archive": {"path": str(tmp_path / "existing.csv")}})
    catalogue = scan(str(published))
    plan = plan_existing(catalogue, spec, "tensor-slices", 2, 1)
    assert len(plan.extents) > 1 and any(extent.offset for extent in plan.extents)
    device = HostDevice(0)
    with AlignedBuffer(spec.block_bytes, populate=True) as buffer:
        setup = build_setup(SingleRank(), spec, plan, open_backend(catalogue.root), {}, buffer,
                            device, catalogue)
        log: list[tuple[int, int, int, int, int, int]] = []
        start = time.perf_counter_ns()
        outcome = run_pattern(setup, 0, start, start + 60 * 10**9, 0.0, log)
        assert outcome.errors == 0 and not outcome.incomplete, outcome.messages
        where = {tensor.name: tensor.file_offset for tensor in catalogue.tensors}
        expected = bytearray()
        for extent in plan.extents:
            with open(Path(catalogue.root) / extent.relpath, "rb") as stream:
                stream.seek(where[extent.tensor] + extent.offset)
                expected += stream.read(extent.length)
        assert bytes(setup.device_buffer) == bytes(expected)
        device.close()


@pytest.mark.parametrize("phase", ["restore", "save"])
def test_a_signal_mid_layout_archives_what_it_measured_as_incomplete(tmp_path: Path,
                                                                     phase: str) -> None:
    """SIGTERM during iteration 17 of the second layout's 30: the first layout archived
    whole, the second's 17 finished iterations archived, marked invalid (interrupted), the
    third never measured; and the report says so (it once said "nothing of them archived"
    and dropped the 17)."""
    spec = job(tmp_path, iterations=30, warmup=0, verify="none")
    comm = SingleRank()
    if phase == "restore":
        prepare(comm, spec)
    else:
        spec = replace(spec, target_path=str(tmp_path / "saves"))
    command = "run" if phase == "restore" else "save"
    archiver = Archiver(spec, len(spec.layouts), True, command)
    interrupts = Interrupts()

    def tick(layout: str, iteration: int, seconds: float) -> None:
        archiver.tick(layout, iteration, seconds)
        if layout == "sharded" and iteration == 15:   # the 16th ended: it comes in the 17th
            interrupts.received = signal.SIGTERM

    (run_job if phase == "restore" else save_job)(comm, spec, archiver.layout_done, interrupts,
                                                  tick)
    completion = "restore" if phase == "restore" else "save"
    rows = {row["layout"]: row for row in read_rows(spec.archive_path) if row["op"] == completion}
    assert list(rows) == ["shared", "sharded"]
    assert rows["shared"]["valid"] == "true" and rows["shared"]["iterations"] == "30"
    assert rows["sharded"]["valid"] == "false" and rows["sharded"]["iterations"] == "17"
    assert int(rows["sharded"]["count"]) == 17
    assert rows["sharded"]["invalid_reason"].startswith("interrupted (SIGTERM or SIGINT) in "
                                                        "iteration 17: not measured to the end")
    assert archiver.unmeasured(spec.layouts) == (
        "archived shared, sharded (17 of 30 iterations, archived as incomplete); not measured "
        "(nothing of them archived): metadata-first")
    # the sidecar, rewritten after each layout, holds what the rows hold, in its schema
    sidecar = json.loads(archiver.recorder.sidecar_file.read_text())
    assert sidecar_problems(sidecar) == [] and sidecar["command"] == command
    entries = sidecar["layouts" if phase == "restore" else "saves"]
    assert {layout: entry["valid"] for layout, entry in entries.items()} == {
        "shared": True, "sharded": False}


def test_a_save_asks_its_file_systems_kind(tmp_path: Path) -> None:
    """target.stripe_* is set on each save series' directory before its versions (here a
    local disk's file system, which does not stripe: said, once per layout's save), and
    a save to memory (tmpfs, /dev/shm) is said durable in memory only; the sidecar keeps
    what the file system said around each layout in its schema."""
    kind, mount = kind_for(tmp_path)
    if kind.striper is not None or kind.counters is not None:
        pytest.skip(f"the test directory is on {mount.fs_type}, which stripes or counts")
    spec = replace(job(tmp_path, iterations=1, warmup=0, verify="none"),
                   target_path=str(tmp_path / "saves"), stripe_count=2)
    comm = SingleRank()
    context, runs = save_job(comm, spec)
    for run in runs:
        series = tmp_path / "saves" / "saves" / run.layout
        assert run.notes == (f"target.stripe_* (stripe_count=2, stripe_size=default) not "
                             f"applied: {series} is on {mount.fs_type}, which does not stripe "
                             "(Lustre and CephFS do)",)
        assert run.file_system == {}   # nothing to count or read back here
    write_sidecar(tmp_path / "sidecar.json", sidecar(spec, context, runs))   # as a run writes it
    document = json.loads((tmp_path / "sidecar.json").read_text())
    assert sidecar_problems(document) == []
    assert document["saves"]["shared"]["kernel_nfs_rpcs"] == (
        f"not counted: the target is not on a kernel NFS mount ({mount.fs_type})")
    memory = Path("/dev/shm")
    if not memory.is_dir() or kind_for(memory)[0].durable_fsync:
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir=memory) as where:
        in_memory = replace(spec, target_path=str(Path(where) / "saves"), stripe_count=0,
                            layouts=("sharded",))
        context, runs = save_job(comm, in_memory)
        said = save_warnings(in_memory, context, runs[0].stats)
        assert "saved to tmpfs: fsync has nothing to flush; durable means in this node's " \
            "memory" in said
