"""`stampede rejoin` on three named nodes (hydra's ssh launcher through a launcher that
runs each node's ranks in a UTS namespace of its own: MPI sees three hosts): a save in
tiers, node B lost, the spare on node C in its place. What is checked: the five layouts
archived with the ranks that took part, the spare's bytes from the peer (or from storage
when the replica is missing or corrupt, said), every shard checked (run.verify), the
peer op counts, and nothing left on any node's local tier or on the target."""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, write_job

pytestmark = pytest.mark.mpi
LAUNCHER = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
exec unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def rejoin_command(tmp_path: Path, *args: str) -> list[str]:
    """stampede rejoin on nodeA, nodeB, nodeC, one rank each: the command line."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("named nodes need root and unshare (a UTS namespace per node)")
    launcher = tmp_path / "launcher"
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    return [mpiexec, "-launcher", "ssh", "-launcher-exec", str(launcher), "-hosts",
            "nodeA:1,nodeB:1,nodeC:1", "-n", "3", sys.executable, "-m", "stampede", "rejoin",
            *args]


def environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def rejoin(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """stampede rejoin on nodeA, nodeB, nodeC, one rank each."""
    return subprocess.run(rejoin_command(tmp_path, *args), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, cwd=tmp_path, env=environment())


def job(tmp_path: Path) -> Path:
    (tmp_path / "target").mkdir()
    return write_job(tmp_path, "tiers", target={"path": str(tmp_path / "target")},
                     checkpoint={"size_per_rank": "4MiB", "block_size": "1MiB"},
                     run={"iterations": 2, "warmup": 1, "verify": "xxh3"},
                     tiers={"local_dir": str(tmp_path / "local")},
                     archive={"path": str(tmp_path / "results" / "tiers.csv")})


def said(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


def html_verdict(stampede: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> str:
    """The HTML report's verdict section of the run's archive, as text."""
    page = tmp_path / "report.html"
    made = stampede("report", str(tmp_path / "results" / "tiers.csv"), "--html", str(page))
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    # the run's own tables: the tiers of one save in their order, none ranked against
    # another; the rejoin beside the restart
    tiers = re.findall(r"<tr><td>(tier-\w+)</td><td>[^<]*</td><td>([^<]*)</td>", text)
    assert tiers == [("tier-local", "-"), ("tier-peer", "-"), ("tier-storage", "-")], tiers
    assert re.findall(r"<tr><td>(rejoin|restart)</td>", text[text.index('id="restore"'):])
    section = text[text.index('id="verdict"'):]
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", section[:section.index("</section>")])
                                  ).split())


def test_the_spare_rejoins_from_its_peer_and_everything_is_archived_and_removed(
        stampede, tmp_path: Path) -> None:
    result = rejoin(tmp_path, str(job(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    text = said(result)
    assert "tier by rank: 0@nodeA local, 1@nodeC (spare, world rank 2) peer" in text
    assert "bytes by tier (last iteration): local 4,194,304 B, peer 4,194,304 B" in text
    assert "restart: note: tier by rank: 0@nodeA storage, 1@nodeC (spare, world rank 2) " \
        "storage" in text                      # notes, not warnings
    assert "warning: tier by rank" not in text and "warning: bytes by tier" not in text
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    done = {(row["phase"], row["layout"]): row for row in rows if row["op"] in ("save", "restore")}
    assert set(done) == {("save", "tier-local"), ("save", "tier-peer"), ("save", "tier-storage"),
                         ("restore", "rejoin"), ("restore", "restart")}
    # the save by nodes A and B; the restores by A and the spare on C (B is lost)
    assert {row["nranks"] for row in done.values()} == {"2"}
    peer = {row["layout"]: int(row["count"]) for row in rows if row["op"] == "peer"}
    assert peer == {"tier-peer": 2, "rejoin": 2 * 2}   # A<->B once; A serves C each iteration
    verify = [row for row in rows if row["op"] == "verify" and row["layout"] == "rejoin"]
    assert int(verify[0]["count"]) == 2 * 2 and verify[0]["errors"] in ("", "0")
    assert not list((tmp_path / "local").rglob("*"))   # every node's local tier removed
    assert not list((tmp_path / "target").iterdir())    # the storage tier too
    # the spare's own start-up, after the loss: its rank alone, on its node, as startup's ops
    started = {row["op"]: row for row in rows if row["layout"] == "spare-start"}
    assert set(started) >= {"interpreter", "import", "mpi_init", "startup"}, set(started)
    assert started["startup"]["phase"] == "startup" and started["startup"]["hosts"] == "nodeC"
    assert float(started["startup"]["time_to_last_rank_s"]) >= \
        float(started["mpi_init"]["lat_max_s"])   # launch -> MPI ready holds MPI's init
    modelled = stampede("mttr", str(tmp_path / "results" / "tiers.csv"))
    assert modelled.returncode == 0, modelled.stderr
    text = " ".join(modelled.stdout.split())
    assert "term rejoin restart" in text and "T_MTTR at 16384 ranks" in text, text
    assert "T_MTTR = T_detect" not in text     # one T_MTTR per way back, nothing else
    assert "rejoin T_pod_init: measured: run " in text and " spare-start, " in text
    archive = str(tmp_path / "results" / "tiers.csv")
    projected = stampede("project", archive, "--target-ranks", "16384",
                         "--target-ranks-per-node", "8",
                         "--lost-nodes", "2", "--spare-pool-pct", "0.01")
    assert projected.returncode == 0, projected.stderr
    text = " ".join(projected.stdout.split())   # 2,048 nodes: a pool of 1, 2 lost
    assert "2 adjacent node(s) lost (ring, 1 peer(s); 1 of them with no replica left: " \
        "storage), a pool of 1 spare node(s) (0.01% of the nodes)" in text, text
    assert text.count("not possible: 2 lost node(s) and 1 spare(s)") == 1, text
    refused = stampede("project", archive, "--target-ranks", "16384", "--lost-nodes", "0")
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "stampede project: error: argument --lost-nodes: 0: must be from 1 to 1,000,000,000,000"]
    verdict = html_verdict(stampede, tmp_path)
    assert "use tier-" not in verdict           # the tiers of one save are not ranked
    assert "restore T_MTTR as measured (2 ranks) T_MTTR at 16384 ranks" in verdict
    assert "local peer storage rejoin 4 MiB 4 MiB - restart - - 8 MiB" in verdict   # by tier
    assert "no fall-back to storage" in verdict


def test_sizes_runs_one_rejoin_per_size_and_mttr_fits_the_fixed_term(
        stampede, tmp_path: Path) -> None:
    """--sizes: one run per size in one launch; `mttr` fits the rejoin's fixed part from
    the two (time = fixed + bytes / B), where one size only can put it inside B_node."""
    path = job(tmp_path)
    refused = stampede("rejoin", str(path), "--sizes", "2MiB,2MiB")   # before MPI, any I/O
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "stampede rejoin: error: --sizes 2MiB,2MiB: '2MiB': each size must be > 0 and given "
        "once"], refused.stderr
    result = rejoin(tmp_path, str(path), "--sizes", "2MiB,4MiB")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    restores = [(row["run_id"], int(row["bytes_per_rank"])) for row in rows
                if row["op"] == "restore" and row["layout"] == "rejoin"]
    assert [size for _, size in restores] == [2 * 2**20, 4 * 2**20]
    assert len({run_id for run_id, _ in restores}) == 2
    modelled = stampede("mttr", str(tmp_path / "results" / "tiers.csv"))
    assert modelled.returncode == 0, modelled.stderr
    text = " ".join(modelled.stdout.split())
    assert "(the rejoin's time to last rank less its transfer, mean over 2 MiB, 4 MiB per " \
        "rank)" in text, text
    assert not list((tmp_path / "local").rglob("*"))


@pytest.mark.parametrize(("publish", "drain"), [("storage", "background"), ("local", "inline")])
def test_the_version_is_published_at_the_level_asked_and_each_tier_says_its_window(
        tmp_path: Path, publish: str, drain: str) -> None:
    """`published` in the layout of the tier tiers.publish names; each tier's unprotected
    window 0 up to that tier and above 0 past it; the rank blocked until its peer copy is
    acknowledged, and its storage copy too only when the drain is inline."""
    result = rejoin(tmp_path, str(job(tmp_path)), "--set", f"tiers.publish={publish}",
                    "--set", f"tiers.drain={drain}")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    saves = {row["layout"]: row for row in rows if row["op"] == "save"}
    published = {row["layout"] for row in rows if row["op"] == "published"}
    assert published == {f"tier-{publish}"}
    windows = {layout: float(row["unprotected_s"]) for layout, row in saves.items()}
    past = ("tier-peer", "tier-storage") if publish == "local" else ()
    assert {layout for layout, seconds in windows.items() if seconds > 0} == set(past), windows
    blocked = {row["layout"]: float(row["lat_max_s"]) for row in rows if row["op"] == "blocked"}
    assert set(blocked) == set(saves) and len(set(blocked.values())) == 1   # one save's
    waited_for = ("tier-local", "tier-peer") + (("tier-storage",) if drain == "inline" else ())
    assert all(blocked[layout] >= float(saves[layout]["lat_max_s"]) for layout in waited_for)
    assert not list((tmp_path / "local").rglob("*"))


def test_each_tier_keeps_its_own_versions_and_the_last_is_restored(tmp_path: Path) -> None:
    """Three versions; the local tier keeps 2, the peers 1, the storage 3: each older one
    removed (unlink, in its tier's layout) once a newer is published; the rejoin restores
    the last (its run.verify hash), the spare's from its peer."""
    result = rejoin(tmp_path, str(job(tmp_path)), "--set", "tiers.versions=3",
                    "--set", "tiers.keep_local=2", "--set", "tiers.keep_storage=3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tier by rank: 0@nodeA local, 1@nodeC (spare, world rank 2) peer" in said(result)
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    saves = [row for row in rows if row["op"] == "save"]
    assert {(row["iterations"], row["count"]) for row in saves} == {("3", "6")}  # 2 ranks
    assert [row["count"] for row in rows if row["op"] == "published"] == ["3"]
    released = {row["layout"]: int(row["count"]) for row in rows if row["op"] == "unlink"}
    assert released == {"tier-local": 2 * 1, "tier-peer": 2 * 2}   # v1; v1 and v2
    assert all(float(row["unprotected_s"]) == 0 for row in saves)   # published on storage
    assert not list((tmp_path / "local").rglob("*"))
    assert not list((tmp_path / "target").iterdir())


@pytest.mark.parametrize(("damage", "why"), [("missing", "missing on its peer"),
                                             ("corrupt", "failed run.verify (xxh3)")])
def test_a_missing_or_corrupt_replica_falls_back_to_storage(stampede, tmp_path: Path,
                                                            damage: str, why: str) -> None:
    result = rejoin(tmp_path, str(job(tmp_path)), "--damage", damage)
    assert result.returncode == 0, result.stdout + result.stderr
    text = said(result)
    assert f"rank 2: position 1's replica {why} on rank 0: read from storage" in text
    assert "1@nodeC (spare, world rank 2) storage" in text
    assert not list((tmp_path / "local").rglob("*"))
    verdict = html_verdict(stampede, tmp_path)
    assert f"Fell back to storage: rank 2: position 1's replica {why} on rank 0: read from " \
        "storage" in verdict
    assert "storage rejoin 4 MiB - 4 MiB restart" in verdict   # the spare from storage


def test_a_placement_that_cannot_be_made_is_refused_before_any_io(tmp_path: Path) -> None:
    path = job(tmp_path)
    result = rejoin(tmp_path, str(path), "--set", "tiers.peers=2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tiers.peers = 2" in said(result)
    assert result.stderr.count("tiers.peers = 2") == 1   # once, not once per rank
    assert "2 working: at most 1 peer(s)" in said(result)
    assert not (tmp_path / "local").exists() and not list((tmp_path / "target").iterdir())


def test_a_tier_left_by_an_unfinished_rejoin_is_refused_and_kept(tmp_path: Path) -> None:
    path = job(tmp_path)
    left = tmp_path / "local" / "nodeB" / "stampede-tiers" / "p00001"
    left.parent.mkdir(parents=True)
    left.write_bytes(b"x")
    result = rejoin(tmp_path, str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "left by a rejoin of this job that did not finish" in said(result)
    assert "--clean" in said(result)
    assert left.read_bytes() == b"x"                      # never touched
    assert not list((tmp_path / "target").iterdir())
    mine = left.parent / "notes.txt"                       # not a name a rejoin writes
    mine.write_text("mine")
    cleaned = rejoin(tmp_path, str(path), "--clean")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert "1 file(s) removed" in said(cleaned)
    assert not left.exists() and mine.read_text() == "mine"
    assert rejoin(tmp_path, str(path), "--set", "tiers.local_dir=" + str(tmp_path / "other")
                  ).returncode == 0


def test_a_fresh_directory_gets_its_target_and_local_tier_made_and_removed(
        tmp_path: Path) -> None:
    """Neither the target nor tiers.local_dir exists (jobs/rejoin.toml in a new directory
    once ended `No such file or directory: b'stampede-ckpt/tiers-rejoin'`): both made, and
    every directory the rejoin made removed at the end; a local_dir that was there stays,
    with what the user keeps in it."""
    path = write_job(tmp_path, "tiers", target={"path": "stampede-ckpt"},
                     checkpoint={"size_per_rank": "1MiB", "block_size": "1MiB"},
                     run={"iterations": 1, "warmup": 0, "verify": "xxh3"},
                     tiers={"local_dir": str(tmp_path / "local" / "deep")},
                     archive={"path": str(tmp_path / "results" / "tiers.csv")})
    result = rejoin(tmp_path, str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "stampede-ckpt").exists()      # made, emptied, removed
    assert not (tmp_path / "local").exists()              # the local tier's root too
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    again = rejoin(tmp_path, str(path), "--set", f"tiers.local_dir={mine}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]   # only what it made


@pytest.mark.parametrize(("setting", "said_"), [
    ("tiers.local_dir=/proc/x", "tiers.local_dir = '/proc/x': /proc is on /proc (proc), "
                                "where no tier can be written"),
    ("tiers.local_dir=FILE/x", "tiers.local_dir = 'FILE/x': FILE is not a directory")])
def test_a_local_tier_that_cannot_be_made_is_one_line_before_any_io(
        tmp_path: Path, setting: str, said_: str) -> None:
    path = job(tmp_path)
    (tmp_path / "file").write_text("x")
    setting, said_ = (text.replace("FILE", str(tmp_path / "file")) for text in (setting, said_))
    result = rejoin(tmp_path, str(path), "--set", setting)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said_ in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not list((tmp_path / "target").iterdir())
    assert not (tmp_path / "results").exists()


def test_damage_corrupt_without_verify_is_refused(tmp_path: Path) -> None:
    """A corrupt replica restored unchecked would be a valid rejoin of corrupt bytes."""
    result = rejoin(tmp_path, str(job(tmp_path)), "--damage", "corrupt",
                    "--set", "run.verify=none")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"stampede rejoin: error: {tmp_path / 'tiers.toml'}: --damage corrupt with run.verify = "
        "\"none\": the corrupt replica would be restored unchecked; run.verify must be sha256 or xxh3"]
    assert not (tmp_path / "local").exists() and not list((tmp_path / "target").iterdir())


@pytest.mark.parametrize("how", ["killed", "hung, then Ctrl-C"])
def test_a_storage_server_killed_or_hung_mid_rejoin_is_one_line_per_rank(
        tmp_path: Path, how: str) -> None:
    """ganesha SIGKILLed (or stopped, SIGSTOP, then Ctrl-C to mpiexec) while the save in
    tiers drains to it, versions one after the other: the version cut short fails on the
    ranks within the client's timeout, one line each, no traceback, no MPI_Abort; the save
    ends there, its tiers archived (local and peer valid, storage invalid), the restores
    not measured and said; exit 1 (130 for Ctrl-C); every local tier removed, and the
    storage tier, which cannot be, named with --clean."""
    from tests.helpers.nfsserver import require, start_server, stop_server

    require()
    server = start_server(tmp_path / "server")
    try:
        path = write_job(tmp_path, "tiers",
                         target={"path": server.url("ck"), "storage_options": {"timeout_ms": 2000}},
                         checkpoint={"size_per_rank": "4MiB", "block_size": "1MiB"},
                         run={"iterations": 1, "warmup": 0, "verify": "xxh3"},
                         tiers={"local_dir": str(tmp_path / "local"), "versions": 1000},
                         archive={"path": str(tmp_path / "results" / "tiers.csv")})
        running = subprocess.Popen(rejoin_command(tmp_path, str(path)), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                   env=environment())
        try:
            second = server.export / "ck" / "tiers-tiers" / "v0002-p00001"
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while not second.exists() and running.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)   # the second version draining: mid-save
            if how == "killed":
                stop_server(server, signal.SIGKILL)
            else:
                os.killpg(server.pid, signal.SIGSTOP)
                time.sleep(0.5)
                running.send_signal(signal.SIGINT)
            stopped = time.monotonic()
            out, err = running.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if running.poll() is None:
                running.kill()
            if how != "killed":
                os.killpg(server.pid, signal.SIGCONT)
    finally:
        stop_server(server)
    text = " ".join((out + err).split())
    assert running.returncode == (1 if how == "killed" else 130), text
    assert time.monotonic() - stopped < 60, text        # the 2 s timeouts, not a hang
    assert "Traceback" not in text and "MPI_Abort" not in text and "BAD TERMINATION" not in text
    failing = re.findall(r"^error: rank (\d+): .*$", out + err, re.M)
    assert failing and len(failing) == len(set(failing)), out + err   # one line per rank
    assert "rejoin, restart not measured" in text, text
    rows = read_archive(tmp_path / "results" / "tiers.csv")
    valid = {row["layout"]: row["valid"] for row in rows if row["op"] == "save"}
    assert valid["tier-local"] == valid["tier-peer"] == "true", valid
    assert valid["tier-storage"] == "false", valid
    assert not (tmp_path / "local").exists()              # every node's local tier removed
    assert re.search(r"ck/tiers-tiers left on the target \(listing it: .*\): "
                     r"stampede rejoin JOB --clean", text), text


def test_an_s3_server_that_dies_mid_rejoin_is_one_line_per_rank_and_clean_removes_the_rest(
        tmp_path: Path, s3_env: Any) -> None:
    """Every connection to the S3 server closed from the second version's drain on (the
    suite's fault proxy): the same as an NFS server's death (exit 1, one line per failing
    rank, the tiers archived, the storage tier named); the server back, `rejoin --clean`
    removes what was left on it."""
    from tests.helpers.s3server import FaultProxy

    prefix = f"rejoin-{uuid.uuid4().hex[:10]}"
    with FaultProxy(s3_env.endpoint_url.removeprefix("http://")) as proxy:
        path = write_job(tmp_path, "tiers", target={
            "path": f"s3://{s3_env.bucket}/{prefix}",
            "storage_options": {"endpoint_url": proxy.endpoint_url, "max_attempts": 2,
                                "connect_timeout": 2, "read_timeout": 10}},
            checkpoint={"size_per_rank": "4MiB", "block_size": "1MiB"},
            run={"iterations": 1, "warmup": 0, "verify": "xxh3"},
            tiers={"local_dir": str(tmp_path / "local"), "versions": 3},
            archive={"path": str(tmp_path / "results" / "tiers.csv")})
        proxy.die_at("/tiers-tiers/v0002-p00001")
        result = rejoin(tmp_path, str(path))
        proxy.clear()
        text = said(result)
        assert result.returncode == 1, text
        assert "Traceback" not in text and "BAD TERMINATION" not in text
        failing = re.findall(r"^error: rank (\d+): .*$", result.stdout + result.stderr, re.M)
        assert failing and len(failing) == len(set(failing)), text
        assert "the save in tiers ended early (version 2 failed" in text, text
        rows = read_archive(tmp_path / "results" / "tiers.csv")
        valid = {row["layout"]: row["valid"] for row in rows if row["op"] == "save"}
        assert valid == {"tier-local": "true", "tier-peer": "true", "tier-storage": "false"}
        assert not (tmp_path / "local").exists()
        assert "left on the target" in text and "--clean" in text, text
        cleaned = rejoin(tmp_path, str(path), "--clean")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    from stampede.backends import open_backend

    storage = open_backend(f"s3://{s3_env.bucket}/{prefix}", {"endpoint_url": s3_env.endpoint_url})
    assert storage.names() == []                          # --clean took what was left
