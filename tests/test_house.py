"""The house keeps its shape (ARCHITECTURE.md): imports go down the layers, never up;
what the CLI and every command module import at their top levels is light; no module
grows past 500 lines."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stampede"
# Each folder (or top-level module) and what it may import from stampede, besides itself
# and the bottom (BOTTOM: spec, ops, layouts, targets, values, units, errors, mpi, ...).
BOTTOM = {"spec", "spec_fields", "spec_rules", "ops", "layouts", "targets", "values", "units",
          "errors", "mpi", "launcher", "sysinfo", "filesystems", "lustre", "cephmds", "libcephfs",
          "clibrary", "oploop", "buffers", "bundled", "replicas",
          "dtypes", "__init__", "__version__", "FIRST_LINE_NS"}
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
    "present": {"results", "model", "checkpoint", "run"},
    "commands": {"*"},
    "cli": {"commands", "results", "present"},
    "docs": {"cli", "results"},   # the reference pages' generator, on no command's path
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
        if layer(source) in BOTTOM - {"spec", "spec_fields", "spec_rules"}:
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


# --- layouts and backends as data (stampede.layouts, stampede.targets) ----------------------

DESCRIPTOR_TABLES = {PACKAGE / "layouts.py", PACKAGE / "targets.py"}


def _strings(node: ast.AST) -> set[str]:
    """The string constants a node is, or holds as a literal tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items
            if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _named_tests(tree: ast.AST, names: set[str], subject: tuple[str, ...]) -> list[ast.AST]:
    """Comparisons (==, !=, in, not in) of an expression whose source mentions one of
    `subject` against a literal of `names`, and dict literals keyed by two or more of them."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and \
                len({key.value for key in node.keys if isinstance(key, ast.Constant)} & names) > 1:
            found.append(node)
        if not isinstance(node, ast.Compare) or not all(
                isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        sides = [node.left, *node.comparators]
        if any(_strings(side) & names for side in sides) and \
                any(word in ast.unparse(side) for side in sides for word in subject
                    if not _strings(side)):
            found.append(node)
    return found


def _sources() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(PACKAGE.rglob("*.py"))
            if path not in DESCRIPTOR_TABLES]


def test_no_layout_name_is_compared_outside_its_descriptor() -> None:
    """Callers ask a layout's descriptor (stampede.layouts), never its name: a new layout
    is an entry of the table, not a branch in every module that handles one."""
    from stampede.layouts import NAMES

    wrong = [f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}"
             for path, tree in _sources()
             for node in _named_tests(tree, set(NAMES), ("layout",))]
    assert not wrong, "\n".join(wrong)


def test_no_backend_name_or_scheme_is_tested_outside_the_registry() -> None:
    """Callers ask a backend's capabilities (stampede.targets), never its name or a URL's
    scheme, and trust the contract (no getattr with a default on a backend)."""
    from stampede.targets import REGISTRY

    schemes = set(REGISTRY)
    wrong = []
    for path, tree in _sources():
        if path.parent.name == "backends":   # the backends themselves: their own names
            continue
        where = path.relative_to(PACKAGE)
        wrong += [f"{where}:{node.lineno}: {ast.unparse(node)}"
                  for node in _named_tests(tree, schemes, ("name", "backend", "scheme", "fs_type"))]
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Compare)) else ""
            scheme_list = isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
                len(_strings(node) & schemes) > 1
            prefix = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "startswith" and any(
                    value.endswith("://") for arg in node.args for value in _strings(arg))
            probe = text.startswith("getattr(backend")
            url_test = isinstance(node, ast.Compare) and "://" in _strings(node.left) and \
                "target" in text
            if scheme_list or prefix or probe or url_test:
                wrong.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


KIND_TABLE = PACKAGE / "filesystems.py"
KIND_SUBJECT = ("fs_type", "mount", "kind", "type")


def _kind_tests(tree: ast.AST, names: set[str]) -> list[ast.AST]:
    """A kind's name compared (==, in) with a mount's type, a prefix of one tested
    (startswith("nfs")), and a literal list of two or more kinds' names."""
    found = _named_tests(tree, names, KIND_SUBJECT)
    for node in ast.walk(tree):
        prefix = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr in ("startswith", "endswith") and \
            any(word in ast.unparse(node.func.value) for word in KIND_SUBJECT) and \
            any(name.startswith(value) or name.endswith(value) for arg in node.args
                for value in _strings(arg) for name in names)
        listed = isinstance(node, (ast.Tuple, ast.List, ast.Set)) and \
            len(_strings(node) & names) > 1
        if prefix or listed:
            found.append(node)
    return found


def test_no_file_system_kind_is_compared_outside_its_table() -> None:
    """Callers ask a mount type's entry (stampede.filesystems: evictable, durable_fsync,
    its striper, its counters), never the type's name: a new kind is an entry there."""
    from stampede.filesystems import TABLE

    wrong = [f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}"
             for path, tree in _sources() if path != KIND_TABLE
             for node in _kind_tests(tree, set(TABLE))]
    assert not wrong, "\n".join(wrong)


def test_renderers_live_in_the_top_layer() -> None:
    """rich and matplotlib (terminal tables, figures) are imported in stampede.present
    only: the layers below compute values, the top one draws them."""
    drawers = ("rich", "matplotlib")
    wrong = [f"{path.relative_to(PACKAGE)}:{node.lineno}"
             for path in PACKAGE.rglob("*.py") if path.parent.name != "present"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                 name.split(".")[0] in drawers for name in
                 ([node.module or ""] if isinstance(node, ast.ImportFrom)
                  else [alias.name for alias in node.names]))]
    assert not wrong, "\n".join(wrong)


