"""`python -m tests.helpers.gc_watch ARGS...`: the stampede CLI with ARGS, its rank's
garbage collections counted, each by where it ran: inside a timed phase (a restore's
pattern, stampede.run.pattern.run_pattern, or a save's, stampede.run.save_pattern's
Save.run, on the stack) or outside. At exit, written as JSON to
$GC_WATCH_DIR/rank-$PMI_RANK.json: {"inside": n, "outside": n}."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
from pathlib import Path
from types import FrameType

TIMED = {("pattern.py", "run_pattern"), ("save_pattern.py", "run")}
counts = {"inside": 0, "outside": 0}


def _timed(frame: FrameType | None) -> bool:
    while frame is not None:
        code = frame.f_code
        if (Path(code.co_filename).name, code.co_name) in TIMED \
                and "stampede" in Path(code.co_filename).parts:
            return True
        frame = frame.f_back
    return False


def _watch(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        counts["inside" if _timed(sys._getframe(0).f_back) else "outside"] += 1


def _write() -> None:
    directory = Path(os.environ["GC_WATCH_DIR"])
    (directory / f"rank-{os.environ.get('PMI_RANK', '0')}.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    from stampede.cli import main

    gc.callbacks.append(_watch)
    atexit.register(_write)
    sys.argv = ["stampede", *sys.argv[1:]]
    sys.exit(main())
