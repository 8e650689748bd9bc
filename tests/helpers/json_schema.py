"""A validator for the JSON Schema subset results/sidecar-N.schema.json uses (type, const,
enum, minimum, properties, required, additionalProperties, items, anyOf, local $ref):
the jsonschema package is not a dependency, and a sidecar's shape needs no more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool,
                         "null": type(None), "integer": int, "number": (int, float)}


def sidecar_schema(version: int) -> dict[str, Any]:
    path = REPO / "results" / f"sidecar-{version}.schema.json"
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def sidecar_problems(document: Any) -> list[str]:
    """What in a sidecar breaks the schema of this stampede's archive schema; a sidecar
    of an older schema that has its own file (an archive packed for the goldens before
    the schema moved on) is held to that one."""
    from stampede.results.columns import ARCHIVE_SCHEMA

    version = document.get("schema") if isinstance(document, dict) else None
    own = isinstance(version, int) and not isinstance(version, bool) and \
        version < ARCHIVE_SCHEMA and (REPO / "results" / f"sidecar-{version}.schema.json").exists()
    schema = sidecar_schema(version if own else ARCHIVE_SCHEMA)
    return problems(document, schema, schema)


def written_sidecars(root: Path) -> dict[Path, Any]:
    """Every run sidecar under root: ARCHIVE.runs/RUN_ID.json whose run_id is its name
    (beside them a run may keep other JSON, such as MLPerf's summaries)."""
    found = {}
    for path in root.rglob("*.runs/*.json"):
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            continue   # a test's own broken file, or one a rank is still writing
        if isinstance(document, dict) and document.get("run_id") == path.stem:
            found[path] = document
    return found


def problems(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str = "$") -> list[str]:
    """What in `value` breaks `schema` ("$.layouts.shared.valid: ..."); [] when nothing."""
    if "$ref" in schema:
        return problems(value, root["$defs"][schema["$ref"].removeprefix("#/$defs/")], root, where)
    if "anyOf" in schema:
        found = [problems(value, option, root, where) for option in schema["anyOf"]]
        # none fits: the one that fitted deepest (its type matched) says the most
        return [] if any(not each for each in found) else \
            min(found, key=lambda each: (each[0].startswith(f"{where}: "), len(each)))
    if not _typed(value, schema.get("type")):
        return [f"{where}: {type(value).__name__} {_short(value)}, not {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        return [f"{where}: {_short(value)}, not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {_short(value)}, not one of {schema['enum']}"]
    if "minimum" in schema and value < schema["minimum"]:
        return [f"{where}: {value} < {schema['minimum']}"]
    found = []
    if isinstance(value, dict):
        found += [f"{where}: no {key!r}" for key in schema.get("required", ()) if key not in value]
        known, other = schema.get("properties", {}), schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in known:
                found += problems(item, known[key], root, f"{where}.{key}")
            elif other is False:
                found.append(f"{where}: {key!r} is not in the schema")
            elif isinstance(other, dict):
                found += problems(item, other, root, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += problems(item, schema["items"], root, f"{where}[{index}]")
    return found


def _typed(value: Any, kinds: str | list[str] | None) -> bool:
    if kinds is None:
        return True
    names = [kinds] if isinstance(kinds, str) else kinds
    if isinstance(value, bool):   # a bool is an int to Python, never to JSON
        return "boolean" in names
    return any(isinstance(value, TYPES[name]) for name in names)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
