"""The op table (stampede.ops) is the one place an op is declared: its codes never change
(traces and sidecars hold them), every op the code times or compares is in it, and the
archive README's op section is generated from it."""

from __future__ import annotations

import ast
from pathlib import Path

from stampede import ops
from stampede.bundled import RESULTS_README

PACKAGE = Path(__file__).resolve().parents[1] / "stampede"
# The codes as traces and sidecars written before the table hold them: a code is never
# changed or reused, new ops go at the end.
WRITTEN_CODES = (
    "jitter", "list", "index", "stat", "open", "header", "read", "ttfb", "close", "wait",
    "bcast", "allgather", "verify", "restore", "interpreter", "import", "mpi_init", "startup",
    "pin", "h2d", "barrier", "allreduce", "snapshot", "mkdir", "create", "write", "fsync",
    "rename", "fsync_dir", "validate", "publish", "unlink", "rmdir", "blocked", "save",
    "published", "plan", "load", "deserialise", "touch", "pg_init", "bcast_first",
    "allgather_first", "d2h")
KINDS = {"delay", "storage", "part", "wait", "network", "check", "pseudo", "startup", "device",
         "copy", "loader", "setup"}
PHASES = {"restore", "save", "startup", "gpu", "loaders"}


def test_codes_are_positions_and_never_change() -> None:
    assert [op.code for op in ops.OPS_TABLE] == list(range(len(ops.OPS_TABLE)))
    assert ops.OPS[:len(WRITTEN_CODES)] == WRITTEN_CODES
    assert len(set(ops.OPS)) == len(ops.OPS)


def test_every_op_states_its_facts_in_known_words() -> None:
    for op in ops.OPS_TABLE:
        assert op.kind in KINDS, op
        assert op.phases and set(op.phases) <= PHASES, op
        assert op.timeline in ("", *ops.TIMELINE_COLOURS), op
        assert op.unit in ("", "ops/s"), op
        assert op.definition and "\n" not in op.definition, op
    assert set(ops.SAVE_ORDER) <= set(ops.OPS)
    # every op on the timeline is drawn in one phase, and every phase has ops
    assert sorted(name for names in ops.TIMELINE_PHASES.values() for name in names) == \
        sorted(op.name for op in ops.OPS_TABLE if op.timeline)
    assert all(ops.TIMELINE_PHASES.values())


def _op_like(node: ast.expr) -> bool:
    """`op`, `x.op`, `x.completion_op`, `row["op"]`: an expression holding an op's name."""
    if isinstance(node, ast.Name):
        return node.id in ("op", "completion_op")
    if isinstance(node, ast.Attribute):
        return node.attr in ("op", "completion_op")
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value == "op")


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [text for element in node.elts for text in _strings(element)]
    return []


def ops_named_in(tree: ast.AST) -> set[str]:
    """Op names the code looks up or compares: OP_CODE["x"], OPS.index("x"), trace.code("x"),
    OP_CODE[name] for name in ("x", ...), op == "x", row["op"] in ("x", "y")."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == "OP_CODE":
            found.update(_strings(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("index", "code") and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in ("OPS", "trace", "self") and node.args:
            found.update(_strings(node.args[0]))
        elif isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)) and \
                isinstance(node.elt, ast.Subscript) and isinstance(node.elt.value, ast.Name) \
                and node.elt.value.id == "OP_CODE":
            for generator in node.generators:
                found.update(_strings(generator.iter))
        elif isinstance(node, ast.Compare) and _op_like(node.left):
            for comparator in node.comparators:
                found.update(_strings(comparator))
    return found


def test_every_op_the_code_names_is_in_the_table() -> None:
    named = {path.relative_to(PACKAGE).as_posix(): ops_named_in(ast.parse(path.read_text()))
             for path in PACKAGE.rglob("*.py")}
    missing = {f"{path}: {name}" for path, names in named.items() for name in names
               if name not in ops.OPS}
    assert not missing, "ops used in code but missing from stampede/ops.py:\n" + \
        "\n".join(sorted(missing))
    # the scan sees what it must, so this test can fail: the pattern's, the save's and
    # the clock's ops
    seen = set().union(*named.values())
    assert {"stat", "read", "create", "publish", "restore", "save", "pg_init"} <= seen


def test_the_scan_finds_an_op_missing_from_the_table() -> None:
    code = ('X = OP_CODE["scrub"]\nY = [OP_CODE[n] for n in ("trim", "read")]\n'
            'if row["op"] in ("gossip", "stat"): pass\n')
    assert ops_named_in(ast.parse(code)) - set(ops.OPS) == {"scrub", "trim", "gossip"}


def test_the_readme_op_section_is_current() -> None:
    text = RESULTS_README.read_text()
    assert ops.readme_with_section(text) == text, \
        "results/README.md's op section is stale: run `python -m stampede.ops`"
    for op in ops.OPS_TABLE:
        assert f"| `{op.name}` | {op.code} |" in text
