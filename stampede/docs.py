"""The docs site's reference pages (docs/reference/*.md), generated from the code that
defines what they describe: the CLI from its argparse parsers, the job keys from
spec.OPTIONS, the archive's columns and ops from their tables (the generators that also
write results/README.md's sections), the sidecar from its JSON Schema. A page elsewhere
may hold one generated block between BLOCK_BEGIN and BLOCK_END (docs/concepts/layouts.md's
table, from layouts.TABLE). Nothing is written by hand there, so nothing drifts:
tests/test_docs.py regenerates every page and block in memory and fails when a file differs.

    python -m stampede.docs            # rewrite docs/reference/ in a clone
    python -m stampede.docs --check    # list the stale pages, exit 1 if any

Not on the CLI's import path (it imports every command's parser): tests/test_house.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stampede import layouts, ops, spec
from stampede.cli import build_parser
from stampede.results import columns

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
# argparse wraps help to the terminal (COLUMNS): fixed here so a page is the same on
# every machine
HELP_COLUMNS = "100"


def _header(title: str, source: str) -> list[str]:
    return [f"# {title}", "",
            f"<!-- generated from {source} by `python -m stampede.docs`; do not edit -->", ""]


def cli_page() -> str:
    """`stampede --help` and every command's --help, as the parsers print them."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = build_parser(["--help"])   # --help: every command's module registered
        subparsers = next(action for action in parser._actions
                          if isinstance(action, argparse._SubParsersAction))
        helps = [("stampede", parser.format_help())]
        helps += [(f"stampede {name}", sub.format_help()) for name, sub in subparsers.choices.items()]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    # an install hint names this clone's path (pip install -e 'CLONE[plot]'): "." on the page
    helps = [(name, text.replace(str(REPO), ".")) for name, text in helps]
    lines = _header("Command line", "the argparse parsers of stampede/commands/")
    lines += ["Every command's `--help`, as it prints. Commands: " +
              ", ".join(f"[`{name.removeprefix('stampede ')}`](#{_anchor(name)})"
                        for name, _ in helps[1:]) + ".", ""]
    for name, text in helps:
        lines += [f"## {name}", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def _anchor(heading: str) -> str:
    """The id mkdocs' toc gives a heading of plain words (lower case, spaces as -)."""
    return "-".join("".join(c for c in heading.lower() if c.isalnum() or c in " -_").split())


def _default(option: spec.Option) -> str:
    if option.default is spec.REQUIRED:
        return "required"
    if option.default in ("", {}, (), []):
        return "(unset)"
    return f"`{json.dumps(option.default) if not isinstance(option.default, str) else option.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def job_keys_page() -> str:
    """Every job key (TOML key, `--set` name) of spec.OPTIONS, by section."""
    lines = _header("Job keys", "spec.OPTIONS (stampede/spec.py)")
    lines += ["A job file is TOML: `[section]` tables of `key = value`. Every key can be given "
              "on the command line too, `--set section.key=value` (after the job file's), and "
              "is repeated in every archive row, in the column named. `stampede run --help` "
              "prints the same list.", ""]
    sections: dict[str, list[spec.Option]] = {}
    for option in spec.OPTIONS:
        sections.setdefault(option.key.split(".")[0], []).append(option)
    for section, options in sections.items():
        lines += [f"## [{section}]", "", "| key | default | column | meaning |", "|---|---|---|---|"]
        lines += [f"| `{option.key}` | {_cell(_default(option))} | {_column_of(option)} | "
                  f"{_cell(option.help)} |" for option in options]
        lines.append("")
    return "\n".join(lines)


def _column_of(option: spec.Option) -> str:
    """An option's column, or the one its value is folded into (spec.FOLDED)."""
    folded = spec.FOLDED.get(option.key)
    return f"in `{folded}`" if folded else f"`{option.column}`"


def columns_page() -> str:
    """The archive's columns: results/README.md's generated section, as a page."""
    lines = _header("Archive columns", "stampede/results/columns.py")
    lines += ["One CSV row per (run, phase, layout, op); the [archive](archive.md) says how "
              "rows are written and [ops](ops.md) what each `op` value times.", ""]
    return "\n".join(lines) + columns.render().replace("## Columns\n\n", "", 1)


def ops_page() -> str:
    """The values of the `op` column: results/README.md's generated op section."""
    section = ops.readme_section().splitlines()[1:-1]   # without its BEGIN/END markers
    if section and section[0] == "## Ops":
        section = section[1:]
    return "\n".join([*_header("Ops", "OPS_TABLE (stampede/ops.py)"), *section[1:]]) + "\n"


SIDECAR_SCHEMA = REPO / "results" / f"sidecar-{columns.ARCHIVE_SCHEMA}.schema.json"


def _type(node: Mapping[str, Any]) -> str:
    """A schema node's type in a few words, references as links to their sections."""
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name})"
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in node["enum"])
    kind = node.get("type", "any")
    kinds = " or ".join(kind) if isinstance(kind, list) else kind
    if kinds == "array" and "items" in node:
        return f"array of {_type(node['items'])}"
    if kinds == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"object of {_type(node['additionalProperties'])}"
    return kinds


