"""What the sidecar records about the target's mount: NFS options change metadata numbers
(attribute caching), so they are kept; read from a /proc/mounts-format file."""

import io
from pathlib import Path

from rich.console import Console

from stampede.present.report import render_kernel_nfs
from stampede.sysinfo import OpCounters, mount_of, mountstats_delta, nfs_mountstats, nfs_options

NFS_OPTIONS = ("rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,"
               "nconnect=8,timeo=600,retrans=2,sec=sys,actimeo=60")
MOUNTS = f"/dev/vda / ext4 rw,relatime 0 0\nserver:/export MOUNTPOINT nfs4 {NFS_OPTIONS} 0 0\n"


def test_nfs_mount_options_are_found(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    (tmp_path / "ckpt" / "run1").mkdir(parents=True)
    mounts.write_text(MOUNTS.replace("MOUNTPOINT", str(tmp_path / "ckpt")))
    mount = mount_of(tmp_path / "ckpt" / "run1", str(mounts))
    assert (mount.fs_type, mount.mountpoint) == ("nfs4", str(tmp_path / "ckpt"))
    assert nfs_options(mount.options) == {
        "vers": "4.2", "rsize": "1048576", "wsize": "1048576", "hard": "on", "proto": "tcp",
        "nconnect": "8", "timeo": "600", "retrans": "2", "actimeo": "60"}
    assert mount_of(tmp_path, str(mounts)).fs_type == "ext4"


DATA = Path(__file__).parent / "data"


def test_a_kernel_nfs3_clients_mountstats_per_op() -> None:
    """A real NFSv3 client's block (RPC iostats 1.0: eight counters, no errors column):
    every op of its per-op table, the mount found by its mount point among others."""
    text = (DATA / "mountstats-nfs3-kernel.txt").read_text()
    ops = nfs_mountstats(text, "/mnt/foo")
    assert ops is not None and len(ops) == 22 and list(ops)[:3] == ["NULL", "GETATTR", "SETATTR"]
    assert ops["GETATTR"] == OpCounters(2456214934, 2456215287, 172, 294745830628,
                                        275096062948, 41725307, 877562740, 983824784, 0)
    assert ops["READDIRPLUS"].timeouts == 4 and ops["READ"].bytes_recv == 174865686144
    assert nfs_mountstats(text, "/") is None          # xfs: no per-op table
    assert nfs_mountstats(text, "/mnt") is None        # no such mount


def test_a_kernel_nfs41_clients_mountstats_and_a_delta_around_a_phase() -> None:
    """A real NFSv4.1 client's block (indented with spaces as published): its READs and
    WRITEs; then the delta a phase adds, only the ops it moved, with what they cost."""
    text = (DATA / "mountstats-nfs41-kernel.txt").read_text()
    before = nfs_mountstats(text, "/mnt")
    assert before is not None and len(before) == 60
    assert before["READ"] == OpCounters(1000, 1000, 0, 220000, 1048680000, 1689, 503927,
                                        505677, 0)
    assert before["WRITE"].rtt_ms == 48850 and before["COMMIT"].ops == 11
    after_text = text.replace("READ: 1000 1000 0 220000 1048680000 1689 503927 505677",
                              "READ: 1010 1012 1 222200 1059166800 1700 504027 505800")
    after = nfs_mountstats(after_text, "/mnt")
    assert after is not None
    delta = mountstats_delta(before, after)
    assert delta == {"READ": {"ops": 10, "transmissions": 12, "timeouts": 1, "bytes_sent": 2200,
                              "bytes_recv": 10486800, "queue_ms": 11, "rtt_ms": 100,
                              "execute_ms": 123, "errors": 0}}
    line = io.StringIO()
    render_kernel_nfs("sharded", {"mount": "/mnt", "scope": "rank 0's node", "ops": delta},
                      Console(file=line, width=400))
    assert line.getvalue().strip() == ("sharded: kernel NFS RPCs on /mnt (rank 0's node): READ 10 "
                                       "(rtt 10.00 ms, exe 12.30 ms); retransmissions 2, major "
                                       "timeouts 1")
