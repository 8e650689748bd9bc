"""What an archive reads as, pinned: the terminal report, the HTML page, `compare`, `mttr` and
`project` of six archives (a demo, a rejoin, a traced run, schema 1 and schema 4, a sweep
of three rank counts), byte for
byte, as stampede rendered them when tests/data/golden/ was made. A change to the read side
(stampede.results.opened) must not move a byte; a change meant to move one is blessed:

    PYTHONPATH=. .venv/bin/python tests/present/test_golden.py --bless

and the diff of tests/data/golden/ is the change's evidence. The archives (made by `stampede
demo`, `run --trace`, `rejoin` on three named nodes and `sweep --ranks 1,2,3`) are packed
in archives.tar.xz."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parents[1] / "data" / "golden"
ARCHIVES = GOLDEN / "archives.tar.xz"
ARCHIVE_NAMES = ("demo", "rejoin", "traced", "schema1", "schema4", "sweep")
# name -> the command's arguments; "OUT" is a file it writes, kept beside its output
CASES: dict[str, tuple[str, ...]] = {
    **{f"report-{name}": ("report", f"{name}.csv") for name in ARCHIVE_NAMES},
    **{f"html-{name}": ("report", f"{name}.csv", "--html", "OUT") for name in ARCHIVE_NAMES},
    **{f"mttr-{name}": ("mttr", f"{name}.csv") for name in ARCHIVE_NAMES},
    "report-demo-all": ("report", "demo.csv", "--last", "9"),
    "mttr-demo-target": ("mttr", "demo.csv", "--target-ranks", "1024"),
    "mttr-rejoin-target": ("mttr", "rejoin.csv", "--target-ranks", "1024"),
    "compare-demo-by-layout": ("compare", "demo.csv", "--by", "layout"),
    "compare-demo-traced": ("compare", "demo.csv", "traced.csv", "--match", "op,layout"),
    "compare-schema1-schema4": ("compare", "schema1.csv", "schema4.csv", "--match", "op"),
    "mttr-sweep-target": ("mttr", "sweep.csv", "--target-ranks", "1024"),
    "project-demo": ("project", "demo.csv", "--target-ranks", "1024"),
    "project-sweep": ("project", "sweep.csv", "--target-ranks", "1024"),
}


def unpack(directory: Path) -> None:
    with tarfile.open(ARCHIVES) as packed:
        packed.extractall(directory, filter="data")


def render(directory: Path, name: str) -> dict[str, str]:
    """What `stampede ARGS` said (exit status, stdout, stderr) and the file it wrote."""
    args = [str(directory / f"{name}.html") if arg == "OUT" else arg for arg in CASES[name]]
    environment = {**os.environ, "COLUMNS": "120", "LINES": "60", "NO_COLOR": "1",
                   "TERM": "dumb", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, "-m", "stampede", *args], cwd=directory,
                          capture_output=True, text=True, timeout=120, env=environment)
    found = {f"{name}.txt": f"exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n"
                            f"{done.stderr}".replace(str(directory), "DIR")}
    if "OUT" in CASES[name] and (directory / f"{name}.html").exists():
        found[f"{name}.html"] = (directory / f"{name}.html").read_text()
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_archive_reads_as_it_did(name: str, tmp_path: Path) -> None:
    unpack(tmp_path)
    for file, text in render(tmp_path, name).items():
        assert text == (GOLDEN / file).read_text(), f"{file} moved: bless it if meant to"


def bless() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        unpack(Path(scratch))
        for name in sorted(CASES):
            for file, text in render(Path(scratch), name).items():
                (GOLDEN / file).write_text(text)


if __name__ == "__main__" and sys.argv[1:] == ["--bless"]:
    bless()
