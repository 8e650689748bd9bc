"""The save's plan: every byte of a version is written by exactly one rank, into the files
and extents a restore of the layout reads; creators, temporary names and directories."""

from __future__ import annotations

import re

import pytest

from stampede.checkpoint.plan import checkpoint_files, plan_rank
from stampede.checkpoint.save_plan import check_save, save_plan, version_directories
from stampede.errors import UsageError
from stampede.layouts import SAVE_LAYOUTS
from stampede.spec import build_job

ROOT = "saves/x/v000007"


def job(**checkpoint: object):
    return build_job("t", "t.toml", {"target": {"path": "/nonexistent/never/touched"},
                                     "checkpoint": {"size": "12MiB", "block_size": "1MiB",
                                                    **checkpoint}})


CASES = [("shared", 3, 1), ("sharded", 4, 1), ("replicated", 4, 2), ("striped", 4, 2),
         ("striped", 6, 3), ("fan-out", 5, 1), ("metadata-first", 2, 1)]


@pytest.mark.parametrize(("layout", "nranks", "replicas"), CASES)
def test_every_byte_of_a_version_is_written_once(layout: str, nranks: int, replicas: int) -> None:
    spec = job(replicas=replicas, layout=layout, fanout=2)
    files = dict(checkpoint_files(spec, layout, nranks, ROOT))
    coverage = {path: [0] * (size // 4096) for path, size in files.items()}
    creators: dict[str, list[int]] = {path: [] for path in files}
    for rank in range(nranks):
        plan = save_plan(spec, layout, nranks, rank, ROOT)
        for file in (*plan.files, *filter(None, (plan.index,))):
            assert file.relpath in files and file.relpath.startswith(ROOT + "/")
            if file.creates:
                creators[file.relpath].append(rank)
            for extent in file.extents:
                for page in range(extent.offset // 4096, (extent.offset + extent.length) // 4096):
                    coverage[file.relpath][page] += 1
    assert all(count == 1 for counts in coverage.values() for count in counts)
    assert all(len(ranks) == 1 for ranks in creators.values()), creators


@pytest.mark.parametrize(("layout", "nranks", "replicas"), CASES)
def test_a_restore_reads_what_the_save_wrote(layout: str, nranks: int, replicas: int) -> None:
    """Rank r saves the shard it holds; a restore of the same layout under the version's
    directory asks for that shard at the same place."""
    spec = job(replicas=replicas, layout=layout, fanout=2)
    for rank in range(nranks):
        saved = save_plan(spec, layout, nranks, rank, ROOT)
        restored = plan_rank(spec, layout, nranks, rank, ROOT)
        assert saved.hold == restored.hold
        if layout == "metadata-first" and rank == 0:
            assert saved.index is not None and saved.index.relpath == restored.index_file


def test_creators_partial_names_and_who_rests() -> None:
    spec = job(replicas=2)
    shared = [save_plan(spec, "shared", 4, rank, ROOT) for rank in range(4)]
    assert [bool(plan.files) for plan in shared] == [True, True, False, False]  # replica 0
    assert [plan.files[0].creates for plan in shared[:2]] == [True, False]
    assert shared[1].files[0].shared_by == "world"
    assert shared[0].files[0].partial == f"{ROOT}/shared/.checkpoint.raw.partial"
    striped = [save_plan(spec, "striped", 4, rank, ROOT) for rank in range(4)]
    assert [plan.files[0].creates for plan in striped] == [True, True, False, False]
    assert [plan.files[0].extents[0].offset for plan in striped] == [0, 0, 3 * 2**20, 3 * 2**20]
    assert striped[3].files[0].shared_by == "group" and striped[3].group == 1


def test_fan_out_spreads_the_shards_over_its_directories() -> None:
    spec = job(layout="fan-out", fanout=3)
    paths = [save_plan(spec, "fan-out", 4, rank, ROOT).files[0].relpath for rank in range(4)]
    assert paths == [f"{ROOT}/fanout/000/shard-00000-of-00004.raw",
                     f"{ROOT}/fanout/001/shard-00001-of-00004.raw",
                     f"{ROOT}/fanout/002/shard-00002-of-00004.raw",
                     f"{ROOT}/fanout/000/shard-00003-of-00004.raw"]
    assert version_directories(spec, "fan-out", 4, ROOT) == (
        ROOT, f"{ROOT}/fanout", f"{ROOT}/fanout/000", f"{ROOT}/fanout/001", f"{ROOT}/fanout/002")
    plan = save_plan(spec, "fan-out", 4, 1, ROOT)
    assert plan.own_directories() == (ROOT, f"{ROOT}/fanout", f"{ROOT}/fanout/001")


@pytest.mark.parametrize(("checkpoint", "says"), [
    ({"layout": "list-first"}, "a way to read, not to write"),
    ({"layout": "broadcast", "replicas": 2}, "a way to read, not to write"),
    ({"layout": "node-once"}, "node-once: a way to read, not to write"),
    ({"layout": "owners"}, "owners: a way to read, not to write"),
    ({"format": "hdf5"}, "h5py writes through its own calls"),
    ({"source": "existing", "size": None}, "never writes an existing checkpoint"),
])
def test_what_save_refuses(checkpoint: dict[str, object], says: str) -> None:
    table = {"size": "12MiB", **checkpoint}
    table = {key: value for key, value in table.items() if value is not None}
    spec = build_job("t", "t.toml", {"target": {"path": "/nowhere"}, "checkpoint": table})
    with pytest.raises(UsageError, match=says):
        check_save(spec)
    assert set(SAVE_LAYOUTS) <= {"shared", "sharded", "replicated", "striped", "fan-out",
                                 "metadata-first", "mlperf"}


def s3_job(**checkpoint: object):
    return build_job("t", "t.toml", {"target": {"path": "s3://bucket/ck"},
                                     "checkpoint": {"size": "12MiB", "block_size": "1MiB",
                                                    **checkpoint}})


def test_copies_are_a_restores_and_save_refuses_them() -> None:
    with pytest.raises(UsageError, match="checkpoint.copies = 2: the copies are a restore's"):
        check_save(s3_job(copies=2, layout="sharded"))
    check_save(s3_job(copies=1, layout="sharded", key_prefix="hash"))   # accepted


@pytest.mark.parametrize("layout", ["sharded", "metadata-first", "striped"])
def test_hashed_keys_lead_each_shard_under_the_versions_directory(layout: str) -> None:
    spec = s3_job(layout=layout, key_prefix="hash", replicas=2 if layout == "striped" else 1)
    plans = [save_plan(spec, layout, 4, rank, ROOT) for rank in range(4)]
    written = {file.relpath for plan in plans for file in plan.files}
    shards = sorted(path for path in written if "/shard-" in path)
    assert shards and all(re.fullmatch(rf"{ROOT}/[0-9a-f]{{4}}/sharded/shard-\d{{5}}-of-\d{{5}}"
                                       r"\.raw", path) for path in shards)
    assert len({path.split("/")[3] for path in shards}) == len(shards)   # a prefix each
    # a restore of the version reads exactly what the save wrote
    restored = {plan_rank(spec, layout, 4, rank, ROOT).hold.relpath for rank in range(4)}
    assert restored == set(shards)
