"""File-system kinds, as data: what the type of the mount a POSIX target lies on means to
stampede. The second axis beside the backends (stampede.targets): a POSIX target is one
backend, yet a cold read on tmpfs is warm, an fsync there reaches no disk, Lustre and
CephFS stripe a directory's new files over servers, and a kernel NFS or Lustre client
keeps per-op counters of its own.

Callers ask an entry (`kind_of(fs_type)`, `kind_for(path)`) what the kind does, never its
name: a new kind is one entry of `TABLE` (and its hooks, where it has striping or
counters). tests/test_house.py fails on a kind's name compared anywhere else.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from functools import partial
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import NamedTuple, Protocol

from stampede import cephmds, lustre
from stampede.sysinfo import Mount, mount_of, mountstats_delta, nfs_options, read_mountstats
from stampede.targets import Capabilities, capabilities_for

# The counters are the whole mount's on rank 0's node, read before and after a layout.
SCOPE = "rank 0's node: the whole mount's counters (every process on that node using it)"


class StripeNote(NamedTuple):
    """What target.stripe_* did to one directory: a line for the user, and whether the
    stripes were applied (then it is what the run says, else a warning)."""

    text: str
    applied: bool


class Striper(NamedTuple):
    """How a kind lays a directory's new files over its servers, and reads a file's back."""

    how: str                                           # what applies it (notes, the sidecar)
    # directory, count, size -> a note (a path on a mount, or in a client's file system)
    apply: Callable[[PurePath, int, int | None], StripeNote]
    read: Callable[[list[PurePath]], dict[str, object]]   # files -> each one's layout


class Counters(NamedTuple):
    """A client's own per-op counters, read around a layout on rank 0, untimed."""

    key: str                                           # the sidecar's key, in each layout
    read: Callable[[Mount], object]                    # a reading (None: cannot be read)
    # what moved since one (a line: why it was not counted; None: nothing to say)
    since: Callable[[Mount, object], dict[str, object] | str | None]


class FsKind(NamedTuple):
    """What one mount type means to stampede; the callers trust it."""

    name: str
    describes: str
    # Why posix_fadvise(DONTNEED) cannot empty what serves a read ("": it can, so a cold
    # run reads the storage): run.cache = cold is then warm, and the row says why.
    unevictable: str = ""
    # Why an fsync there makes nothing outlive the node ("": it reaches the storage).
    volatile: str = ""
    striper: Striper | None = None
    counters: Counters | None = None
    # The mount options that change what a run measures, kept in the sidecar's node facts.
    options: Callable[[str], dict[str, str]] | None = None
    options_key: str = ""
    # False: a pseudo file system (/proc, /sys): no file stampede writes can live there.
    holds_files: bool = True

    @property
    def evictable(self) -> bool:
        return not self.unevictable

    @property
    def durable_fsync(self) -> bool:
        return not self.volatile


# --- the hooks: kernel NFS -------------------------------------------------------------

def _nfs_read(mount: Mount) -> object:
    return read_mountstats(mount.mountpoint)


def _nfs_since(mount: Mount, before: object) -> dict[str, object] | None:
    after = read_mountstats(mount.mountpoint)
    if not isinstance(before, dict) or after is None:
        return None
    return {"mount": mount.mountpoint, "scope": SCOPE, "ops": mountstats_delta(before, after)}


# --- Lustre ------------------------------------------------------------------------------

def _llite_read(mount: Mount) -> object:
    return lustre.read_llite_stats(mount.device)


def _llite_since(mount: Mount, before: object) -> dict[str, object] | None:
    after = lustre.read_llite_stats(mount.device)
    if not isinstance(before, dict) or after is None:
        return None
    return {"mount": mount.mountpoint, "scope": SCOPE, "ops": lustre.llite_delta(before, after)}


# --- CephFS: a directory's layout is a virtual xattr (ceph.dir.layout.*), inherited by
# the files and directories created in it afterwards; a file's, ceph.file.layout ---------

CEPH_DEFAULT_OBJECT = 4 << 20   # CephFS's default object size (and stripe unit)


# How a CephFS client reads and sets an xattr of a path: os.getxattr/os.setxattr on a
# mount, libcephfs's ceph_getxattr/ceph_setxattr for cephfs:// (stampede.backends.cephfs)
GetXattr = Callable[[PurePath, str], bytes]
SetXattr = Callable[[PurePath, str, bytes], None]


def _ceph_effective(directory: PurePath, name: str, getxattr: GetXattr = os.getxattr) -> int:
    """A directory's layout field as its new files get it: its own, else the nearest
    ancestor's that has one (ENODATA: none set there), else CephFS's default."""
    for where in (directory, *directory.parents):
        try:
            return int(getxattr(where, f"ceph.dir.layout.{name}"))
        except OSError as error:
            if error.errno != errno.ENODATA:   # left the file system, or not CephFS
                break
    return CEPH_DEFAULT_OBJECT


