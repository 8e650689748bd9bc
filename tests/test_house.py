"""The house keeps its shape (ARCHITECTURE.md): imports go down the layers, never up;
what the CLI and every command module import at their top levels is light; no module
grows past 500 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stampede"
# Each folder (or top-level module) and what it may import from stampede, besides itself
# and the bottom (spec, ops, values, units, errors, mpi, launcher, sysinfo, buffers, bundled).
BOTTOM = {"spec", "spec_rules", "ops", "values", "units", "errors", "mpi", "launcher", "sysinfo", "buffers",
          "bundled", "dtypes", "__init__", "__version__", "FIRST_LINE_NS"}
MAY_IMPORT = {
    "__main__": {"cli"},
    "results": set(),
    "backends": {"results"},
    "checkpoint": {"backends", "results"},
    "existing": {"checkpoint", "backends", "results"},
    "run": {"checkpoint", "existing", "backends", "results"},
    "model": {"results"},
    "emulate": {"results"},
    "sbatch": set(),
    "commands": {"*"},
    "cli": {"commands", "results"},
}
HEAVY = ("numpy", "rich", "mpi4py", "fsspec", "botocore", "h5py", "torch", "matplotlib")


def stampede_imports(path: Path) -> set[str]:
    """The stampede modules a file imports (top level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stampede"):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(names if node.module == "stampede" else [node.module])
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("stampede"))
    return {name.removeprefix("stampede.").removeprefix("stampede") for name in found} - {""}


def layer(module: str) -> str:
    return module.split(".")[0]


def allowed(source: str, target: str) -> bool:
    mine, theirs = layer(source), layer(target)
    if theirs in BOTTOM or mine == theirs:
        return True
    rules = MAY_IMPORT.get(mine, set())
    return "*" in rules or theirs in rules or target in rules


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        source = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        if layer(source) in BOTTOM - {"spec", "spec_rules"}:
            continue
        for target in stampede_imports(path):
            if not allowed(source, target):
                wrong.append(f"{source} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_bottom_imports_nothing_above_it() -> None:
    wrong = [f"{path.name} imports {target}" for path in PACKAGE.glob("*.py")
             if path.stem in BOTTOM for target in stampede_imports(path)
             if layer(target) not in BOTTOM]
    assert not wrong, "\n".join(wrong)


def test_the_cli_and_every_command_module_import_light() -> None:
    code = ("import sys, importlib; from stampede.commands import COMMANDS; import stampede.cli; "
            "[importlib.import_module(m) for m in set(COMMANDS.values())]; "
            f"print(' '.join(sorted(n for n in sys.modules if n.split('.')[0] in {HEAVY!r})))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "", f"imported at the top: {loaded.stdout}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_module_grows_past_500_lines(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= 500