# --- the read side: one way in (stampede.results.archived, issue 36) -----------------------

# What reads an archive's files: the CSV, a sidecar, a trace, their paths.
FILE_READERS = {"read_rows", "read_text", "read_bytes", "read_sidecar", "read_trace",
                "sidecar_path", "sidecar_dir", "trace_path", "load_sidecar"}


def _names(path: Path) -> set[tuple[str, int]]:
    """Every name a module uses or imports, with its line."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.add((node.id, node.lineno))
        elif isinstance(node, ast.Attribute):
            found.add((node.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            found.update((alias.name, node.lineno) for alias in node.names)
    return found


def test_model_and_present_take_data_never_paths() -> None:
    """The model and the presenters read no file: they are handed an Archive (its rows,
    sidecars and traces), opened once at the command's edge."""
    wrong = [f"{path.relative_to(PACKAGE)}:{line}: {name}"
             for folder in ("model", "present") for path in sorted((PACKAGE / folder).glob("*.py"))
             for name, line in _names(path) if name in FILE_READERS]
    assert not wrong, "\n".join(sorted(wrong))


def test_an_archive_is_parsed_in_one_place() -> None:
    """read_rows (the CSV parsed) is called by Archive.open alone: no command reads an
    archive its own way, or twice."""
    mine = {PACKAGE / "results" / "archive.py", PACKAGE / "results" / "archived.py"}
    wrong = [f"{path.relative_to(PACKAGE)}:{line}"
             for path in sorted(PACKAGE.rglob("*.py")) if path not in mine
             for name, line in _names(path) if name == "read_rows"]
    assert not wrong, "\n".join(sorted(wrong))


def test_a_row_is_typed_in_one_place() -> None:
    """Readers get rows typed when the Archive opens (stampede.results.cells.typed): none
    reads a true/false cell as its text again ("true" is a bool there, and a string is
    always truthy)."""
    readers = [*(PACKAGE / "model").rglob("*.py"), *(PACKAGE / "present").rglob("*.py"),
               *(PACKAGE / "results" / name for name in ("compare.py", "loaders.py",
                                                         "archived.py"))]
    as_text = re.compile(r"""\]\s*[!=]=\s*["'](true|false)["']""")
    wrong = [f"{path.relative_to(PACKAGE)}:{number}" for path in sorted(readers)
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if as_text.search(line)]
    assert not wrong, "\n".join(wrong)


# --- honest types (stampede.mpi.Comm, no Any where the type is known) ----------------------

# Lines of stampede/ that say Any (as `grep -rn '\bAny\b' stampede` counts them): 627 before the
# Comm protocol; what is left is mostly JSON documents (manifest, sidecar), the torch, h5py and
# botocore objects of optional libraries, the parser's subparsers and the Backend protocol's
# paths and handles (their type is the backend's own). Lower it when you remove some; never
# raise it.
ANY_CEILING = 149
COMM_ANY = re.compile(r"\bcomm: Any\b")


def test_any_stays_under_its_ceiling() -> None:
    lines = [line for path in PACKAGE.rglob("*.py") for line in path.read_text().splitlines()
             if re.search(r"\bAny\b", line)]
    assert len(lines) <= ANY_CEILING, f"{len(lines)} lines say Any, the ceiling is {ANY_CEILING}"


def test_no_communicator_is_any() -> None:
    """Every communicator is a stampede.mpi.Comm (the methods stampede calls, which
    mpi4py's MPI.Comm and mpi.SingleRank's size-1 paths provide)."""
    wrong = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
             if COMM_ANY.search(path.read_text())}
    assert not wrong, "\n".join(sorted(wrong))


# --- no import circles (issue 36) ---------------------------------------------------------



def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each stampede module and the stampede modules it imports: every `import` and `from`
    statement, at the top level, inside functions and under `if TYPE_CHECKING:` alike (a
    deferred import still ties the two modules); `from package import module` is that module."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in paths:
                found.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths
                             else node.module for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in paths)
        graph[name] = found - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm):
    each is one circle, however many import statements tie it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while not component or module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                cycles.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [{"a", "b", "c"}]


def test_no_module_imports_itself_back() -> None:
    """No import circle among stampede's modules: a type or constant two modules share lives
    in the one both import (STYLE: a role's shared types in one small module)."""
    graph = import_graph()
    wrong = [" <-> ".join(sorted(cycle)) + ": " + "; ".join(
                 f"{source} imports {', '.join(sorted(graph[source] & cycle))}"
                 for source in sorted(cycle))
             for cycle in import_cycles(graph)]
    assert not wrong, "\n".join(wrong)


def test_a_number_a_person_reads_is_never_in_e_notation() -> None:
    """Numbers are formatted by stampede.units (format_plain, format_seconds, ...), never
    with a bare `:.3g` or `:e` spec: `.3g` writes 1.1e+02 once a value passes 999 (a
    count of the reads' requests did, in the verdict's notes), and no person reads that."""
    spec = re.compile(r"\.[0-9]+[gGeE]$")   # a bare :g only for values echoed back
    wrong = [f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}"
             for path, tree in _sources() if path.name != "units.py"
             for node in ast.walk(tree)
             if isinstance(node, ast.FormattedValue) and node.format_spec is not None
             and spec.search(ast.unparse(node.format_spec).strip("f'\""))]
    assert not wrong, "\n".join(wrong)
