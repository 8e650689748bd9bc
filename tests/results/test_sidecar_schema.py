"""The sidecar's written schema (results/sidecar-N.schema.json, N the archive schema):
there is one for this schema, and the validator the suite checks every sidecar with
(tests/conftest.py) tells a sidecar off its shape, naming the field."""

from __future__ import annotations

import copy
from pathlib import Path

from stampede.results.columns import ARCHIVE_SCHEMA
from tests.helpers.json_schema import REPO, sidecar_problems, sidecar_schema

SPREAD = {"median": 0.5, "min": 0.4, "max": None}
LATENCY = {"count": 2, "min_s": 1e-6, "p50_s": 2e-6, "p90_s": 3e-6, "p99_s": 3e-6,
           "p999_s": 3e-6, "max_s": 3e-6, "approximate": False}
RUN = {
    "schema": ARCHIVE_SCHEMA, "run_id": "r", "timestamp": "2026-12-02T00:00:00+00:00",
    "stampede_version": "0", "job": {"name": "j", "source": "j.toml", "options": {}},
    "nranks": 2, "hosts_by_rank": ["a", "a"], "mpi_library": "MPICH", "backend": "posix",
    "storage": {}, "node": {}, "slurm": {},
    "layouts": {"shared": {
        "valid": True, "invalid_reason": "", "errors": [], "warnings": [], "retries": {},
        "throttles": {}, "backoff_s": {},
        "digests": [], "cache_resident_fraction": [None], "cache_drops_by_rank": [0],
        "kernel_nfs_rpcs": "not counted",
        "stats": {"layout": "shared", "iterations": 1, "completion_op": "restore",
                  "samples": "exact", "timeline": [[0.0, None]], "unprotected_s": None,
                  "restore": {"time_to_last_rank_s": SPREAD, "first_done_s": SPREAD,
                              "straggler_ratio": SPREAD, "per_rank_s": [0.5, 0.4]},
                  "ops": [{"op": "read", "count": 2, "errors": 0, "bytes": 8, "latency": LATENCY,
                           "elapsed_s": SPREAD, "ops_per_s": SPREAD, "agg_gbps": SPREAD}]}}},
}


def test_this_archive_schema_has_its_sidecar_schema() -> None:
    schema = sidecar_schema(ARCHIVE_SCHEMA)
    assert schema["$defs"]["version"] == {"const": ARCHIVE_SCHEMA}
    assert schema["$id"] == f"stampede-sidecar-{ARCHIVE_SCHEMA}"
    assert sorted(path.name for path in (REPO / "results").glob("sidecar-*.schema.json"))[-1] \
        == f"sidecar-{ARCHIVE_SCHEMA}.schema.json"


def test_a_whole_sidecar_passes_and_each_drift_is_named() -> None:
    assert sidecar_problems(RUN) == []
    drifts = (
        (("layouts", "shared", "valid"), "yes", "$.layouts.shared.valid: str \"yes\", not boolean"),
        (("nranks",), 0, "$.nranks: 0 < 1"),
        (("schema",), 4, f"$.schema: 4, not {ARCHIVE_SCHEMA}"),
        (("layouts", "shared", "stats", "ops", 0, "agg_gbps", "median"), "1.5",
         "$.layouts.shared.stats.ops[0].agg_gbps.median: str \"1.5\", not ['number', 'null']"),
    )
    for keys, value, said in drifts:
        document = copy.deepcopy(RUN)
        *parents, last = keys
        target = document
        for key in parents:
            target = target[key]
        target[last] = value
        assert said in sidecar_problems(document), (keys, sidecar_problems(document))
    older = {**RUN, "schema": 6}   # a packed archive's: held to sidecar-6's shape
    assert sidecar_problems(older) == []
    assert sidecar_problems({**older, "nranks": 0}) == ["$.nranks: 0 < 1"]
    unknown = {**RUN, "extra": 1}
    assert "$: 'extra' is not in the schema" in sidecar_problems(unknown)
    missing = {key: value for key, value in RUN.items() if key != "node"}
    assert "$: no 'node'" in sidecar_problems(missing)


def test_the_tests_sidecars_are_checked(tmp_path: Path) -> None:
    """written_sidecars finds a run's sidecar by its name and leaves other JSON alone."""
    import json

    from tests.helpers.json_schema import written_sidecars

    runs = tmp_path / "job.runs"
    runs.mkdir()
    (runs / "r.json").write_text(json.dumps(RUN))
    (runs / "r-summary.json").write_text(json.dumps({"run_id": "other"}))
    (runs / "torn.json").write_text("{")
    assert list(written_sidecars(tmp_path)) == [runs / "r.json"]
