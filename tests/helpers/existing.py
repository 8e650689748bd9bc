"""Checks the tests of existing checkpoints share: what each rank read, from the sidecar."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from stampede.existing.scan import scan


def read_digests(tmp_path: Path) -> dict[str, list[dict[str, object]]]:
    sidecar = next((tmp_path / "results" / "existing.runs").glob("*.json"))
    layouts = json.loads(sidecar.read_text())["layouts"]
    return {policy: entry["digests"] for policy, entry in layouts.items()}


def accounted(root: Path, digests: list[dict[str, object]], catalogue_root: str) -> None:
    """Each rank's hash of what it read equals a plain read's; together the ranks read
    every tensor byte of the checkpoint exactly once."""
    catalogue = scan(catalogue_root)
    covered: dict[str, list[tuple[int, int]]] = {}
    for entry in digests:
        path, start, length = str(entry["path"]), int(entry["file_offset"]), int(entry["length"])
        with open(root / path, "rb") as stream:
            stream.seek(start)
            assert hashlib.sha256(stream.read(length)).hexdigest() == entry["sha256"], entry
        covered.setdefault(path, []).append((start, start + length))
    for relpath, _ in catalogue.files:
        tensors = sorted((t.file_offset, t.file_offset + t.nbytes) for t in catalogue.tensors
                         if t.relpath == relpath and t.nbytes)
        ranges = sorted(covered.get(relpath, []))
        merged: list[tuple[int, int]] = []
        for start, stop in ranges:
            assert not merged or start >= merged[-1][1], f"{relpath}: bytes read twice"
            if merged and start == merged[-1][1]:
                merged[-1] = (merged[-1][0], stop)
            else:
                merged.append((start, stop))
        expected: list[tuple[int, int]] = []
        for start, stop in tensors:
            if expected and start == expected[-1][1]:
                expected[-1] = (expected[-1][0], stop)
            else:
                expected.append((start, stop))
        assert merged == expected, f"{relpath}: the ranks did not read every tensor byte once"
