"""`stampede report ARCHIVE --html FILE --png DIR`: one call prints the terminal report and
writes the HTML page and the PNG figures, byte for byte what the old commands (`html`,
`plot`, kept as aliases with a note) write; bad input is refused before anything is
printed or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import requires
from tests.helpers.jobs import small_job
from tests.helpers.verdicts import cli

KINDS = ("cdf", "scaling", "timeline")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run (one rank, both layouts) and its sidecar."""
    directory = tmp_path_factory.mktemp("report")
    job = small_job(directory)
    for step in ("prepare", "run"):
        cli(step, str(job), cwd=directory)
    return directory / "results" / "job.csv"


def test_report_prints_and_writes_the_page_and_the_figures(archive: Path, tmp_path: Path) -> None:
    requires.module("matplotlib", "PLOT", "pip install -e '.[plot]'")
    alone = cli("report", str(archive), cwd=tmp_path).stdout
    page, figures = tmp_path / "page.html", tmp_path / "figures"
    done = cli("report", str(archive), "--html", str(page), "--png", str(figures),
               "--target-ranks", "64", cwd=tmp_path)
    assert done.stdout.startswith(alone)   # the terminal report first, as without the flags
    written = [line for line in done.stdout[len(alone):].splitlines() if line.startswith("wrote")]
    assert sorted(written) == sorted([f"wrote {page}",
                                      *(f"wrote {figures / f'job-{kind}.png'}" for kind in KINDS)])
    assert "workload: the job's checkpoint as archived, 64 ranks" in done.stdout
    for kind in KINDS:
        assert (figures / f"job-{kind}.png").read_bytes()[:8] == PNG_SIGNATURE
    # the old commands: the same bytes, and a note naming the new way
    html = cli("html", str(archive), "-o", str(tmp_path / "old.html"), "--target-ranks", "64",
               cwd=tmp_path)
    assert html.stderr == ("stampede html: note: this is `stampede report ARCHIVE --html FILE` "
                           "now; `html` stays as its alias\n")
    assert (tmp_path / "old.html").read_bytes() == page.read_bytes()
    (tmp_path / "old").mkdir()   # -o names files: their directory must exist (--png DIR is made)
    plot = cli("plot", str(archive), "-o", str(tmp_path / "old" / "job.png"), cwd=tmp_path)
    assert plot.stderr.startswith("stampede plot: note: this is `stampede report ARCHIVE --png "
                                  "DIR` now; `plot` stays as its alias\n")
    for kind in KINDS:
        old = tmp_path / "old" / f"job-{kind}.png"
        assert old.read_bytes() == (figures / f"job-{kind}.png").read_bytes(), kind


@pytest.mark.parametrize("args, message", [
    (["--html", "{archive}"], "--html {archive}: is the archive"),
    (["--png", "{sidecars}/figures"], "--png {sidecars}/figures: lies inside {sidecars}"),
    (["--html", "x.html", "--target-ranks", "0"], "argument --target-ranks: 0: must be from 1"),
    (["--html", "x.html", "--target-size", "lots"], "argument --target-size: 'lots' is not"),
])
def test_bad_input_is_refused_before_anything_is_printed_or_written(
        stampede, archive: Path, tmp_path: Path, args: list[str], message: str) -> None:
    requires.module("matplotlib", "PLOT", "pip install -e '.[plot]'")
    before = sorted(path.name for path in archive.parent.rglob("*"))
    names = {"archive": archive, "sidecars": archive.with_suffix(".runs")}
    done = stampede("report", str(archive), *(arg.format(**names) for arg in args))
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert message.format(**names) in " ".join(done.stderr.split()), done.stderr
    assert done.stderr.count("error:") == 1
    assert sorted(path.name for path in archive.parent.rglob("*")) == before
    assert not (tmp_path / "x.html").exists()
