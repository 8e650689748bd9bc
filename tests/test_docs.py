"""The docs: the reference pages are what the code generates now (a stale page fails);
every shell block the docs and the README mark runnable runs, as printed, in a scratch
directory; the site builds with `mkdocs build --strict`; the README stays a short front
door that keeps the two set-up commands."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stampede import docs
from tests.helpers import requires

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# A fenced block right after this comment (blank lines between allowed) is run by the test
# below: mark only what runs in seconds on a laptop without services.
RUNNABLE = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w*)\s*$")
SET_UP = ("python3 -m venv .venv && .venv/bin/pip install -e '.[mpich]' && .venv/bin/stampede demo",
          "python3 -m venv .venv && .venv/bin/pip install -r requirements/test.txt && "
          ".venv/bin/python -m pytest")


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the fence, code) of each fenced block marked runnable in a markdown text."""
    lines, blocks, marked = text.splitlines(), [], False
    number = 0
    while number < len(lines):
        line = lines[number].strip()
        if line == RUNNABLE:
            marked = True
        elif FENCE.match(line):
            end = next(index for index in range(number + 1, len(lines))
                       if lines[index].strip() == "```")
            if marked:
                blocks.append((number + 1, "\n".join(lines[number + 1:end])))
            marked, number = False, end
        elif line:
            marked = False
        number += 1
    return blocks


def _pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


BLOCKS = [(page, line, code) for page in _pages() for line, code in runnable_blocks(page.read_text())]


def test_every_generated_reference_page_is_current() -> None:
    assert docs.stale() == [], "docs/ is stale: run `python -m stampede.docs`"


def test_a_page_edited_by_hand_is_found_stale(tmp_path: Path) -> None:
    for name, page in docs.PAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(page())
    for name in docs.BLOCKS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(docs.DOCS / name, tmp_path / name)
    assert docs.stale(tmp_path) == []
    edited = tmp_path / "reference" / "job-keys.md"
    edited.write_text(edited.read_text().replace("| `run.iterations` |", "| `run.iteration` |"))
    (tmp_path / "reference" / "ops.md").unlink()
    layouts = tmp_path / "concepts" / "layouts.md"
    layouts.write_text(layouts.read_text().replace("| `fan-out` |", "| `fanout` |"))
    assert docs.stale(tmp_path) == ["reference/job-keys.md", "reference/ops.md", "concepts/layouts.md"]
    # its prose is the page's own: only the block is compared
    layouts.write_text(docs.with_block(layouts.read_text(), docs.layouts_block()) + "A new line.\n")
    assert docs.stale(tmp_path) == ["reference/job-keys.md", "reference/ops.md"]
    layouts.write_text(layouts.read_text().replace(docs.BLOCK_END, ""))
    assert docs.stale(tmp_path)[-1] == "concepts/layouts.md", "a page without its markers"


def test_the_generated_pages_hold_every_command_key_column_op_and_layout() -> None:
    from stampede.commands import COMMANDS
    from stampede.layouts import NAMES
    from stampede.ops import OPS_TABLE
    from stampede.results.columns import REGISTRY
    from stampede.spec import OPTIONS

    cli, keys = docs.cli_page(), docs.job_keys_page()
    columns, ops = docs.columns_page(), docs.ops_page()
    assert [name for name in COMMANDS if f"\n## stampede {name}\n" not in cli] == []
    assert [option.key for option in OPTIONS if f"| `{option.key}` |" not in keys] == []
    assert [column.name for column in REGISTRY if f"| `{column.name}` |" not in columns] == []
    assert [op.name for op in OPS_TABLE if f"| `{op.name}` |" not in ops] == []
    assert [name for name in NAMES if f"| `{name}` |" not in docs.layouts_block()] == []
    assert str(REPO) not in cli, "a page names this machine's clone"


def test_runnable_blocks_are_found_as_marked() -> None:
    text = "\n".join(["<!-- runnable -->", "", "```sh", "stampede --help", "```",
                      "```sh", "not marked", "```",
                      "<!-- runnable -->", "a paragraph between", "```sh", "not marked either", "```",
                      "<!-- runnable -->", "```", "stampede mttr", "# a comment", "```"])
    assert runnable_blocks(text) == [(3, "stampede --help"), (15, "stampede mttr\n# a comment")]
    assert [line for page, line, _ in BLOCKS if page == README], "the README's tour is not runnable"


@pytest.mark.slow
@pytest.mark.parametrize(("page", "line", "code"), BLOCKS,
                         ids=[f"{page.relative_to(REPO)}:{line}" for page, line, _ in BLOCKS])
def test_a_runnable_block_runs_as_printed(page: Path, line: int, code: str, tmp_path: Path) -> None:
    """In a scratch directory holding the clone's job files, with the venv's bin/ (its
    stampede and mpiexec) first on PATH and this tree's stampede imported."""
    shutil.copytree(REPO / "jobs", tmp_path / "jobs")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, (f"{page.relative_to(REPO)}:{line}: exit {ran.returncode}\n"
                                 f"{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}")


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path: Path) -> None:
    """Every page in the nav, every link and anchor resolved, ARCHITECTURE.md included."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        requires.unavailable("mkdocs-material is not installed: pip install -r requirements/docs.txt",
                             "DOCS")
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                           cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stderr[-5000:]
    assert (site / "reference" / "cli" / "index.html").is_file()
    architecture = (site / "development" / "architecture" / "index.html").read_text()
    assert "The house" in architecture, "ARCHITECTURE.md was not included"


def test_the_readme_is_a_short_front_door_with_the_two_set_up_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail into docs/"
    assert [command for command in SET_UP if command not in lines] == []
    missing = [link for link in re.findall(r"\]\((docs/[^)#]+)", README.read_text())
               if not (REPO / link).is_file()]
    assert missing == []


def test_the_generator_writes_only_when_asked(tmp_path: Path) -> None:
    """`python -m stampede.docs --help` prints its usage and writes nothing; an argument it
    does not know is refused (exit 2), not taken as a request to regenerate."""
    pages = {path: path.stat().st_mtime_ns for path in (REPO / "docs" / "reference").glob("*.md")}
    for args, status in ((["--help"], 0), (["--wirte"], 2)):
        done = subprocess.run([sys.executable, "-m", "stampede.docs", *args], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == status, done.stdout + done.stderr
        assert "usage: python -m stampede.docs" in done.stdout + done.stderr
    assert {path: path.stat().st_mtime_ns for path in pages} == pages
