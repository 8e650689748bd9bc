"""Job files and overrides: accepted exactly when valid, errors that name key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from stampede.errors import UsageError
from stampede.spec import FOLDED, OPTIONS, build_job, load_job, parse_override
from stampede.units import parse_size

REPO = Path(__file__).resolve().parents[1]
MINIMAL = {"target": {"path": "/tmp/x"}, "checkpoint": {"size": "1GiB"}}


def test_every_shipped_job_file_loads() -> None:
    jobs = sorted((REPO / "jobs").glob("*.toml"))
    assert len(jobs) >= 3
    for job in jobs:
        spec = load_job(job)
        assert spec.name == job.stem


def test_defaults_and_units() -> None:
    spec = build_job("q", "q.toml", MINIMAL)
    assert spec.size_total_bytes == 2**30
    assert spec.block_bytes == 4 * 2**20
    assert spec.layouts == ("shared", "sharded")
    assert spec.cache == "warm"
    assert spec.archive_path == "results/q.csv"


@pytest.mark.parametrize(("text", "expected"), [
    ("4096", 4096), ("4MiB", 4 * 2**20), ("1.5GiB", 3 * 2**29), ("2GB", 2 * 10**9), ("10 kib", 10240),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "4XB", "-1", "1.5", "GiB", "0.3KiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_overrides_parse_as_toml_or_string() -> None:
    spec = build_job("q", "q.toml", MINIMAL, ["run.cache=cold", "run.iterations=7",
                                               "checkpoint.layout=sharded",
                                               'checkpoint.block_size="1MiB"',
                                               "target.path=/lustre/me/ckpt"])
    assert (spec.cache, spec.iterations, spec.layouts) == ("cold", 7, ("sharded",))
    assert spec.block_bytes == 2**20
    assert spec.target_path == "/lustre/me/ckpt"
    assert parse_override("checkpoint.layout=shared,sharded")[1] == "shared,sharded"
    assert build_job("q", "q", MINIMAL, ["checkpoint.layout=sharded,shared"]).layouts == \
        ("sharded", "shared")


@pytest.mark.parametrize(("document", "overrides", "message"), [
    ({**MINIMAL, "run": {"cache": "cool"}}, [],
     'run.cache = \'cool\': must be one of warm, cold, direct (did you mean "cold"?)'),
    ({**MINIMAL, "checkpoint": {"size": "1GiB", "layuot": "x"}}, [],
     'unknown key \'checkpoint.layuot\' (did you mean "checkpoint.layout"?)'),
    (MINIMAL, ["run.iteratons=3"], "unknown key 'run.iteratons'"),
    (MINIMAL, ["run.iterations=0"], "run.iterations = 0: must be a whole number >= 1"),
    (MINIMAL, ["checkpoint.block_size=4XB"], "checkpoint.block_size = '4XB': must be a byte count"),
    (MINIMAL, ["nonsense"], "expected KEY=VALUE"),
    ({"checkpoint": {"size": "1GiB"}}, [], "[target] path is required"),
    ({"target": {"path": "/x"}}, [], "give exactly one of checkpoint.size and checkpoint.size_per_rank"),
    ({**MINIMAL, "pattern": {"ops": ["read", "open"]}}, [], "read needs open before it"),
    ({**MINIMAL, "pattern": {"ops": ["open", "close", "read"]}}, [], "read must come before close"),
    ({**MINIMAL, "pattern": {"ops": ["stat", "stat"]}}, [], "must not name the same entry twice"),
    ({**MINIMAL, "checkpoint": {"size": "1GiB", "block_size": 1000}, "run": {"cache": "direct"}}, [],
     "run.cache = direct needs a multiple of 4096"),
    ({**MINIMAL, "run": {"verify": "sha256"}, "pattern": {"ops": ["stat"]}}, [], "needs a read op"),
    ({"target": "x"}, [], "unknown key 'target'"),
    ({**MINIMAL, "run": {"deadline_s": -1}}, [], "run.deadline_s = -1: must be a number of seconds > 0"),
    ({**MINIMAL, "checkpoint": {"size": "1GiB", "layout": []}}, [],
     "must be one or a list of shared, sharded"),
    ({**MINIMAL, "target": {"path": "s3://b/p", "storage_options": {"secret": "x"}}}, [],
     "secret looks like a credential: credentials come from the environment"),
    (MINIMAL, ["target.storage_options={client_kwargs={aws_access_key_id='x'}}"],
     "client_kwargs.aws_access_key_id looks like a credential"),
    (MINIMAL, ["target.storage_options=3"], "must be a table"),
    (MINIMAL, ["target.storage_options={token='hunter2'}"], "target.storage_options = {...}: token"),
    (MINIMAL, ["target.storage_options={endpoint_url='http://me:hunter2@127.0.0.1:9000'}"],
     "endpoint_url holds a password in a URL"),
    (MINIMAL, ["target.path='s3://me:hunter2@bucket/x'"], "holds a password in a URL"),
    (MINIMAL, ["run.drop_caches=true"], 'run.drop_caches = true needs run.cache = "cold"'),
    (MINIMAL, ["checkpoint.format=hdf5", "checkpoint.dtype=bfloat16"], "HDF5 has no bfloat16"),
    (MINIMAL, ["checkpoint.format=npz"], "must be one of raw, safetensors, hdf5"),
    (MINIMAL, ["run.verify=md5"], "must be one of none, sha256, xxh3"),
    (MINIMAL, ["target.stripe_count=-2"], "0 = the file system's default, -1 = every OST"),
    (MINIMAL, ["target.stripe_size=100KiB"], "must be a multiple of 64 KiB"),
])
def test_errors_name_key_value_and_what_is_allowed(document: dict, overrides: list[str],
                                                   message: str) -> None:
    with pytest.raises(UsageError) as caught:
        build_job("q", "q.toml", document, overrides)
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[target\npath = 1")
    with pytest.raises(UsageError, match="broken.toml: not valid TOML"):
        load_job(broken)
    with pytest.raises(UsageError, match="cannot read the job file"):
        load_job(tmp_path / "missing.toml")


def test_each_option_has_one_csv_column() -> None:
    """Or, for the few in spec.FOLDED, none: their value is folded into another's cell."""
    columns = [option.column for option in OPTIONS if option.key not in FOLDED]
    assert len(columns) == len(set(columns)) and "" not in columns
    assert {option.key for option in OPTIONS if not option.column} == set(FOLDED)
    assert set(FOLDED.values()) <= set(columns)
    spec = build_job("q", "q.toml", MINIMAL)
    assert set(spec.columns()) == set(columns)


