"""The target flags (stampede.commands.flags.add_workload_arguments, add_target_ranks,
add_rejoin_arguments): every command that takes one refuses a value it cannot mean in one
line, exit 2, before any output; the commands are found from the parser, so a new command
that takes a target flag is checked without a new test. And what the target's numbers
print: node counts up to 10^9 answer, sizes read back every unit they print, small sizes
and shares read as numbers."""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.cli import build_parser
from stampede.model.traffic import EACH_READS, LEADER_BCAST, STRIPE_ALLGATHER, Geometry
from stampede.model.traffic import MODELS as TRAFFIC
from stampede.results.archive import append_rows, read_rows
from stampede.units import (
    format_bytes,
    format_percent,
    format_plain,
    format_probability,
    format_times,
    parse_size,
)
from tests.model.test_project import RANKS, TRUE, synthetic_archive
from tests.model.test_rejoin import archived, rows


def rejoin_archive(tmp_path: Path, startup_s: float) -> str:
    """tests/model/test_rejoin's rejoin run (and a startup run) as a CSV archive."""
    path = tmp_path / "rejoin.csv"
    append_rows(path, archived(rows(), startup_s=startup_s).rows)
    return str(path)

# each target flag, and values it must refuse (0, negative, not a number, absurd)
BAD = {
    "--target-ranks": ("0", "-5", "x", "1.5", "10000000000000"),
    "--target-ranks-per-node": ("0", "-1", "eight", "10000000000000"),
    "--target-size": ("0", "-1GiB", "lots", "1XB"),
    "--target-bytes-per-rank": ("0", "1 zillion"),
    "--lost-nodes": ("0", "-3", "many"),
    "--spare-pool-pct": ("0", "-2", "101", "nan", "inf", "x"),
}


def target_commands() -> dict[str, list[str]]:
    """Each registered command and the target flags it takes (from the parser)."""
    parser = build_parser([])
    subparsers = next(action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction))
    found: dict[str, list[str]] = {}
    for command, sub in subparsers.choices.items():
        flags = [flag for action in sub._actions for flag in action.option_strings
                 if flag in BAD]
        if flags:
            found[command] = flags
    return found


def test_every_command_refuses_every_bad_target_value_in_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    found = target_commands()
    assert {"project", "mttr", "assess", "html", "report"} <= set(found), found
    checked = 0
    for command, flags in found.items():
        for flag in flags:
            for value in BAD[flag]:
                with pytest.raises(SystemExit) as exited:
                    build_parser([command]).parse_args([command, "x.csv", f"{flag}={value}"])
                err = capsys.readouterr().err
                assert exited.value.code == 2, (command, flag, value)
                assert err.count("\n") == 1, (command, flag, value, err)   # no usage first
                assert err.startswith(f"stampede {command}: error: argument {flag}: "), err
                checked += 1
    assert checked == sum(len(BAD[flag]) for flags in found.values() for flag in flags)


