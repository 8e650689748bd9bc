"""IOR's per-op record read as a trace (stampede.results.ior_ops), from real IOR 4.1
output made here: `mpiexec -n 2 ior -a POSIX -w -b 8m -t 1m -F -e -o F
-O savePerOpDataCSV=ops.csv` (tests/data/ior-4.1-perop/: a file per rank, 8 transfers
each); and `stampede analyze` on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from stampede.results import trace as traces
from stampede.results.ior_ops import ior_trace, is_ior_ops

DATA = Path(__file__).resolve().parents[1] / "data" / "ior-4.1-perop"
FILES = sorted(DATA.glob("ops.csv-0-*.csv"))
MiB = 2**20


def test_each_transfer_is_an_op_of_its_rank_with_its_bytes() -> None:
    assert len(FILES) == 2 and all(is_ior_ops(path) for path in FILES)
    trace = ior_trace(FILES, "write")
    rows = trace.layouts["ior"]
    writes = rows[rows[:, traces.OP] == trace.code("write")]
    assert len(writes) == 16 and sorted(set(writes[:, traces.RANK].tolist())) == [0, 1]
    assert (writes[:, traces.NBYTES] == MiB).all()           # tp x runtime: the transfer size
    assert (writes[:, traces.STOP] > writes[:, traces.START]).all()
    assert traces.op_counts(trace, rows) == {"write": 16, "save": 2}
    for rank in (0, 1):                                      # one after another on each rank
        mine = writes[writes[:, traces.RANK] == rank]
        assert (np.diff(mine[:, traces.START]) > 0).all()
    times = traces.rank_times(trace, rows)
    assert [t.done_ns for t in times] == [int(writes[writes[:, traces.RANK] == r, traces.STOP].max())
                                          for r in (0, 1)]
    most = max(s.inside_max for s in traces.segments(trace, rows, 10))
    assert most == 2                                         # never more ranks than there are


def test_a_damaged_file_is_named_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "ops.csv-0-00000.csv"
    shutil.copy(FILES[0], bad)
    with open(bad, "a") as stream:
        stream.write("1.0,oops,3\n")
    with pytest.raises(ValueError, match=r"line 10: .* is not three numbers"):
        ior_trace([bad], "write")


@pytest.mark.parametrize(("args", "said"), [
    ([], "--ior-op read or --ior-op write"),
    (["README.md", "--ior-op", "write"], "not IOR per-op files"),
])
def test_analyze_reads_them_and_refuses_what_it_cannot(stampede, tmp_path: Path,
                                                       args: list[str], said: str) -> None:
    shutil.copy(Path(__file__).resolve().parents[2] / "README.md", tmp_path / "README.md")
    refused = stampede("analyze", *map(str, FILES), *args)
    assert refused.returncode == 2 and said in " ".join(refused.stderr.split())
    done = stampede("analyze", *map(str, FILES), "--ior-op", "write", "--chrome",
                    str(tmp_path / "ior.json"))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "2 ranks on 1 node(s); ior" in text and "most ranks inside a storage op at once: 2" in text
    assert (tmp_path / "ior.json").stat().st_size > 0
