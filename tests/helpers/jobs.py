"""Job files, archives and the timeout for the tests' real stampede commands."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

RUN_TIMEOUT_S = 180  # a hung run fails the test instead of the whole suite


def toml_value(value: object) -> str:
    """A Python value as TOML: strings, booleans, numbers, lists and inline tables."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return f"[{', '.join(toml_value(item) for item in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {toml_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def write_job(directory: Path, name: str = "job", **sections: dict[str, object]) -> Path:
    """A TOML job file from keyword sections: write_job(d, target={"path": ...}, ...)."""
    lines = []
    for section, table in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
    path = directory / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def read_archive(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as stream:
        return list(csv.DictReader(stream))


def sidecars(archive: Path) -> list[dict[str, Any]]:
    """The archive's runs' sidecars, in the order the runs were archived: a run id sorts
    by its second, then by a random suffix, so two runs begun in one second (a run, then
    its save) do not sort by name in the order they ran."""
    order = dict.fromkeys(row["run_id"] for row in read_archive(archive))
    runs = archive.with_name(f"{archive.stem}.runs")
    return [json.loads((runs / f"{run_id}.json").read_text()) for run_id in order]


def small_job(tmp_path: Path, **overrides: dict[str, object]) -> Path:
    """A quick job: 16 MiB per layout, 1 MiB blocks, both layouts, sha256 verify."""
    sections: dict[str, dict[str, object]] = {
        "target": {"path": str(tmp_path / "ckpt")},
        "checkpoint": {"size": "16MiB", "layout": ["shared", "sharded"], "block_size": "1MiB"},
        "run": {"iterations": 2, "warmup": 1, "verify": "sha256"},
        "archive": {"path": str(tmp_path / "results" / "job.csv")},
    }
    for section, table in overrides.items():
        sections.setdefault(section, {}).update(table)
    return write_job(tmp_path, **sections)