def _fields(node: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str, bool, str]]:
    """(dotted name, type, required, description) of an object's fields, nested objects
    flattened."""
    required = set(node.get("required", ()))
    for name, field in node.get("properties", {}).items():
        yield (f"{prefix}{name}", _type(field), name in required, field.get("description", ""))
        if field.get("type") == "object" and "properties" in field:
            yield from _fields(field, f"{prefix}{name}.")


def sidecar_page() -> str:
    """The sidecar's shape, from results/sidecar-N.schema.json."""
    schema = json.loads(SIDECAR_SCHEMA.read_text())
    lines = _header("The sidecar", f"results/{SIDECAR_SCHEMA.name}")
    lines += [f"{schema['description']}", "",
              f"Its JSON Schema is `results/{SIDECAR_SCHEMA.name}` (the tests check every "
              "sidecar they write against it). A sidecar is one of " +
              ", ".join(_type(shape) for shape in schema["anyOf"]) + ".", ""]
    for name, node in schema["$defs"].items():
        lines += [f"## {name}", ""]
        if "description" in node:
            lines += [node["description"], ""]
        if "properties" not in node:
            lines += [f"{_type(node)}.", ""]
            continue
        lines += ["| field | type | required | meaning |", "|---|---|---|---|"]
        lines += [f"| `{field}` | {kind} | {'yes' if needed else ''} | {_cell(meaning)} |"
                  for field, kind, needed, meaning in _fields(node)]
        lines.append("")
    return "\n".join(lines)


def layouts_block() -> str:
    """docs/concepts/layouts.md's table: one line per descriptor of layouts.TABLE."""
    lines = ["| layout | rank r reads from storage | then | a save | what it models |",
             "|---|---|---|---|---|"]
    lines += [f"| `{layout.name}` | {_cell(layout.reads)} | "
              f"{f'`{layout.exchange}`' if layout.exchange else '-'} | "
              f"{_cell(layout.saved_by) if layout.saves else 'refused'} | {_cell(layout.models)} |"
              for layout in layouts.TABLE.values()]
    return "\n".join(lines)


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page, "reference/job-keys.md": job_keys_page,
    "reference/columns.md": columns_page, "reference/ops.md": ops_page,
    "reference/sidecar.md": sidecar_page,
}
# A page written by hand around one generated block (its markers on lines of their own)
BLOCKS: dict[str, Callable[[], str]] = {"concepts/layouts.md": layouts_block}
BLOCK_BEGIN = "<!-- BEGIN generated by `python -m stampede.docs`; do not edit -->"
BLOCK_END = "<!-- END generated -->"


def with_block(text: str, block: str) -> str:
    """`text` with what lies between its BLOCK_BEGIN and BLOCK_END lines replaced by `block`."""
    head, begin, rest = text.partition(BLOCK_BEGIN + "\n")
    _, end, tail = rest.partition(BLOCK_END)
    if not begin or not end:
        raise ValueError(f"no {BLOCK_BEGIN!r} ... {BLOCK_END!r} lines")
    return f"{head}{begin}{block}\n{end}{tail}"


def _current(path: Path, text: str) -> bool:
    return path.is_file() and path.read_text() == text


def stale(directory: Path = DOCS) -> list[str]:
    """The generated pages and blocks (paths under docs/) whose file differs from what the
    code generates now; a page that lost its block's markers is stale too."""
    names = [name for name, page in PAGES.items() if not _current(directory / name, page())]
    for name, block in BLOCKS.items():
        path = directory / name
        try:
            current = path.is_file() and _current(path, with_block(path.read_text(), block()))
        except ValueError:
            current = False
        if not current:
            names.append(name)
    return names


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stampede.docs",
        description="Regenerate docs/reference/ and the generated blocks of docs/ from the "
                    "code (the CLI, job keys, columns, ops, the sidecar, the layouts' table).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming each page that is stale")
    if parser.parse_args(argv).check:
        names = stale()
        for name in names:
            print(f"docs/{name} is stale: run `python -m stampede.docs`", file=sys.stderr)
        return 1 if names else 0
    for name, page in PAGES.items():
        (DOCS / name).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / name).write_text(page())
    for name, block in BLOCKS.items():
        (DOCS / name).write_text(with_block((DOCS / name).read_text(), block()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
