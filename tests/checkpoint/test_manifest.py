"""A manifest edited or damaged by hand is one error naming the key and the value (exit
2), never a traceback; and clean then removes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.jobs import small_job

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize(("damage", "said"), [
    (lambda m: m["layouts"]["sharded"]["files"][0].update(path=5),
     "layouts.sharded.files[0].path = 5: must be a string"),
    (lambda m: m["layouts"]["sharded"].update(nranks="two"),
     "layouts.sharded.nranks = 'two': must be a whole number"),
    (lambda m: m.update(layouts=[]), "layouts = []: must be a table of layouts"),
    (lambda m: m["layouts"]["sharded"]["slices"][1].update(offset=None),
     "layouts.sharded.slices[1].offset = None: must be a whole number"),
])
def test_a_damaged_manifest_is_one_line_naming_key_and_value(stampede, tmp_path: Path,
                                                             damage: object, said: str) -> None:
    job = small_job(tmp_path, checkpoint={"layout": "sharded"})
    assert stampede("prepare", str(job), np=2).returncode == 0
    path = tmp_path / "ckpt" / "stampede-manifest.json"
    manifest = json.loads(path.read_text())
    damage(manifest)   # type: ignore[operator]
    path.write_text(json.dumps(manifest))
    for command in (("run", str(job)), ("clean", str(job))):
        result = stampede(*command)
        assert result.returncode == 2, result.stderr
        assert said in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "ckpt" / "sharded" / "shard-00000-of-00002.raw").exists()   # untouched
