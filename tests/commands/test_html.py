"""`stampede html`: a real sweep's archive (1, 2 and 3 ranks under the venv's mpiexec) as
one self-contained file whose verdict is what `stampede project` and `stampede mttr` say
by hand; an old archive (schema 1, no sidecar) and imported IOR and mdtest rows get a
report too; and a real headless chromium renders it: a screenshot, the DOM (the verdict,
every figure), no console error, no request leaving the file."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.helpers import browser
from tests.helpers.verdicts import URL, cli, hand_verdict, verdict_of

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def swept(assessed: Path) -> Path:
    """The archive of a real sweep at 1, 2 and 3 ranks (conftest's `assessed`)."""
    return assessed.with_suffix(".csv")


@pytest.mark.mpi
def test_the_verdict_is_what_project_and_mttr_say_by_hand(swept: Path) -> None:
    output = swept.parent / "by-html.html"
    cli("html", str(swept), "-o", str(output), cwd=swept.parent)
    page = output.read_text()
    layout, mttr_s = verdict_of(page)
    hand_layout, hand_mttr_s = hand_verdict(swept)
    assert layout == hand_layout
    assert mttr_s == hand_mttr_s                # the same float, printed the same way
    for section in ("verdict", "restore", "figures", "warnings", "context", "definitions"):
        assert f'id="{section}"' in page, section
    assert page.count('<svg class="figure"') >= 1 + 2 + 2   # scaling, CDFs, a timeline per layout
    for phase in ("metadata", "read", "verify"):   # the timeline's phases, in their colours
        assert f"{phase} " in page and "<details>" in page
    assert not URL.search(page) and "Content-Security-Policy" in page


@pytest.mark.mpi
def test_an_old_archive_and_imported_rows_get_a_report(swept: Path) -> None:
    rows = list(csv.DictReader(swept.open()))
    old = swept.parent / "old.csv"   # schema 1's columns (no phase), and no sidecar
    columns = [c for c in rows[0] if c not in ("phase", "retries", "unprotected_s", "fanout")]
    with old.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**row, "schema": "1"} for row in rows)
    cli("html", str(old), cwd=swept.parent)
    page = old.with_suffix(".html").read_text()
    assert verdict_of(page)[0] == hand_verdict(swept)[0]   # the same rows, the same answer
    assert "no readable sidecar" in page and "Scaling of the restore" in page
    imported = swept.parent / "imported.csv"
    cli("import", "ior", str(DATA / "ior-4.1-read-F-n2-warm.json"), "--archive", str(imported),
        cwd=swept.parent)
    cli("import", "mdtest", str(DATA / "mdtest-4.1-n2-CTr.txt"), "--archive", str(imported),
        cwd=swept.parent)
    cli("html", str(imported), cwd=swept.parent)
    page = imported.with_suffix(".html").read_text()
    assert 'id="verdict"' in page and "nothing to rank" in page
    assert ">ior<" in page and ">file_creation<" in page and "no readable sidecar" not in page


@pytest.mark.mpi
def test_a_real_browser_renders_it_whole_and_offline(swept: Path) -> None:
    browser.chromium()
    page = swept.parent / "browser.html"
    cli("html", str(swept), "-o", str(page), cwd=swept.parent)
    figures = page.read_text().count('<svg class="figure"')
    shot = swept.parent / "shot.png"
    screenshot = browser.headless(page, f"--screenshot={shot}", "--window-size=412,3000")
    assert shot.stat().st_size > 20_000, screenshot.stderr          # a phone-wide page, drawn
    dom = browser.headless(page, "--dump-dom")
    assert 'id="verdict"' in dom.stdout and "restore: use " in dom.stdout
    assert dom.stdout.count('<svg class="figure"') == figures >= 5   # every figure parsed
    assert dom.stdout.count("<title>") >= figures + 1
    assert not URL.search(dom.stdout)
    assert browser.console_lines(screenshot.stderr + dom.stderr) == []
    # the check sees what it must: a page that fetches and scripts is reported
    bad = swept.parent / "bad.html"
    bad.write_text(page.read_text().replace("</body>", '<img src="http://example.invalid/x.png">'
                                            "<script>console.error('boom')</script></body>"))
    lines = browser.console_lines(browser.headless(bad, "--dump-dom").stderr)
    assert any("example.invalid" in line for line in lines), lines


@pytest.mark.mpi
def test_a_save_then_a_restore_get_the_figures_of_both(stampede, tmp_path: Path) -> None:
    """`stampede save` then `stampede run` of what it published are two runs, and their
    sidecars differ (a save's layouts under "saves"): the report draws each phase's CDFs
    and timelines from the run its verdict ranks, and lists both runs' warnings."""
    from tests.helpers.jobs import small_job

    job = small_job(tmp_path, checkpoint={"size": "4MiB"}, run={"iterations": 2, "warmup": 0},
                    save={"validate": "none"})
    for command in ("save", "run"):
        done = stampede(command, str(job), np=2)
        assert done.returncode == 0, done.stdout + done.stderr
    archive = tmp_path / "results" / "job.csv"
    output = tmp_path / "both.html"
    cli("html", str(archive), "-o", str(output), cwd=tmp_path)
    page = output.read_text()
    assert "Latency CDF: save write" in page and "Latency CDF: restore read" in page
    assert "Timeline: save " in page and "Timeline: restore " in page
    assert "no sidecar with statistics" not in page
    # the save's own table, as the terminal's (it once was the restore's: no published,
    # blocked or unprotected, a storage part longer than the time to last rank)
    save = page[page.index('id="save"'):page.index('id="figures"')]
    for header in ("durable, last rank (min-max)", "published", "blocked", "unprotected",
                   "validate errors"):
        assert f"<th>{header}</th>" in save, header
    assert "storage part" not in save and "until training could go on" in save
