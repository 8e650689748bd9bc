"""bench/cephfs_vs_ior.py's pieces that need no Ceph: mdtest's files made a checkpoint
stampede restores in place (names, places and count unchanged), the open + close pair
rates (mdtest's phase from a real run's trace, and with the index read), and the launcher found for a peer
linked with the venv's MPICH."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stampede.existing.scan import scan

# The benches import their helpers as `common`, from bench/ on sys.path as when run.
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from cephfs_vs_ior import (  # noqa: E402
    MDTEST_ROOT,
    ior_read_rates,
    open_close_rates,
    safetensors_tree,
)
from common import (  # noqa: E402
    VENV_BIN,
    archive_rows,
    mpi_launcher_of,
    mpiexec_command,
    write_job_toml,
)

from stampede.results import trace as traces  # noqa: E402
from stampede.results.archive import sidecar_path  # noqa: E402
from stampede.results.readback import read_trace  # noqa: E402
from stampede.results.trace import trace_path  # noqa: E402

RANKS, ITEMS, TENSOR_BYTES = 2, 7, 4096
IOR = Path("/opt/ior/bin/ior")


def mdtest_tree(parent: Path) -> Path:
    """The tree `mdtest -F -C -n ITEMS` leaves for RANKS ranks (no -u): empty files."""
    leaf = parent / MDTEST_ROOT / "mdtest_tree.0"
    leaf.mkdir(parents=True)
    for rank in range(RANKS):
        for item in range(ITEMS):
            (leaf / f"file.mdtest.{rank}.{item}").touch()
    return parent / MDTEST_ROOT


def test_mdtests_files_become_a_checkpoint_of_exactly_those_files(tmp_path: Path) -> None:
    root = mdtest_tree(tmp_path)
    names_before = sorted(path.name for path in (root / "mdtest_tree.0").iterdir())
    assert safetensors_tree(root, TENSOR_BYTES) == root
    catalogue = scan(str(root))
    assert catalogue.format == "safetensors"
    assert catalogue.index_file == "model.safetensors.index.json"
    assert [relpath for relpath, _ in catalogue.files] == \
        [f"mdtest_tree.0/{name}" for name in names_before]
    assert sorted(path.name for path in (root / "mdtest_tree.0").iterdir()) == names_before
    assert len(catalogue.tensors) == RANKS * ITEMS
    assert {tensor.nbytes for tensor in catalogue.tensors} == {TENSOR_BYTES}
    for relpath, size in catalogue.files:   # 8-byte length, header padded to 8, the data
        header = int.from_bytes((root / relpath).read_bytes()[:8], "little")
        assert header % 8 == 0 and size == 8 + header + TENSOR_BYTES


def test_the_pair_rate_is_one_iterations_opens_over_the_slowest_ranks_own_span(
        tmp_path: Path) -> None:
    """A real traced run (2 ranks, 3 files each, file by file, a warm-up and 2 iterations
    on ext4): the rate is one iteration's opens over the slowest rank's first open to last
    close, read back from the trace's rows; "+index" over the restore row's time."""
    root = safetensors_tree(mdtest_tree(tmp_path / "tree"), TENSOR_BYTES)
    archive = tmp_path / "runs.csv"
    job = write_job_toml(tmp_path / "open.toml", {
        "target": {"path": root}, "checkpoint": {"source": "existing", "assign": ["files"]},
        "pattern": {"ops": ["open", "close"], "order": "file"},
        "run": {"iterations": 2, "warmup": 1, "cache": "warm", "verify": "none"},
        "archive": {"path": archive}})
    subprocess.run(mpiexec_command(RANKS, sys.executable, "-m", "stampede", "run", str(job),
                                   "--trace"), check=True, capture_output=True, timeout=300)
    rows = {row["op"]: row for row in archive_rows(archive)}
    trace = read_trace(trace_path(sidecar_path(archive, rows["open"]["run_id"]))).value
    assert trace is not None
    (layout,) = trace.layouts.values()
    measured = layout[layout[:, traces.ITERATION] >= 0]
    opens = measured[measured[:, traces.OP] == trace.code("open")]
    closes = measured[measured[:, traces.OP] == trace.code("close")]
    assert len(opens) == len(closes) == RANKS * ITEMS * 2
    phases_ns = [max(closes[(closes[:, traces.ITERATION] == it) & (closes[:, traces.RANK] == r),
                            traces.STOP].max()
                     - opens[(opens[:, traces.ITERATION] == it) & (opens[:, traces.RANK] == r),
                             traces.START].min() for r in range(RANKS)) for it in (0, 1)]
    rates = open_close_rates(archive, rows["open"], rows["restore"])
    # 2 iterations: the median of two phases is their mean
    assert rates["open+close/s"] == pytest.approx(RANKS * ITEMS / (sum(phases_ns) / 2 / 1e9))
    assert rates["o+c +index/s"] == pytest.approx(
        RANKS * ITEMS / float(rows["restore"]["time_to_last_rank_s"]))
    # the index read before the first open is in the second span only
    assert rates["o+c +index/s"] < rates["open+close/s"]


def test_a_program_without_mpi_gets_the_venvs_launcher() -> None:
    assert mpi_launcher_of(shutil.which("true") or "/bin/true") == str(VENV_BIN / "mpiexec")


def test_a_program_built_with_the_venvs_mpicc_gets_the_venvs_mpiexec(tmp_path: Path) -> None:
    mpicc = VENV_BIN / "mpicc"
    if not mpicc.exists() or shutil.which("cc") is None:
        pytest.skip("no mpicc in the venv, or no C compiler (apt-get install gcc)")
    source = tmp_path / "hello.c"
    source.write_text("#include <mpi.h>\nint main(int c, char **v) "
                      "{ MPI_Init(&c, &v); MPI_Finalize(); return 0; }\n")
    subprocess.run([str(mpicc), "-o", str(tmp_path / "hello"), str(source)], check=True)
    assert mpi_launcher_of(str(tmp_path / "hello")) == str(VENV_BIN / "mpiexec")


def ior_summary(path: Path, repetitions: list[tuple[float, float, float]]) -> Path:
    """An IOR JSON summary (4.1's shape) of read repetitions (MiB/s, wrRdTime, totalTime)."""
    results = [{"access": "read", "bwMiB": bw, "openTime": 0.0001, "wrRdTime": span,
                "closeTime": 0.0001, "totalTime": total} for bw, span, total in repetitions]
    path.write_text(json.dumps({"tests": [{"Results": results}]}))
    return path


def test_iors_first_repetition_is_its_warm_up_and_the_read_pair_is_its_read_span(
        tmp_path: Path) -> None:
    nbytes = 128 * 2**20   # 128 MiB: 2,560 MiB/s is 0.05 s
    summary = ior_summary(tmp_path / "ior.json", [(1280.0, 0.0999, 0.1),    # the warm-up
                                                  (2560.0, 0.0499, 0.05),
                                                  (2000.0, 0.0636, 0.064),
                                                  (3200.0, 0.0399, 0.04)])
    rates = ior_read_rates(summary, nbytes, "test")
    assert rates["read GB/s"] == pytest.approx(nbytes / 0.0499 / 1e9)       # median of 3 spans
    assert rates["restore GB/s"] == pytest.approx(2560.0 * 2**20 / 1e9)     # median of 3 bw


def test_an_ior_repetition_that_moved_other_bytes_is_refused(tmp_path: Path) -> None:
    summary = ior_summary(tmp_path / "ior.json", [(1280.0, 0.0999, 0.1), (2560.0, 0.0499, 0.05)])
    with pytest.raises(SystemExit, match="moved"):
        ior_read_rates(summary, 64 * 2**20, "test")   # IOR read 128 MiB
    with pytest.raises(SystemExit, match="warm-up"):
        ior_read_rates(ior_summary(tmp_path / "one.json", [(2560.0, 0.0499, 0.05)]),
                       128 * 2**20, "test")


def test_a_real_ior_summary_gives_its_read_span_after_the_warm_up(tmp_path: Path) -> None:
    if not IOR.exists():
        pytest.skip(f"no IOR at {IOR} (bench/cephfs_vs_ior.py --help: how to build it)")
    summary, block = tmp_path / "ior.json", 16 * 2**20
    subprocess.run([str(VENV_BIN / "mpiexec"), "-n", "2", str(IOR), "-a", "POSIX", "-w", "-r",
                    "-k", "-s", "1", "-b", str(block), "-t", "4MiB", "-i", "3",
                    "-o", str(tmp_path / "file"), "-O", "summaryFormat=JSON",
                    "-O", f"summaryFile={summary}"], check=True, capture_output=True,
                   timeout=120)
    reads = [result for result in json.loads(summary.read_text())["tests"][0]["Results"]
             if result["access"] == "read"]
    assert len(reads) == 3
    spans = sorted(2 * block / result["wrRdTime"] / 1e9 for result in reads[1:]
                   if result["wrRdTime"] > 0)
    if len(spans) < 2:
        pytest.skip("IOR printed a read time of 0 (below its 0.1 ms resolution)")
    rates = ior_read_rates(summary, 2 * block, "test")
    assert rates["read GB/s"] == pytest.approx((spans[0] + spans[1]) / 2)