def test_pattern_order_is_folded_into_the_pattern_cell() -> None:
    """pattern.order changes what an op costs: rows of either order differ in `pattern`
    (an identity column), and the default's cell is as before the key existed."""
    assert build_job("q", "q.toml", MINIMAL).columns()["pattern"] == "stat+open+read+close"
    by_file = build_job("q", "q.toml", MINIMAL, ["pattern.order=file"])
    assert by_file.order == "file" and by_file.values["pattern.order"] == "file"
    assert by_file.columns()["pattern"] == "stat+open+read+close by file"


@pytest.mark.parametrize(("override", "message"), [
    ("run.deadline_s=inf", "must be a number of seconds > 0 and <= 1e+07"),
    ("run.deadline_s=1e300", "must be a number of seconds > 0 and <= 1e+07"),
    ("run.jitter=uniform:inf", "with 0 < seconds <= 1e+07"),
    ("run.jitter=exponential:nan", "with 0 < seconds <= 1e+07"),
])
def test_numbers_must_be_finite_and_bounded(override: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("+", r"\+")):
        build_job("q", "q.toml", MINIMAL, [override])


def test_a_binary_job_file_is_a_usage_error(tmp_path: Path) -> None:
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="not a text"):
        load_job(binary)


def test_a_set_of_one_of_an_exclusive_pair_replaces_the_other() -> None:
    quickstart = REPO / "jobs" / "quickstart.toml"     # it gives checkpoint.size
    spec = load_job(quickstart, ["checkpoint.size_per_rank=2MiB"])
    assert spec.size_per_rank_bytes == 2 * 2**20 and spec.size_total_bytes is None
    back = load_job(quickstart, ["checkpoint.size_per_rank=2MiB", "checkpoint.size=1GiB"])
    assert back.size_total_bytes == 2**30 and back.size_per_rank_bytes is None
    with pytest.raises(UsageError, match="give exactly one of checkpoint.size"):
        load_job(quickstart, ["checkpoint.size="])   # unset, and nothing in its place


def test_node_once_is_refused_where_its_reads_or_exchange_cannot_go() -> None:
    # its reader holds the whole file: the device copies take one shard (as whole-file)
    with pytest.raises(UsageError, match="node-once with run.h2d = 'host'"):
        build_job("q", "q.toml", MINIMAL, ["checkpoint.layout=node-once", "run.h2d=host"])
    # its point-to-point scatter is MPI's alone
    with pytest.raises(UsageError, match="run.exchange = \"torch\" with node-once"):
        build_job("q", "q.toml", MINIMAL, ["checkpoint.layout=node-once,owners",
                                           "run.exchange=torch"])
    assert build_job("q", "q.toml", MINIMAL, ["checkpoint.layout=owners", "run.exchange=torch"]
                     ).layouts == ("owners",)


def test_whole_file_with_device_copies_is_refused_before_any_io() -> None:
    # it reads every rank's slice: only its own has a place in the device buffer
    with pytest.raises(UsageError, match="whole-file with run.h2d = 'host'"):
        build_job("q", "q.toml", MINIMAL, ["checkpoint.layout=whole-file", "run.h2d=host"])
    assert build_job("q", "q.toml", MINIMAL, ["checkpoint.layout=whole-file"]).layouts \
        == ("whole-file",)
