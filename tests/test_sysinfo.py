"""What the sidecar records about the target's mount: NFS options change metadata numbers
(attribute caching), so they are kept; read from a /proc/mounts-format file."""

from pathlib import Path

from stampede.sysinfo import mount_of, nfs_options

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
