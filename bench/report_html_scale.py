"""`stampede report ARCHIVE --html` on a 4,200-run archive: this tree against another
checkout of stampede (--before DIR: the code before a change), in one run.

The archive is tests/data/golden's sweep (three rank counts, two layouts, its sidecars)
with its runs copied under new run ids until it holds --runs runs (default 4,200), each
copy's sidecar beside it: the verdict's projection, mttr and the page see thousands of
runs as a season of sweeps would leave them. Each round runs both sides as whole
processes (`python -m stampede report A --html F`, PYTHONPATH the side's tree), the side
that goes first alternating; the table shows the median wall seconds over rounds with
(min-max) and the ratio after / before of each round's pair, median over rounds. Both
pages are compared: a change of the read side must not move a byte (tests/present/
test_golden.py pins the small archives).

    python bench/report_html_scale.py --before /path/to/old/checkout [--runs 4200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
GOLDEN = HERE / "tests" / "data" / "golden" / "archives.tar.xz"


def big_archive(directory: Path, runs: int) -> Path:
    """The golden sweep's runs copied until the archive holds `runs` runs."""
    with tarfile.open(GOLDEN) as packed:
        packed.extractall(directory, filter="data")
    source = directory / "sweep.csv"
    text = source.read_text()
    header, *lines = text.splitlines(keepends=True)
    rows = list(csv.DictReader(io.StringIO(text)))
    run_ids = list(dict.fromkeys(row["run_id"] for row in rows))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    sidecars = directory / "big.runs"
    sidecars.mkdir()
    made = 0
    while made < runs:
        for run_id in run_ids:
            if made == runs:
                break
            copy = f"{run_id}-{made:05d}"
            writer.writerows({**row, "run_id": copy} for row in rows if row["run_id"] == run_id)
            shutil.copyfile(directory / "sweep.runs" / f"{run_id}.json", sidecars / f"{copy}.json")
            made += 1
    path = directory / "big.csv"
    path.write_text(header + out.getvalue())
    return path


def timed(tree: Path, archive: Path, page: Path) -> float:
    environment = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "120"}
    begun = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "stampede", "report", str(archive), "--html",
                           str(page), "--target-ranks", "1024"], capture_output=True,
                          text=True, env=environment, cwd=archive.parent)
    elapsed = time.perf_counter() - begun
    if done.returncode:
        raise SystemExit(f"{tree}: exit {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="another stampede checkout")
    parser.add_argument("--runs", type=int, default=4200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stampede-bench-") as scratch:
        archive = big_archive(Path(scratch), args.runs)
        sides = {"before": args.before.resolve(), "after": HERE}
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        pages = {side: Path(scratch) / f"{side}.html" for side in sides}
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for side in order:
                seconds[side].append(timed(sides[side], archive, pages[side]))
        ratios = [after / before for before, after in zip(seconds["before"], seconds["after"],
                                                           strict=True)]
        same = pages["before"].read_bytes() == pages["after"].read_bytes()
    print(f"report --html of {args.runs:,} runs (1024-rank target), {args.rounds} rounds, "
          "wall seconds per whole process:")
    for side, values in seconds.items():
        print(f"  {side:6s} median {statistics.median(values):7.2f} s "
              f"({min(values):.2f}-{max(values):.2f})  [{sides[side]}]")
    print(f"  after / before: median {statistics.median(ratios):.2f} over rounds; "
          f"pages {'byte-identical' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
