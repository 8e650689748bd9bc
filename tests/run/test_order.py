"""pattern.order under a real mpiexec: "file" runs every op of pattern.ops on one file
before the next file (mdtest -E's order), the default "op" each op over all a rank's files
first; read from the run's own trace (op and file of every timed op, in each rank's order).
The same ops are counted either way, the bytes are the same, the rows say which order
ran, every layout (exchanges, a shared file sliced) restores valid with it, and a bad
value is one error line, exit 2, before any I/O."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stampede.results import trace as traces
from stampede.results.readback import read_trace
from tests.helpers.existing import accounted, read_digests
from tests.helpers.jobs import read_archive, small_job, write_job

pytestmark = pytest.mark.mpi

FILE_OPS = ("stat", "open", "header", "read", "close")   # the ops timed on a rank's files


def _six_files(directory: Path) -> Path:
    """A safetensors checkpoint of six equal files (two 256 KiB tensors each), no index:
    assign = files gives each of 2 ranks three of them."""
    from safetensors.numpy import save_file

    directory.mkdir()
    for number in range(1, 7):
        tensors = {f"layer{number}.{part}": np.full(65536, number + index, dtype=np.float32)
                   for index, part in enumerate(("weight", "bias"))}
        save_file(tensors, directory / f"model-{number:05d}-of-00006.safetensors",
                  metadata={"format": "pt"})
    return directory


def _run_existing(stampede, tmp_path: Path, checkpoint: Path, order: str) -> Path:
    """Restore `checkpoint` at 2 ranks (assign files, 2 stats and 2 opens per file,
    traced); returns the run's directory."""
    directory = tmp_path / order
    directory.mkdir()
    job = write_job(directory, "existing", target={"path": "set-by-checkpoint"},
                    checkpoint={"assign": ["files"], "block_size": "64KiB"},
                    pattern={"stat_count": 2, "open_count": 2, "order": order},
                    run={"iterations": 1, "warmup": 0, "verify": "sha256"},
                    archive={"path": str(directory / "results" / "existing.csv")})
    ran = stampede("run", str(job), "--checkpoint", str(checkpoint), "--trace", np=2)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return directory


def _sequences(directory: Path, layout: str) -> dict[int, list[tuple[str, str]]]:
    """rank -> (op, file) of each of its timed file ops, in the order it ran them."""
    [path] = (directory / "results" / "existing.runs").glob("*.trace.npz")
    found = read_trace(path)
    assert found.value is not None and found.notes == (), found.notes
    trace = found.value
    rows, names = trace.layouts[layout], trace.files(layout)
    codes = {trace.code(op): op for op in FILE_OPS}
    by_rank: dict[int, list[tuple[str, str]]] = {}
    for rank in sorted(set(rows[:, traces.RANK].tolist())):
        mine = rows[(rows[:, traces.RANK] == rank) & (rows[:, traces.ITERATION] == 0)]
        mine = mine[np.argsort(mine[:, traces.START], kind="stable")]
        by_rank[rank] = [(codes[int(row[traces.OP])], names[int(row[traces.FILE])])
                         for row in mine if int(row[traces.OP]) in codes]
    return by_rank


