"""NFS targets (stampede.backends.nfs) on a real nfs-ganesha: the URL, a prepare, run,
save, restore and clean through one user-space client per rank, the RPCs each op costs
counted on the wire (stampede.backends.rpc_count), and a server that dies mid-restore."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stampede.backends.nfs import LIBNFS4_NFS4_WRITE_BYTES, NFS4_READ_BYTES, parse_target
from stampede.backends.rpc_count import call_name
from stampede.errors import UsageError
from stampede.launcher import find_mpiexec
from tests.helpers.jobs import RUN_TIMEOUT_S, read_archive, sidecars, small_job
from tests.helpers.nfsserver import (
    NfsServer,
    require,
    running_server,
    start_server,
    stop_server,
)


@pytest.mark.parametrize(("target", "options", "url", "export", "root", "version"), [
    ("nfs://10.0.0.5/export/ck", {}, "nfs://10.0.0.5/export?version=4", "/export", "/ck", 4),
    ("nfs://h:2050/export/a/b?version=3&mountport=20491", {},
     "nfs://h/export?mountport=20491&nfsport=2050&version=3", "/export", "/a/b", 3),
    ("nfs://h/srv/nfs/ck", {"export": "/srv/nfs", "version": 3},
     "nfs://h/srv/nfs?version=3", "/srv/nfs", "/ck", 3),
    ("nfs://h/export", {}, "nfs://h/export?version=4", "/export", "/", 4),
])
def test_the_url_names_the_server_export_directory_and_version(
        target: str, options: dict[str, object], url: str, export: str, root: str,
        version: int) -> None:
    assert parse_target(target, options) == (url, export, root, version)


@pytest.mark.parametrize(("target", "options", "said"), [
    ("nfs:///export/ck", {}, "names no server"),
    ("nfs://h/export/ck?version=5", {}, "NFS version '5': 3 or 4"),
    ("nfs://h/a/ck", {"export": "/b"}, "not under the export '/b'"),
    ("nfs://h/", {}, "names no export"),
    ("nfs://h:port/export", {}, "the port is not a number"),
    # libnfs ignores a key it does not know: a misspelt version was a silent NFSv4
    ("nfs://h/export/ck?verison=3", {},
     "the query key 'verison' is not one of version, mountport (did you mean \"version\"?)"),
    ("nfs://h/export/ck?foo=bar", {}, "the query key 'foo' is not one of version, mountport"),
    ("nfs://h/export/ck?version=", {}, "NFS version '': 3 or 4"),
    ("nfs://h/export/ck?version=3&mountport=x", {}, "mountport = 'x': a port number"),
])
def test_a_target_that_cannot_be_is_refused(target: str, options: dict[str, object],
                                            said: str) -> None:
    with pytest.raises(UsageError, match=re.escape(said)):
        parse_target(target, options)


def test_calls_are_named_from_their_bytes() -> None:
    """An NFSv4 COMPOUND and an NFSv3 call as a client sends them (RFC 5531, 7530, 1813),
    read back by the relay's decoder."""
    def u32(*values: int) -> bytes:
        return b"".join(value.to_bytes(4, "big") for value in values)

    header = u32(7, 0, 2, 100003)           # xid, CALL, rpcvers 2, NFS
    auth = u32(0, 0, 0, 0)                   # AUTH_NONE credential and verifier
    handle = u32(8) + b"\x01" * 8
    compound = (header + u32(4, 1) + auth + u32(0, 0, 3)   # tag "", minor 0, 3 operations
                + u32(22) + handle                          # PUTFH fh
                + u32(15) + u32(5) + b"shard\x00\x00\x00"   # LOOKUP "shard"
                + u32(9) + u32(2, 0x18, 0x300000))          # GETATTR bitmap of 2 words
    assert call_name(compound) == "COMPOUND(PUTFH LOOKUP GETATTR)"
    opened = header + u32(4, 1) + auth + u32(0, 0, 3) + u32(22) + handle + u32(18) + u32(9)
    assert call_name(opened) == "COMPOUND(PUTFH OPEN)"      # OPEN's arguments end the reading
    assert call_name(header + u32(3, 1) + auth) == "GETATTR"
    assert call_name(u32(7, 1, 0)) is None                  # a reply
    assert call_name(header[:6]) == "unreadable"


