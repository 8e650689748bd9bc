"""The target's scale costs nothing: `stampede project`, `mttr` and `report --html` at 4 to
10^9 target nodes (8 ranks each) from one synthetic archive (the model's own runs at 1 to
128 ranks, tests/model/test_project.py's), each command's wall time per node count.

Each layout's traffic is counted in closed form (stampede.model.traffic), so the time is
the command's start-up and fit, flat in the node count; it once walked every node and rank
and never finished at 10^9 nodes. Output: one line per command and node count, and PASS
when every command at every count exited 0 within --limit-s (default 5 s).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.commands.test_target_flags import measured_archive  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit-s", type=float, default=5.0)
    args = parser.parse_args()
    worst, failed = 0.0, 0
    with tempfile.TemporaryDirectory() as scratch:
        archive = measured_archive(Path(scratch))
        for nodes in (4, 10**3, 10**6, 10**9):
            target = ["--target-ranks", str(8 * nodes), "--target-ranks-per-node", "8"]
            for command in (["project", str(archive)], ["mttr", str(archive)],
                            ["report", str(archive), "--html", f"{scratch}/r.html"]):
                started = time.monotonic()
                done = subprocess.run([sys.executable, "-m", "stampede", *command, *target],
                                      capture_output=True, text=True, cwd=scratch)
                took = time.monotonic() - started
                worst = max(worst, took)
                failed += done.returncode != 0
                print(f"{command[0]:8s} {nodes:>13,} nodes: {took:6.2f} s (exit {done.returncode})")
    verdict = "PASS" if worst <= args.limit_s and not failed else "FAIL"
    print(f"{verdict}: the slowest {worst:.2f} s (limit {args.limit_s:g} s), {failed} failed")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