def test_a_flag_a_command_does_not_know_is_its_own_error() -> None:
    refused = subprocess.run([sys.executable, "-m", "stampede", "mttr", "--target-mttr", "60"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.startswith("usage: stampede mttr "), refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        "stampede mttr: error: unrecognized arguments: --target-mttr")


def test_bad_values_are_refused_before_any_output(stampede, tmp_path: Path) -> None:
    """The rejoin archive's answer once came first (28 lines), the error after it."""
    path = rejoin_archive(tmp_path, 2.5)
    for flags, said in ((["--target-ranks", "-5"], "argument --target-ranks: -5: must be from 1"),
                        (["--target-ranks", "0"], "argument --target-ranks: 0: must be from 1"),
                        (["--target-ranks", "16384", "--target-ranks-per-node", "8",
                          "--lost-nodes", "5000"],
                         "--lost-nodes 5000: the target's 2,048 node(s) (16384 ranks, 8 per node) "
                         "must keep one working: at most 2,047 lost")):
        result = stampede("mttr", path, *flags)
        assert result.returncode == 2, result.stderr
        assert result.stdout == "", result.stdout
        assert len(result.stderr.splitlines()) == 1 and said in result.stderr, result.stderr


def test_the_default_ranks_per_node_are_the_largest_runs(stampede, tmp_path: Path) -> None:
    """The runs were each on one node (the largest of 128 ranks): the target is 128 per
    node, not 16,384 on one."""
    archive = tmp_path / "sweep.csv"
    synthetic_archive(archive, TRUE, RANKS)
    result = stampede("project", str(archive), "--target-ranks", "16384")
    assert result.returncode == 0, result.stderr
    assert "16384 ranks on 128 node(s) of 128" in result.stdout, result.stdout


def measured_archive(where: Path) -> Path:
    """The model's runs at 1 to 128 ranks (test_project's synthetic archive) with the
    columns mttr reads a restore's rate and straggler from."""
    made = where / "made.csv"
    synthetic_archive(made, TRUE, RANKS)
    rows: list[dict[str, object]] = []
    for row in read_rows(made):
        if row["op"] == "restore":
            seconds = float(row["time_to_last_rank_s"])
            row = {**row, "slowest_rank_gbps": str(float(row["bytes_per_rank"]) / seconds / 1e9),
                   "first_done_s": str(seconds * 0.9)}
        rows.append({key: value for key, value in row.items() if not key.startswith("_")})
    archive = where / "sweep.csv"
    append_rows(archive, rows)
    return archive


def test_a_billion_nodes_answer(stampede, tmp_path: Path) -> None:
    """The projection counts, never walks, the nodes (the timeout a guard, not a speed)."""
    archive = measured_archive(tmp_path)
    for command in (["project", str(archive)], ["mttr", str(archive)],
                    ["report", str(archive), "--html", str(tmp_path / "r.html")]):
        result = stampede(*command, "--target-ranks", "8000000000",
                          "--target-ranks-per-node", "8", timeout=120)
        assert result.returncode == 0, result.stderr
    assert "8000000000 ranks on 1000000000 node(s) of 8" in \
        stampede("project", str(archive), "--target-ranks", "8000000000",
                 "--target-ranks-per-node", "8").stdout


def walked(layout: str, geometry: Geometry) -> tuple[float, float, float, float]:
    """The traffic as the nodes and ranks walked one by one (what the model did before it
    counted): (storage, node, rank, exchange)."""
    from stampede.model.traffic import bcast_rounds

    n, k, shards = geometry.nranks, geometry.per_node, geometry.shards
    replicas = n // shards
    nnodes = -(-n // k)
    sizes = [min(k, n - first) for first in range(0, n, k)]
    if layout == EACH_READS:
        return float(n), float(max(sizes)), 1.0, 0.0
    if layout == LEADER_BCAST and geometry.broadcast_group == "node":
        readers = [min(size, shards) for size in sizes]
        return float(sum(readers)), float(max(readers)), 1.0, 0.0
    if layout == LEADER_BCAST:
        leaders, sent = [0] * nnodes, [0.0] * nnodes
        for shard in range(shards):
            leaders[shard // k] += 1
            sent[shard // k] += bcast_rounds(len({(shard + j * shards) // k
                                                  for j in range(replicas)}))
        return float(shards), float(min(max(leaders), k)), 1.0, max(sent)
    into = [0.0] * nnodes
    for rank in range(shards * replicas):
        left = rank % shards + ((rank // shards - 1) % replicas) * shards
        if replicas > 1 and left // k != rank // k:
            into[rank // k] += (replicas - 1) / replicas
    return n / replicas, max(sizes) / replicas, 1 / replicas, max(into)


@pytest.mark.parametrize("layout", [EACH_READS, LEADER_BCAST, STRIPE_ALLGATHER])
def test_the_counted_traffic_is_the_walked_one(layout: str) -> None:
    compared = 0
    for nranks in range(1, 49):
        for per_node in range(0, nranks + 2):
            for replicas in (r for r in range(1, nranks + 1) if nranks % r == 0):
                for group in ("replica", "node"):
                    geometry = Geometry(nranks, per_node, replicas, group)
                    counted = TRAFFIC[layout](geometry)
                    expected = walked(layout, geometry)
                    got = (counted.storage, counted.node, counted.rank, counted.exchange)
                    assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
                               for a, b in zip(got, expected)), (geometry, got, expected)
                    compared += 1
    assert compared > 10_000
    huge = TRAFFIC[layout](Geometry(8 * 10**9, 8, 2))   # a billion nodes: counted at once
    assert huge.rank in (1.0, 0.5)


def test_sizes_read_what_they_print_and_small_values_read_as_numbers() -> None:
    for nbytes in (1, 1000, 3 * 2**30, 195.3 * 2**50, 7 * 2**60):
        shown = format_bytes(nbytes)
        number, unit = shown.split()
        assert parse_size(f"{number}{unit}") == pytest.approx(nbytes, rel=1e-3), shown
    assert parse_size("2PB") == 2 * 10**15
    assert format_bytes(1024 / 16384) == "0.06 B"       # 1 KiB over 16,384 ranks
    assert format_bytes(1 / 16384) == "under 1 B"
    assert format_bytes(0) == "0 B"
    assert format_percent(1e-32) == "under 0.01%"
    assert format_percent(0.02) == "2%"
    assert format_percent(0.005) == "0.5%"
    assert format_plain(8e9) == "8,000,000,000" and format_plain(2.5e-9) == "under 0.001"
    assert format_probability(2e-7) == "1 in 5,000,000"
    assert format_probability(0.0) == "under 1 in 10^15"
    # what a target needs over what the storage showed: never 3.36e-05x
    assert [format_times(ratio) for ratio in (3.36e-05, 0.00999, 0.0414, 12.94, 1234.5)] == \
        ["already met", "already met", "0.0414×", "12.9×", "1,234×"]
    assert format_times(math.inf) == format_times(0.0) == format_times(math.nan) == ""


def test_nothing_a_person_reads_at_a_billion_nodes_is_in_e_notation(stampede, tmp_path: Path
                                                                     ) -> None:
    archive = measured_archive(tmp_path)
    for command in ("project", "mttr"):
        result = stampede(command, str(archive), "--target-ranks", "8000000000",
                          "--target-ranks-per-node", "8")
        assert result.returncode == 0, result.stderr
        assert not re.search(r"\de[+-]\d", result.stdout), result.stdout
