"""Install hints say what works for the install at hand: a clone's own path, else the
package with its extra."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from stampede.errors import install_hint

REPO = Path(__file__).resolve().parents[1]


def test_from_a_clone_the_hint_names_the_clone() -> None:
    assert install_hint("s3") == f"pip install -e '{REPO}[s3]'"


def test_from_an_install_the_hint_names_the_package(tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(tmp_path / "copy.zip", "w") as archive:   # the package alone
        for path in (REPO / "stampede").rglob("*.py"):
            archive.write(path, path.relative_to(REPO))
    with zipfile.ZipFile(tmp_path / "copy.zip") as archive:
        archive.extractall(site)
    shown = subprocess.run([sys.executable, "-P", "-c", "from stampede.errors import "
                            "install_hint; print(install_hint('plot'))"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(site)})
    assert shown.stdout.strip() == "pip install 'stampede[plot]'", shown.stderr
