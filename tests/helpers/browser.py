"""A real headless browser for the HTML report's tests: Debian's chromium, told to load a
local file and to log its console to stderr (a CSP violation, a script error and a
blocked request all land there as CONSOLE lines); and its screenshots (Pillow): the
page's height and a tolerant comparison with a reference."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers import requires

BROWSER_TIMEOUT_S = 60
NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str:
    """The browser's path; unavailable() (skip, or fail under STAMPEDE_REQUIRE_BROWSER=1)."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    requires.unavailable("no chromium on PATH: apt-get install -y chromium", "BROWSER")


def headless(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """chromium --headless on the file, its console on stderr. --no-sandbox: CI runs as
    root, where chromium refuses its sandbox; the page is our own local file."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
               "--v=0", "--no-first-run", "--disable-extensions", *flags, page.resolve().as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S,
                          cwd=page.parent)


def console_lines(stderr: str) -> list[str]:
    """What the page said on its console (errors, CSP violations, blocked loads)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


# ---- screenshots: the page's height and a tolerant comparison with a reference ------------

WHITE_ABOVE = 250        # a row with a pixel darker than this holds something drawn
THUMBNAIL_SCALE = 4      # references are kept this much smaller (grey, a few tens of kB)


def screenshot(page: Path, width_px: int, height_px: int, shot: Path) -> Any:
    """The page at width_px in a window height_px tall, as a Pillow image (RGB)."""
    from PIL import Image

    done = headless(page, f"--screenshot={shot}", f"--window-size={width_px},{height_px}",
                    "--hide-scrollbars")
    assert shot.is_file(), done.stderr
    return Image.open(shot).convert("RGB")


def content_height(image: Any) -> int:
    """Pixels from the top to the last row with anything drawn on it (the window must be
    taller than the page: a page that fills it reports the window's height)."""
    grey = image.convert("L")
    width, height = grey.size
    rows = [y for y in range(height)
            if grey.crop((0, y, width, y + 1)).getextrema()[0] < WHITE_ABOVE]
    return rows[-1] + 1 if rows else 0


def thumbnail(image: Any, top_px: int) -> Any:
    """The first top_px rows (white below a shorter page), grey, THUMBNAIL_SCALE smaller:
    what a reference keeps."""
    from PIL import Image

    width = image.size[0]
    canvas = Image.new("RGB", (width, top_px), "white")
    canvas.paste(image.crop((0, 0, width, min(top_px, image.size[1]))), (0, 0))
    return canvas.convert("L").resize((width // THUMBNAIL_SCALE, top_px // THUMBNAIL_SCALE),
                                      Image.Resampling.BOX)


def difference(image: Any, reference: Any) -> float:
    """Mean absolute difference (0-255) of two thumbnails, each blurred first: text whose
    digits differ from run to run barely counts, a block moved or gone counts fully."""
    from PIL import ImageChops, ImageFilter, ImageStat

    if image.size != reference.size:
        image = image.resize(reference.size)
    blurred = [picture.filter(ImageFilter.GaussianBlur(2)) for picture in (image, reference)]
    return float(ImageStat.Stat(ImageChops.difference(*blurred)).mean[0])
