"""Lustre's parsers on real clients' text (tests/data/lustre/, where each came from in
its first line): `lfs getstripe` of files and directories, llite `stats`; and striping
where there is no Lustre client (this machine): nothing applied, and said."""

from __future__ import annotations

from pathlib import Path

from stampede.lustre import (
    apply_stripe,
    llite_delta,
    parse_getstripe,
    parse_llite_stats,
    read_layouts,
    read_llite_stats,
)

DATA = Path(__file__).parent / "data" / "lustre"


def sample(name: str) -> str:
    text = (DATA / name).read_text()
    assert text.startswith("# ") and "commit" in text.splitlines()[0]   # its provenance
    return text


def test_a_file_striped_over_four_osts() -> None:
    """SDSC Expanse: a file copied into a directory set to `lfs setstripe -c 4`."""
    layout = parse_getstripe(sample("getstripe-file-expanse.txt"))
    assert layout == {"path": "striped/ILSVRC2012_img_train.tar", "stripe_count": 4,
                      "stripe_size": 1048576, "pattern": "raid0", "layout_gen": 0,
                      "stripe_offset": 52, "osts": [52, 15, 5, 53]}


def test_a_file_on_one_ost() -> None:
    layout = parse_getstripe(sample("getstripe-file-demo.txt"))
    assert layout["stripe_count"] == 1 and layout["stripe_size"] == 1048576
    assert layout["pattern"] == "raid0" and layout["osts"] == [0]
    assert layout["path"] == "testfile"


def test_a_directorys_default_layout_on_one_line() -> None:
    layout = parse_getstripe(sample("getstripe-dir-expanse.txt"))
    assert layout == {"path": "striped/", "stripe_count": 4, "stripe_size": 1048576,
                      "pattern": "raid0", "stripe_offset": -1}


def test_a_composite_layout_lists_its_components() -> None:
    """Progressive file layout with Data-on-MDT: the first 64 KiB on the MDT, the rest
    striped over every OST (-1) in 1 MiB stripes."""
    layout = parse_getstripe(sample("getstripe-dir-composite-demo.txt"))
    assert layout["path"] == "testdir1"
    assert layout["components"] == [
        {"start": 0, "end": 65536, "stripe_count": 0, "stripe_size": 65536, "pattern": "mdt",
         "stripe_offset": -1},
        {"start": 65536, "end": "EOF", "stripe_count": -1, "stripe_size": 1048576,
         "pattern": "raid0", "stripe_offset": -1}]


def test_llite_stats_per_op_and_bytes() -> None:
    stats = parse_llite_stats(sample("llite-stats-ffff88105db50000.txt"))
    assert "snapshot_time" not in stats and len(stats) == 12
    assert stats["read_bytes"] == {"count": 1, "sum": 4194304}
    assert stats["write_bytes"] == {"count": 89467810, "sum": 93813797294080}
    assert stats["open"] == {"count": 136} and stats["close"] == {"count": 96}
    assert stats["getattr"] == {"count": 41} and stats["inode_permission"] == {"count": 398}


def test_llite_stats_of_another_client_and_the_delta_between_two() -> None:
    """Two real readings of different clients, taken as before and after: each counter's
    increase, the ops that did not move left out."""
    before = parse_llite_stats(sample("llite-stats-ffff88105db50000.txt"))
    after = parse_llite_stats(sample("llite-stats-ffff88082d691000.txt"))
    assert after["read_bytes"] == {"count": 46318, "sum": 48567943168}
    assert after["statfs"] == {"count": 57491} and after["getxattr"] == {"count": 102495000}
    delta = llite_delta(before, after)
    assert delta["read_bytes"] == {"count": 46317, "sum": 48567943168 - 4194304}
    assert delta["open"] == {"count": 10271 - 136} and delta["statfs"] == {"count": 57491}
    assert "getxattr_hits" not in delta   # only in `before`: it went nowhere
    assert llite_delta(before, before) == {}


def test_without_lfs_nothing_is_applied_and_it_is_said(tmp_path: Path) -> None:
    note = apply_stripe(tmp_path, 4, 1 << 20)
    assert note == ("target.stripe_* (stripe_count=4, stripe_size=1048576) not applied: no "
                    "`lfs` command here (not a Lustre client)", False)
    assert read_layouts([tmp_path]) == {}
    assert read_llite_stats("127.0.0.1@tcp:/nosuchfs") is None