def rpcs(sidecar: dict[str, object], op: str) -> list[list[object]]:
    storage = sidecar["storage"]
    assert isinstance(storage, dict)
    return storage["rpcs_per_op"]["ops"][op]


@pytest.mark.mpi
def test_prepare_run_save_restore_and_clean_through_nfs(stampede, nfs_server: NfsServer,
                                                        nfs_target: str, tmp_path: Path) -> None:
    """Two ranks, shared and sharded, each rank a client of its own: the reads, the save's
    ops and their RPCs as the wire counted them; clean leaves the export as it was."""
    block = 2 * NFS4_READ_BYTES
    job = small_job(tmp_path, target={"path": nfs_target},
                    checkpoint={"size": "8MiB", "block_size": "2MiB"},
                    run={"iterations": 2, "warmup": 1, "verify": "sha256"}, save={"keep": 1})
    before = sorted(os.listdir(nfs_server.export))
    for command in ("prepare", "run", "save", "run"):
        result = stampede(command, str(job), np=2)
        assert result.returncode == 0, result.stdout + result.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    completions = [row for row in rows if row["op"] in ("restore", "save")]
    assert [(row["op"], row["layout"]) for row in completions] == [
        ("restore", "shared"), ("restore", "sharded"), ("save", "shared"), ("save", "sharded"),
        ("restore", "shared"), ("restore", "sharded")]
    assert all(row["valid"] == "true" and row["backend"] == "nfs" for row in completions)
    reads = [row for row in rows if row["op"] == "read"]
    assert {int(row["op_bytes"]) for row in reads} == {2 * 2 * 4 * 2**20}   # 2 it., 2 ranks, 4 MiB
    restore, save = sidecars(tmp_path / "results" / "job.csv")[:2]
    # one block of 2 MiB is two READs of the server's 1 MiB; one write of a block is one
    # WRITE per 3,944 bytes (libnfs 4.0's NFSv4 limit); a COMMIT makes it durable
    assert rpcs(restore, "read") == [[block // NFS4_READ_BYTES, "COMPOUND(PUTFH READ)"]]
    assert [name for _, name in rpcs(restore, "stat")][-1].endswith("GETATTR GETFH)")
    assert rpcs(save, "write") == [[-(-block // LIBNFS4_NFS4_WRITE_BYTES), "COMPOUND(PUTFH WRITE)"]]
    assert rpcs(save, "fsync") == [[1, "COMPOUND(PUTFH COMMIT)"]]
    assert "NFS RPCs per op" in result.stdout
    assert restore["layouts"]["sharded"]["kernel_nfs_rpcs"] == (
        "not counted: the target is not on a kernel NFS mount (nfs4 (libnfs))")
    cleaned = stampede("clean", str(job))
    assert cleaned.returncode == 0, cleaned.stderr
    assert sorted(os.listdir(nfs_server.export)) == before       # the root it made went too


@pytest.mark.mpi
def test_a_server_killed_mid_restore_is_one_clear_error(stampede, tmp_path: Path) -> None:
    """ganesha killed (SIGKILL) while two ranks restore: each rank's op fails within the
    client's timeout, the run ends with the errors named, no hang."""
    require()
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    with running_server(tmp_path / "server") as server:
        job = small_job(tmp_path, target={"path": server.url("ck"),
                                          "storage_options": {"timeout_ms": 2000}},
                        checkpoint={"size": "8MiB", "layout": ["sharded"]},
                        run={"iterations": 2000, "warmup": 0, "verify": "none"})
        prepared = stampede("prepare", str(job), np=2)
        assert prepared.returncode == 0, prepared.stderr
        running = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", "run",
                                    str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, cwd=tmp_path)
        try:
            assert running.stdout is not None
            while " took " not in (line := running.stderr.readline() if running.stderr
                                   else ""):   # a progress line: restoring now
                assert line, running.communicate(timeout=RUN_TIMEOUT_S)
            os.kill(server.pid, signal.SIGKILL)
            started = time.monotonic()
            out, err = running.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if running.poll() is None:
                running.kill()
    said = " ".join((out + err).split())
    assert running.returncode == 1, said                  # a failed run, not a usage error
    assert time.monotonic() - started < 60, said          # the 2 s timeout, not a hang
    assert "archived: " in said, said
    for failed, made in re.findall(r"(\d+) of (\d+) ops failed", said):
        assert int(failed) <= int(made), said
    assert "Traceback" not in said
    # each failed op named with its rank (the connection is gone: libnfs says EIO), the
    # layout INVALID, what it measured archived. Which ranks fail is the kill's timing: a
    # rank whose iteration's ops were all done when the server died has nothing to fail
    # before the run stops at that iteration's end (run.max_error_fraction = 0)
    named = set(re.findall(r"error: rank (\d+): ", said))
    assert named and named <= {"0", "1"}, said
    for rank in named:   # its first failed op: EIO (the ops after it may say why they did not run)
        assert re.search(rf"error: rank {rank}: [^:]+: Input/output error", said), said
    assert "sharded: INVALID" in said, said
    assert [row["valid"] for row in read_archive(tmp_path / "results" / "job.csv")
            if row["op"] == "restore"] == ["false"]


@pytest.mark.mpi
def test_a_server_killed_mid_save_leaves_the_published_version_restorable(
        stampede, tmp_path: Path) -> None:
    """A save's server SIGKILLed mid-save: the save fails within the client's timeout,
    named; the server started again on the same export, `run` restores the version the
    pointer names (published before the kill) and `clean` removes every version, the one
    cut short too."""
    require()
    mpiexec = find_mpiexec()
    assert mpiexec is not None

    server = start_server(tmp_path / "server")
    try:
        job = small_job(tmp_path, target={"path": server.url("ck"),
                                          "storage_options": {"timeout_ms": 2000}},
                        checkpoint={"size": "8MiB", "layout": ["sharded"]},
                        run={"iterations": 1, "warmup": 0, "verify": "none"},
                        save={"keep": 1, "validate": "none"})
        first = stampede("save", str(job), np=2)
        assert first.returncode == 0, first.stderr
        saving = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", "save",
                                   str(job), "--set", "run.iterations=500"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=tmp_path)
        try:
            assert saving.stderr is not None
            while " took " not in (line := saving.stderr.readline()):   # saving now
                assert line, saving.communicate(timeout=RUN_TIMEOUT_S)
            stop_server(server, signal.SIGKILL)
            out, err = saving.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if saving.poll() is None:
                saving.kill()
        said = " ".join((out + err).split())
        assert saving.returncode not in (0, None), said
        assert "Traceback" not in said and "error" in said, said
        server = start_server(tmp_path / "server", server.port)   # the same export, again
        restored = stampede("run", str(job), np=2)
        assert restored.returncode == 0, restored.stdout + restored.stderr
        row = next(row for row in read_archive(tmp_path / "results" / "job.csv")
                   if row["op"] == "restore")
        # the pointer is the commit: the version it names was durable before it moved (the
        # kill may fall between the pointer and the journal's own record of it)
        pointer = (server.export / "ck" / "saves" / "sharded" / "latest").read_text().strip()
        journal = json.loads((server.export / "ck" / "stampede-saves.json").read_text())
        states = {entry["dir"]: entry["state"] for entry in
                  journal["layouts"]["sharded"]["versions"]}
        assert row["valid"] == "true" and row["restored_from"] == f"saves/sharded/{pointer}", \
            (row, states)
        assert states["saves/sharded/v000001"] in ("complete", "released")
        assert pointer != "v000001"    # the killed save had published once before the kill
        cleaned = stampede("clean", str(job))
        assert cleaned.returncode == 0, cleaned.stderr
        left = sorted(str(path.relative_to(server.export)) for path in server.export.rglob("*"))
        assert left == [], (left, cleaned.stdout, states)
    finally:
        stop_server(server)


@pytest.mark.mpi
def test_nfsv3_writes_whole_blocks_and_counts_its_procedures(stampede, tmp_path: Path) -> None:
    """NFSv3 through the same client (rpcbind in a namespace of its own, the MOUNT port
    named): a block is written in wsize WRITEs (NFSv4 through libnfs 4.0 needs 3,944-byte
    ones), each op's procedures counted, the target cleaned away."""
    require()
    with running_server(tmp_path / "server", v3=True) as server:
        target, options = server.url_v3("ck")
        job = small_job(tmp_path, target={"path": target, "storage_options": options},
                        checkpoint={"size": "8MiB", "block_size": "2MiB"},
                        run={"iterations": 1, "warmup": 0, "verify": "sha256"},
                        save={"keep": 1})
        for command in ("prepare", "run", "save", "clean"):
            done = stampede(command, str(job), np=None if command == "clean" else 2)
            assert done.returncode == 0, (command, done.stdout + done.stderr)
        restore, save = sidecars(tmp_path / "results" / "job.csv")
        assert restore["storage"]["protocol"] == "nfs3"
        wsize = save["storage"]["wsize"]
        assert wsize >= 2**20                            # FSINFO's, not libnfs 4.0's NFSv4 cap
        assert rpcs(restore, "read") == [[2 * 2**20 // restore["storage"]["rsize"], "READ"]]
        assert rpcs(restore, "stat")[-1] == [1, "GETATTR"]   # after the LOOKUPs of the path
        assert rpcs(save, "write") == [[2 * 2**20 // wsize, "WRITE"]]
        assert rpcs(save, "fsync") == [[1, "COMMIT"]]
        assert sorted(os.listdir(server.export)) == []
    assert not [name for name in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                text=True).stdout.split()
                if name.startswith("stampede-rpcb")]


@pytest.mark.mpi
def test_permission_denied_is_one_line_and_nothing_written(stampede, tmp_path: Path) -> None:
    """A server that squashes root (the client's root is nobody there) refuses prepare's
    first directory: EACCES named, exit 1 or 2, nothing written."""
    require()

    with running_server(tmp_path / "squashed", squash="Root_Squash") as server:
        job = small_job(tmp_path, target={"path": server.url("ck")},
                        checkpoint={"size": "4MiB"}, run={"verify": "none"})
        refused = stampede("prepare", str(job), np=2)
        said = " ".join(refused.stderr.split())
        assert refused.returncode in (1, 2) and "Permission denied" in said, said
        assert "Traceback" not in said and os.listdir(server.export) == []


@pytest.mark.mpi
@pytest.mark.parametrize("query", ["", "?version=3&mountport={port}"])
def test_nothing_listening_is_connection_refused(stampede, tmp_path: Path, query: str) -> None:
    """A port nothing listens on (bound here, never listened on: the kernel refuses each
    connection): one line naming the URL and the port refused, exit 2, not libnfs's EIO."""
    require()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        target = f"nfs://127.0.0.1:{port}/export/ck" + query.format(port=port)
        job = small_job(tmp_path, target={"path": target}, checkpoint={"size": "1MiB"},
                        run={"iterations": 1, "warmup": 0, "verify": "none"})
        for command in ("save", "run"):
            refused = stampede(command, str(job), np=2)
            said = (f"target.path = {target!r}: connection refused by 127.0.0.1:{port}: "
                    "nothing listens there (is the NFS server running, and on that port?)")
            assert refused.returncode == 2, refused.stdout + refused.stderr
            # said once by the root (run's check of the checkpoint, save's lock) or by
            # each rank (a save that got past its lock)
            lines = refused.stderr.splitlines()
            first = next(at for at, line in enumerate(lines) if ": error: " in line)
            assert lines[first:] in (
                [f"stampede {command}: error: checking the checkpoint: {said}"],
                [f"stampede {command}: error: locking the target: {said}"],
                [f"stampede {command}: error: connecting to the target failed on 2 of 2 "
                 "ranks:", f"  rank 0: {said}", f"  rank 1: {said}"]), refused.stderr
            assert "Input/output error" not in refused.stderr
    assert not (tmp_path / "results").exists()


def _kill_after_first_phase(mpiexec: str, command: str, job: Path, cwd: Path, server: NfsServer,
                            how: signal.Signals, delay_s: float) -> tuple[int, str]:
    """`stampede COMMAND job` on 2 ranks, the server sent `how` `delay_s` after the first
    phase's progress line: (exit status, stdout and stderr)."""
    running = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "stampede", command,
                                str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=cwd)
    try:
        assert running.stderr is not None
        while " took " not in (line := running.stderr.readline()):
            assert line, running.communicate(timeout=RUN_TIMEOUT_S)
        time.sleep(delay_s)
        os.kill(server.pid, how)
        out, err = running.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if running.poll() is None:
            running.kill()
    return running.returncode, out + err


@pytest.mark.mpi
@pytest.mark.parametrize("delay_s", [0.0, 0.15])
def test_a_server_killed_after_a_save_archives_what_was_measured(
        stampede, tmp_path: Path, delay_s: float) -> None:
    """ganesha SIGKILLed once a save was measured, wherever the kill lands (in the next
    save's phase, its journal record, or between two saves): exit 1 (a failed run, not
    the usage status 2), the failure named, the rows archived invalid and said so."""
    require()
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    with running_server(tmp_path / "server") as server:
        job = small_job(tmp_path, target={"path": server.url("ck"),
                                          "storage_options": {"timeout_ms": 2000}},
                        checkpoint={"size": "8MiB", "layout": ["sharded"]},
                        run={"iterations": 500, "warmup": 0, "verify": "none"},
                        save={"keep": 1, "validate": "none"})
        status, said = _kill_after_first_phase(mpiexec, "save", job, tmp_path, server,
                                               signal.SIGKILL, delay_s)
    said = " ".join(said.split())
    assert status == 1, said
    assert "Traceback" not in said and "Input/output error" in said, said
    assert "archived: " in said and "save finished with errors, archived as invalid" in said
    rows = [row for row in read_archive(tmp_path / "results" / "job.csv") if row["op"] == "save"]
    assert rows and {row["valid"] for row in rows} == {"false"}, rows


@pytest.mark.mpi
@pytest.mark.parametrize("command", ["run", "save"])
def test_a_server_hung_in_a_warmup_is_a_failed_warmup(stampede, tmp_path: Path,
                                                      command: str) -> None:
    """ganesha stopped (SIGSTOP) after the first of two warmups: the second fails within
    the client's timeout ("Connection timed out", not EINTR), the layout is invalid in
    "warmup iteration 2 of 2", no iteration is reported measured, and no count says more
    ops failed than were made."""
    require()
    mpiexec = find_mpiexec()
    assert mpiexec is not None
    with running_server(tmp_path / "server") as server:
        job = small_job(tmp_path, target={"path": server.url("ck"),
                                          "storage_options": {"timeout_ms": 1000}},
                        checkpoint={"size": "8MiB", "layout": ["sharded"]},
                        run={"iterations": 2, "warmup": 2, "verify": "none"},
                        save={"keep": 1, "validate": "none"})
        if command == "run":
            prepared = stampede("prepare", str(job), np=2)
            assert prepared.returncode == 0, prepared.stderr
        try:
            status, said = _kill_after_first_phase(mpiexec, command, job, tmp_path, server,
                                                   signal.SIGSTOP, 0.0)
        finally:
            os.kill(server.pid, signal.SIGCONT)
    said = " ".join(said.split())
    assert status == 1, said
    assert "Traceback" not in said and "Interrupted system call" not in said, said
    assert "Connection timed out" in said, said
    # the run's phases touch no server between warmups: the hang is the second's; a
    # save's lands in the second or in the first's journal record, named as that warmup's
    assert re.search(r"INVALID: .*warmup iteration [12] of 2" if command == "save" else
                     r"INVALID: .* in warmup iteration 2 of 2", said), said
    assert "archived: " in said, said
    assert "0 iterations + 2 warmup" in said or "0 saves + 2 warmup" in said, said
    assert "no measured iteration: the samples are the failed warmup's" in said, said
    assert " measured iteration(s)" not in said, said
    for failed, made in re.findall(r"(\d+) of (\d+) ops failed", said):
        assert int(failed) <= int(made), said