def _ceph_apply(getxattr: GetXattr, setxattr: SetXattr, directory: PurePath, count: int,
                size_bytes: int | None) -> StripeNote:
    wanted = f"stripe_count={count or 'default'}, stripe_unit={size_bytes or 'default'}"
    if count < 0:   # Lustre's "every OST": CephFS stripes over objects, not a server count
        return StripeNote(f"target.stripe_count = {count} not applied on CephFS: give a number "
                          "of objects to stripe over", False)
    try:
        for name, value in _ceph_steps(directory, size_bytes, getxattr):
            setxattr(directory, f"ceph.dir.layout.{name}", str(value).encode())
        if count:
            setxattr(directory, "ceph.dir.layout.stripe_count", str(count).encode())
    except OSError as error:
        return StripeNote(f"ceph.dir.layout {wanted} on {directory} failed: "
                          f"{error.strerror or error}", False)
    return StripeNote(f"ceph.dir.layout {wanted} applied to {directory}", True)


def _ceph_steps(directory: PurePath, unit: int | None,
                getxattr: GetXattr = os.getxattr) -> list[tuple[str, int]]:
    """The xattrs that set a stripe unit, in an order CephFS accepts: it refuses any step
    after which object_size is not a multiple of stripe_unit. The object size ends as the
    smallest multiple of the new unit not below the current one."""
    if not unit:
        return []
    old_unit = _ceph_effective(directory, "stripe_unit", getxattr)
    objects = -(-_ceph_effective(directory, "object_size", getxattr) // unit) * unit
    if objects % old_unit == 0:   # a multiple of both units: object first, then unit
        return [("object_size", objects), ("stripe_unit", unit)]
    both = math.lcm(old_unit, unit)   # through an object size that fits both units
    return [("object_size", both), ("stripe_unit", unit), ("object_size", objects)]


def parse_ceph_layout(text: str) -> dict[str, object]:
    """ceph.file.layout's value: stripe_unit=4194304 stripe_count=1 object_size=4194304
    pool=cephfs_data."""
    layout: dict[str, object] = {}
    for word in text.split():
        key, _, value = word.partition("=")
        layout[key] = int(value) if value.isdigit() else value
    return layout


def _ceph_read(getxattr: GetXattr, paths: list[PurePath]) -> dict[str, object]:
    layouts: dict[str, object] = {}
    for path in paths:
        try:
            layouts[str(path)] = parse_ceph_layout(getxattr(path, "ceph.file.layout").decode())
        except OSError as error:
            layouts[str(path)] = f"ceph.file.layout not read: {error.strerror or error}"
    return layouts


def ceph_striper(getxattr: GetXattr, setxattr: SetXattr) -> Striper:
    """CephFS's striper through a client's xattr calls: the same values decided, and the
    same layouts read back, whichever client applies them (a mount's, libcephfs's)."""
    return Striper("ceph.dir.layout", partial(_ceph_apply, getxattr, setxattr),
                   partial(_ceph_read, getxattr))


# --- CephFS's MDS: its own per-op counts, asked as the mount itself would ask -------------

MDS_SCOPE = ("the MDS's own counters: every client's requests while the layout ran (its "
             "warmup included, every client of the cluster), not only this mount's")


def _mds_read(mount: Mount) -> object:
    return cephmds.node_perf_dump()   # a dump, or why none (a line)


def _mds_since(mount: Mount, before: object) -> dict[str, object] | str | None:
    if isinstance(before, str):   # the first dump was not had: the layout is not counted
        return before
    after = cephmds.node_perf_dump()
    if isinstance(after, str) or not isinstance(before, dict):
        return after if isinstance(after, str) else None
    return {"mount": mount.mountpoint, "scope": MDS_SCOPE,
            "how": "perf dump by rank 0 before and after (a libcephfs client from the node's "
                   "Ceph config, or `ceph tell mds.* perf dump`)",
            **cephmds.deltas(before, after)}


# --- the table -----------------------------------------------------------------------------

_LUSTRE_STRIPES = Striper("lfs setstripe", lambda *asked: StripeNote(*lustre.apply_stripe(*asked)),
                          lustre.read_layouts)
_LLITE = Counters("lustre_llite", _llite_read, _llite_since)
_CEPH_STRIPES = ceph_striper(os.getxattr, os.setxattr)
_MDS = Counters(cephmds.KEY, _mds_read, _mds_since)
KERNEL_NFS_RPCS = "kernel_nfs_rpcs"   # the sidecar's key (readers: present.report)
_KERNEL_NFS = Counters(KERNEL_NFS_RPCS, _nfs_read, _nfs_since)
_IN_MEMORY = "pages cannot be evicted"
_VOLATILE = "fsync has nothing to flush; durable means in this node's memory"
_LOCAL = "a local disk's file system"
_PSEUDO = "a pseudo file system: the kernel's, no files of stampede's"

OTHER = FsKind("other", "any other mount type: evictable and durable, no striping, no counters")

TABLE: Mapping[str, FsKind] = MappingProxyType({kind.name: kind for kind in (
    FsKind("lustre", "Lustre's client (llite)", striper=_LUSTRE_STRIPES, counters=_LLITE),
    FsKind("ceph", "CephFS's kernel client", striper=_CEPH_STRIPES, counters=_MDS),
    # ceph-fuse keeps its own object cache in the daemon (client_oc), out of fadvise's reach
    FsKind("fuse.ceph-fuse", "CephFS through ceph-fuse", striper=_CEPH_STRIPES, counters=_MDS,
           unevictable="ceph-fuse's own object cache cannot be evicted"),
    FsKind("nfs", "the kernel's NFS client (v2, v3)", counters=_KERNEL_NFS,
           options=nfs_options, options_key="nfs_options"),
    FsKind("nfs4", "the kernel's NFS client (v4.x)", counters=_KERNEL_NFS,
           options=nfs_options, options_key="nfs_options"),
    FsKind("tmpfs", "memory", unevictable=_IN_MEMORY, volatile=_VOLATILE),
    FsKind("ramfs", "memory", unevictable=_IN_MEMORY, volatile=_VOLATILE),
    # GPFS caches in its own pagepool, not the kernel's page cache
    FsKind("gpfs", "IBM Storage Scale (GPFS)",
           unevictable="GPFS's pagepool is not the page cache fadvise empties"),
    FsKind("ext4", _LOCAL), FsKind("xfs", _LOCAL), FsKind("btrfs", _LOCAL),
    *(FsKind(name, _PSEUDO, holds_files=False) for name in (
        "proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs",
        "configfs", "pstore", "bpf")),
)})


def kind_of(fs_type: str) -> FsKind:
    """The entry of a mount type (/proc/mounts' third field); OTHER for any not listed."""
    return TABLE.get(fs_type, OTHER)


def kind_for(path: str | Path) -> tuple[FsKind, Mount]:
    """The kind of the mount that holds `path`, and that mount."""
    mount = mount_of(path)
    return kind_of(mount.fs_type), mount


def stripe(directory: Path, count: int, size_bytes: int | None) -> StripeNote:
    """target.stripe_* on a directory stampede just made, so that the files and
    directories created in it afterwards inherit them: applied by its kind's striper, or
    a line saying why not (a kind that does not stripe, a client without its tool)."""
    kind, mount = kind_for(directory)
    if kind.striper is None:
        return StripeNote(f"target.stripe_* (stripe_count={count or 'default'}, stripe_size="
                          f"{size_bytes or 'default'}) not applied: {directory} is on "
                          f"{mount.fs_type}, which does not stripe (Lustre and CephFS do)", False)
    return kind.striper.apply(directory, count, size_bytes)


class Backend(Protocol):
    """What this module asks of a backend (stampede.backends.base's, below it here)."""

    name: str
    capabilities: Capabilities


class BackendStriping(Backend, Protocol):
    """A backend with a CephFS-style client of its own (cephfs://: libcephfs), which
    stripes the directories it makes through that client (`capabilities.stripes`)."""

    def striper(self) -> Striper:
        """The striper through this backend's client (its paths: `fs_path`'s)."""

    def fs_path(self, relpath: str) -> PurePath:
        """A path below the target, as the striper takes it (in the client's file system)."""


def backend_striping(backend: Backend) -> BackendStriping | None:
    return backend if backend.capabilities.stripes else None   # type: ignore[return-value]


def stripe_in(backend: Backend, relpath: str, count: int, size_bytes: int | None) -> StripeNote:
    """target.stripe_* on a directory a backend without a local mount just made (relpath
    below the target): applied by the backend's own striper, the values decided as on a
    mount, or a line saying why not (a backend that does not stripe: nfs://, s3://)."""
    striping = backend_striping(backend)
    if striping is None:
        return StripeNote(f"target.stripe_* (stripe_count={count or 'default'}, stripe_size="
                          f"{size_bytes or 'default'}) not applied: the {backend.name} backend "
                          "does not stripe (CephFS and Lustre mounts, and cephfs://, do)", False)
    return striping.striper().apply(striping.fs_path(relpath), count, size_bytes)


def mount_facts(target: str) -> dict[str, object]:
    """What the sidecar's node facts keep about a POSIX target's mount: the mount, and
    the options of its kind that change what a run measures (NFS's attribute caching);
    nothing for an object store's (no mount)."""
    if not capabilities_for(target).local_files:
        return {}
    kind, mount = kind_for(target)
    facts: dict[str, object] = {"target_mount": asdict(mount)}
    if kind.options is not None:
        facts[kind.options_key] = kind.options(mount.options)
    return facts
