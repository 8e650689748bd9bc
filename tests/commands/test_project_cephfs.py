"""`stampede project` on a CephFS archive made for real: cephfs:// restores at 1, 2 and 4
ranks against the session's single-node Ceph (tests/helpers/cephcluster.py), each
layout's MDS counts in its run's sidecar; the projection's MDS drain says, per layout and
op, the requests the MDS counted at each rank count (the sidecars' own numbers) and the
requests at 16,384 ranks from them (stampede.model.mds_drain). Counts are asserted, never
times."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from stampede.model.mds_drain import fit_growth
from tests.helpers.cephcluster import CephCluster
from tests.helpers.jobs import read_archive

QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.toml"
RANKS = (1, 2, 4)
TARGET = 16_384


def job(target: str, archive: Path) -> list[str]:
    """quickstart made small: 16 MiB in 1 MiB blocks, 2 iterations + a warmup."""
    return [str(QUICKSTART), "--set", f"target.path={target}", "--set", "checkpoint.size=16MiB",
            "--set", "checkpoint.block_size=1MiB", "--set", "run.iterations=2",
            "--set", "run.warmup=1", "--set", f"archive.path={archive}"]


def drain_tables(stdout: str) -> dict[str, dict[str, list[str]]]:
    """The MDS drain section's op lines, per layout: op -> its cells (rich's table,
    columns two spaces or more apart)."""
    section = stdout[stdout.index("MDS drain, from the MDS's counters"):]
    tables: dict[str, dict[str, list[str]]] = {}
    layout = ""
    for line in section.splitlines():
        named = re.match(r"layout (\S+) \((?:restore|save);", line)
        if named:
            layout = named.group(1)
            tables[layout] = {}
        cells = re.split(r"\s{2,}", line.strip())
        if layout and len(cells) >= 5 and re.fullmatch(r"[a-z_]+", cells[0]) and cells[0] != "op" \
                and "@" in cells[1]:
            tables[layout][cells[0]] = cells
    return tables


@pytest.mark.mpi
def test_project_drains_the_mds_from_the_counts_in_the_sidecars(
        stampede, ceph_cluster: CephCluster, tmp_path: Path) -> None:
    archive = tmp_path / "results" / "ck.csv"
    base = f"proj-{uuid.uuid4().hex[:8]}"
    for nranks in RANKS:   # a directory each: sharded has a file per rank
        ran = job(ceph_cluster.url(f"{base}-{nranks}"), archive)
        for command in ("prepare", "run"):
            result = stampede(command, *ran, np=nranks)
            assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(archive)
    restores = [row for row in rows if row["op"] == "restore"]
    assert [(row["nranks"], row["layout"], row["valid"]) for row in restores] == [
        (str(n), layout, "true") for n in RANKS for layout in ("shared", "sharded")]
    # what the MDS counted, per layout and rank count, from the sidecars themselves
    sidecars = {row["run_id"]: json.loads((archive.parent / "ck.runs" /
                                           f"{row['run_id']}.json").read_text())
                for row in restores}
    counted: dict[str, dict[int, dict[str, int]]] = {}
    for row in restores:
        entry = sidecars[row["run_id"]]["layouts"][row["layout"]]["mds_requests"]
        ops = {op: moved["requests"] for op, moved in entry["ops"].items()}
        # each rank is a fresh client of its own: it asks the MDS at least once
        assert sum(ops.values()) >= int(row["nranks"]), (row["layout"], entry)
        counted.setdefault(row["layout"], {})[int(row["nranks"])] = ops

    projected = stampede("project", str(archive), "--target-ranks", str(TARGET))
    assert projected.returncode == 0, projected.stdout + projected.stderr
    out = projected.stdout
    assert "metadata stall" in out   # the latency-fitted projection, as before
    tables = drain_tables(out)
    assert set(tables) == {"shared", "sharded"}
    for layout, by_ranks in counted.items():
        ops = set().union(*by_ranks.values())
        assert set(tables[layout]) == ops
        for op in ops:
            cells = tables[layout][op]
            # a restore's count is the layout's whole count (one pass of fresh clients)
            assert cells[1] == ", ".join(f"{by_ranks[n].get(op, 0):,} @{n}" for n in RANKS)
            growth = fit_growth([(n, 1, float(by_ranks[n].get(op, 0))) for n in RANKS], True)
            assert cells[4] == f"{growth.at(TARGET):,.0f}" or \
                float(cells[4].replace(",", "")) == pytest.approx(growth.at(TARGET), rel=1e-3)
        total = sum(fit_growth([(n, 1, float(by_ranks[n].get(op, 0))) for n in RANKS],
                               True).at(TARGET) for op in ops)
        said = re.search(rf"layout {layout} \(restore.*?one restore asks the MDS ([\d,.]+) "
                         "requests", out, re.S)
        assert said is not None and float(said.group(1).replace(",", "")) == \
            pytest.approx(total, rel=1e-3)
    assert out.count("beside it, the latency-fitted metadata stall") == 2


@pytest.mark.mpi
def test_project_drains_a_save_per_save_from_the_counts_in_the_sidecars(
        stampede, ceph_cluster: CephCluster, tmp_path: Path) -> None:
    """Saves at 1, 2 and 4 ranks (2 iterations + a warmup: 3 saves a run): each op's count
    per save is the sidecar's divided by 3; the sharded layout creates a file per rank."""
    archive = tmp_path / "results" / "save.csv"
    base = f"proj-save-{uuid.uuid4().hex[:8]}"
    for nranks in RANKS:
        result = stampede("save", *job(ceph_cluster.url(f"{base}-{nranks}"), archive),
                          np=nranks)
        assert result.returncode == 0, result.stdout + result.stderr
    saves = [row for row in read_archive(archive) if row["op"] == "save"]
    assert [(row["nranks"], row["valid"]) for row in saves] == \
        [(str(n), "true") for n in RANKS for _ in ("shared", "sharded")]
    counted: dict[str, dict[int, dict[str, int]]] = {}
    for row in saves:
        sidecar = json.loads((archive.parent / "save.runs" / f"{row['run_id']}.json").read_text())
        entry = sidecar["saves"][row["layout"]]["mds_requests"]
        counted.setdefault(row["layout"], {})[int(row["nranks"])] = {
            op: moved["requests"] for op, moved in entry["ops"].items()}
    passes = 3
    # every rank creates its own file of the sharded layout in each save
    assert all(counted["sharded"][n]["create"] >= n * passes for n in RANKS)
    projected = stampede("project", str(archive), "--target-ranks", str(TARGET),
                         "--phase", "save", env={"COLUMNS": "200"})
    assert projected.returncode == 0, projected.stdout + projected.stderr
    tables = drain_tables(projected.stdout)
    for layout, by_ranks in counted.items():
        ops = set().union(*by_ranks.values())
        assert set(tables[layout]) == ops
        for op in ops:
            shown = [(float(value.replace(",", "")), int(n)) for value, n in
                     re.findall(r"([\d.,]+) @(\d+)", tables[layout][op][1])]
            assert [n for _, n in shown] == list(RANKS)
            for value, n in shown:   # 3 significant digits at least
                assert value == pytest.approx(by_ranks[n].get(op, 0) / passes, rel=5e-3)