def _runs(sequence: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The sequence cut where the file changes: (file, its ops) in turn."""
    runs: list[tuple[str, list[str]]] = []
    for op, name in sequence:
        if not runs or runs[-1][0] != name:
            runs.append((name, []))
        runs[-1][1].append(op)
    return runs


def _squeeze(ops: list[str]) -> list[str]:
    """Repeats of one op as one: stat, stat, open, open, read, read -> stat, open, read."""
    return [op for index, op in enumerate(ops) if not index or ops[index - 1] != op]


def test_file_order_runs_each_files_ops_in_turn_and_op_order_each_op_over_all(
        stampede, tmp_path: Path) -> None:
    checkpoint = _six_files(tmp_path / "checkpoint")
    by_file = _run_existing(stampede, tmp_path, checkpoint, "file")
    by_op = _run_existing(stampede, tmp_path, checkpoint, "op")
    file_seqs, op_seqs = _sequences(by_file, "restore/files"), _sequences(by_op, "restore/files")
    assert sorted(file_seqs) == sorted(op_seqs) == [0, 1]
    for rank, sequence in file_seqs.items():
        runs = _runs(sequence)
        files = [name for name, _ in runs]
        assert len(files) == len(set(files)) == 3, (rank, files)   # each file's ops contiguous
        for name, ops in runs:
            assert _squeeze(ops) == ["stat", "open", "header", "read", "close"], (rank, name)
            assert ops.count("stat") == ops.count("open") == ops.count("close") == 2
        # the same files, each the same ops, as the op order ran
        assert sorted(sequence) == sorted(op_seqs[rank])
    for rank, sequence in op_seqs.items():
        ops = [op for op, _ in sequence]
        # every stat before any open, every open before any read, the closes last
        assert ops.index("open") > max(i for i, op in enumerate(ops) if op == "stat"), rank
        assert ops.index("read") > max(i for i, op in enumerate(ops) if op == "open"), rank
        assert ops.index("close") > max(i for i, op in enumerate(ops) if op == "read"), rank
        files = [name for _, name in sequence]
        assert len(_runs(sequence)) > len(set(files)), rank   # files come back op by op
    counts = {}
    for order, directory in (("file", by_file), ("op", by_op)):
        rows = read_archive(directory / "results" / "existing.csv")
        assert {row["valid"] for row in rows} == {"true"}
        assert {row["pattern"] for row in rows} == \
            {"stat+open+read+close" + (" by file" if order == "file" else "")}
        counts[order] = {row["op"]: (row["count"], row["bytes_total"]) for row in rows
                         if row["op"] != "restore"}
        restore = next(row for row in rows if row["op"] == "restore")
        assert float(restore["read_amplification"]) == 1.0
        sidecar = next((directory / "results" / "existing.runs").glob("*.json"))
        assert json.loads(sidecar.read_text())["job"]["options"]["pattern.order"] == order
        for digests in read_digests(directory).values():   # every tensor byte, read once
            accounted(checkpoint, digests, str(checkpoint))
    assert counts["file"] == counts["op"] and counts["file"]["stat"][0] != ""


def test_every_layout_restores_file_by_file(stampede, tmp_path: Path) -> None:
    """Exchanges (broadcast, striped, node-once, owners), a shared file sliced across the
    ranks, a whole file's slices: each restores valid and verified with order = file."""
    layouts = ["shared", "sharded", "broadcast", "striped", "whole-file", "node-once",
               "metadata-first", "list-bcast"]
    job = small_job(tmp_path, checkpoint={"layout": layouts, "replicas": 2},
                    pattern={"order": "file"}, run={"iterations": 1, "warmup": 0})
    prepared = stampede("prepare", str(job), np=2)
    assert prepared.returncode == 0, prepared.stderr
    ran = stampede("run", str(job), np=2)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    rows = read_archive(tmp_path / "results" / "job.csv")
    assert {row["layout"] for row in rows} == set(layouts)
    assert {row["valid"] for row in rows} == {"true"}, [
        (row["layout"], row["invalid_reason"]) for row in rows if row["valid"] != "true"]
    assert {row["pattern"] for row in rows} == {"stat+open+read+close by file"}


def test_file_by_file_holds_one_files_handles_so_the_open_files_limit_allows_it(
        tmp_path: Path) -> None:
    """6 files x open_count 20: by op 120 handles at once, refused (exit 2, before any
    I/O) under a limit of 150 (less 64 for Python and MPI); file by file, 20: it runs."""
    import resource
    import subprocess
    import sys

    checkpoint = _six_files(tmp_path / "checkpoint")
    for order, code in (("op", 2), ("file", 0)):
        job = write_job(tmp_path, order, target={"path": str(checkpoint)},
                        checkpoint={"source": "existing", "assign": ["files"]},
                        pattern={"open_count": 20, "order": order},
                        run={"iterations": 1, "warmup": 0},
                        archive={"path": str(tmp_path / order / "runs.csv")})
        ran = subprocess.run([sys.executable, "-m", "stampede", "run", str(job)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                   (150, 150)))
        assert ran.returncode == code, ran.stdout + ran.stderr
        assert ("pattern.open_count = 20 keeps 120 files open at once" in ran.stderr) == \
            (order == "op"), ran.stderr
        assert (tmp_path / order / "runs.csv").exists() == (order == "file")


@pytest.mark.parametrize(("how", "says"), [
    ("toml", "job.toml: pattern.order = 'files': must be one of op, file"),
    ("--set", "--set pattern.order: pattern.order = 'mdtest': must be one of op, file"),
])
def test_a_bad_order_is_one_line_and_exit_2_before_any_io(stampede, tmp_path: Path, how: str,
                                                          says: str) -> None:
    job = small_job(tmp_path, pattern={"order": "files"} if how == "toml" else {})
    extra = ["--set", "pattern.order=mdtest"] if how == "--set" else []
    ran = stampede("run", str(job), *extra)
    assert ran.returncode == 2
    [line] = [line for line in ran.stderr.splitlines() if "error" in line]
    assert says in line, ran.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "ckpt").exists()
