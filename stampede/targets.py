"""Which backend serves a target, and what it can do: the registry, as data.

The registry (like fsspec's `known_implementations`) names each backend's module, which
is only imported when a job uses it, the command that installs what it needs, and its
capabilities. Callers ask the capabilities, never a backend's name or a URL's scheme:
the job's rules before any I/O (here, without importing a backend), the rest through
`Backend.capabilities` (stampede.backends.base), which each backend takes from its entry.
A new backend is a module and one entry here (and its conformance fixture).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from stampede.errors import UsageError, install_hint


class Capabilities(NamedTuple):
    """What a backend can do; the callers trust it (fio's ioengine flags)."""

    # A POSIX path, read and written through the OS's own calls: the target's lock file,
    # statvfs, os.access, page-cache eviction and mincore, prepare's writes at offsets,
    # cuFile (file:// reaches local files through fsspec's calls, as whole objects).
    local_files: bool = False
    # Reads may come from a page cache (the client's, or a file server's): run.cache =
    # warm then means "maybe from memory", and the report says so.
    page_cache: bool = False
    # False: objects, written whole under their final names (no directories to make, sync
    # or remove, no rename).
    has_directories: bool = False
    # read_into stamps `first_byte_ns`: a request's time to first byte, apart from its
    # transfer (a pread's first byte is its last).
    ttfb: bool = False
    # It has the timed save's methods (stampede.backends.base); save refuses any other.
    saves: bool = False
    # It counts the RPCs each op costs on the wire (stampede.backends.base.RpcProber).
    rpc_probe: bool = False
    # It creates a small file or object only where none is (NFS CREATE GUARDED, S3 PUT
    # with If-None-Match: *; stampede.backends.base.Exclusive): the target's lock where
    # there is no flock (stampede.checkpoint.lock).
    exclusive_create: bool = False
    # It asks its metadata server for its own per-op request counts
    # (stampede.backends.base.MdsCounter): a CephFS MDS's perf counters.
    mds_counters: bool = False
    # It stripes the directories it makes through its own client (target.stripe_*;
    # stampede.filesystems.BackendStriping): cephfs://'s ceph.dir.layout xattrs.
    stripes: bool = False

    @property
    def object_store(self) -> bool:
        """Saves objects: a multipart upload or one PUT each (stampede.run.save_objects)."""
        return self.saves and not self.has_directories


class BackendEntry(NamedTuple):
    module: str
    cls: str
    capabilities: Capabilities
    install: str = ""                # the command that installs what it needs, or
    extra: str = ""                  # stampede's extra that does (its hint made when asked)
    requires: tuple[str, ...] = ()   # packages imported up front, so a missing one is named

    @property
    def install_hint(self) -> str:
        return install_hint(self.extra) if self.extra else self.install


POSIX = "posix"   # the backend of a plain path (no scheme)
_FSSPEC = "stampede.backends.fsspec"
_OBJECTS = Capabilities()   # fsspec's stores: whole objects, no client cache, no save
_GCS_HINT = "pip install gcsfs"
REGISTRY: Mapping[str, BackendEntry] = MappingProxyType({
    POSIX: BackendEntry("stampede.backends.posix", "PosixBackend", Capabilities(
        local_files=True, page_cache=True, has_directories=True, saves=True)),
    "s3": BackendEntry("stampede.backends.s3", "S3Backend",
                       Capabilities(ttfb=True, saves=True, exclusive_create=True),
                       extra="s3", requires=("botocore",)),
    "gs": BackendEntry(_FSSPEC, "FsspecBackend", _OBJECTS, _GCS_HINT,
                       requires=("fsspec", "gcsfs")),
    "gcs": BackendEntry(_FSSPEC, "FsspecBackend", _OBJECTS, _GCS_HINT,
                        requires=("fsspec", "gcsfs")),
    "memory": BackendEntry(_FSSPEC, "FsspecBackend", _OBJECTS, extra="fsspec",
                           requires=("fsspec",)),
    # the server's page cache serves a warm read
    "nfs": BackendEntry("stampede.backends.nfs", "NfsBackend",
                        Capabilities(page_cache=True, has_directories=True, saves=True,
                                     rpc_probe=True, exclusive_create=True),
                        "apt-get install libnfs13 (Debian/Ubuntu; dnf install libnfs on RHEL)"),
    # One libcephfs client per rank, its object cacher off: no data cached client-side,
    # every read reaches an OSD. page_cache is still True, as NFS's is: an OSD serves a
    # recently read object from its own memory (BlueStore's cache; memstore holds all of
    # it there), which no client can evict, so a warm run may be a run from memory.
    # exclusive_create: the MDS creates with O_EXCL for whichever client asks first.
    "cephfs": BackendEntry("stampede.backends.cephfs", "CephfsBackend",
                           Capabilities(page_cache=True, has_directories=True, saves=True,
                                        exclusive_create=True, mds_counters=True,
                                        stripes=True),
                           "apt-get install libcephfs2 (Debian/Ubuntu; dnf install libcephfs2 "
                           "on RHEL)"),
    # local files through fsspec's generic calls: whole objects, yet the page cache serves
    "file": BackendEntry(_FSSPEC, "FsspecBackend", Capabilities(page_cache=True),
                         extra="fsspec", requires=("fsspec",)),
})


def backend_name_for(target_path: str) -> str:
    """Which backend serves a target: a URL's scheme, or posix for a plain path."""
    scheme, sep, _ = target_path.partition("://")
    if not sep:
        return POSIX
    if scheme not in REGISTRY or scheme == POSIX:
        raise UsageError(f"target.path = {target_path!r}: no backend for {scheme}:// "
                         f"(available: a POSIX path, or "
                         f"{', '.join(f'{name}://' for name in sorted(REGISTRY) if name != POSIX)})")
    return scheme


def capabilities_for(target_path: str) -> Capabilities:
    """What the backend of a target can do, without importing it (UsageError for a scheme
    no backend serves)."""
    return REGISTRY[backend_name_for(target_path)].capabilities


def local_files(target_path: str) -> bool:
    """Whether an archived run's target was files on a mount (a scheme no backend serves
    now: no)."""
    entry = REGISTRY.get(target_path.partition("://")[0] if "://" in target_path else POSIX)
    return entry is not None and entry.capabilities.local_files


# S3's documented request rates per partitioned prefix, a second: at least 5,500 GET/HEAD
# (a LIST is a GET of the bucket) and 3,500 PUT/COPY/POST/DELETE; beyond them, 503 SlowDown
# while it partitions a prefix that stays hot (AWS, "Best practices design patterns:
# optimizing Amazon S3 performance")
S3_PREFIX_RATES_PER_S = {"read": 5_500.0, "write": 3_500.0, "list": 5_500.0}


class RatePreset(NamedTuple):
    """An object store's documented request rates (a second) per partition: what `project
    --preset` predicts a restore against (stampede.model.prefix_rate)."""

    title: str
    read_per_s: float            # GET/HEAD
    write_per_s: float           # PUT/COPY/POST/DELETE
    list_per_s: float            # a LIST is a read of the bucket
    partition: str               # what one set of rates is for; K copies spread over these
    doubling_s: float = math.inf   # the rates double every this long under load (GCS)
    source: str = ""
    lists_are_reads: bool = False  # a LIST counts against the read rate (GCS)


# The vendors' numbers; docs/guides/object-stores.md cites the pages ("At 16,384 ranks").
RATE_PRESETS: Mapping[str, RatePreset] = MappingProxyType({
    "s3-standard": RatePreset(
        "S3 Standard", S3_PREFIX_RATES_PER_S["read"], S3_PREFIX_RATES_PER_S["write"],
        S3_PREFIX_RATES_PER_S["list"], "prefix",
        source="AWS, Best practices design patterns: optimizing Amazon S3 performance"),
    # a directory bucket's own rates, whatever its prefixes
    "s3-express": RatePreset(
        "S3 Express One Zone", 200_000.0, 100_000.0, 200_000.0, "bucket",
        source="AWS, Optimizing S3 Express One Zone performance"),
    # a new bucket's initial rates, autoscaled by doubling every 20 minutes of load
    "gcs": RatePreset(
        "GCS", 5_000.0, 1_000.0, 5_000.0, "bucket", doubling_s=20 * 60.0,
        source="Google Cloud, Request rate and access distribution guidelines",
        lists_are_reads=True),
})
# No store documents a burst: a partition is taken to absorb this long at its rate at once
PRESET_BURST_S = 1.0
