"""Rules that span several job options, checked when a job is loaded, before any I/O: the
same answer on every machine (no rule here depends on what is installed: that is the
command's, see checkpoint.formats). Each names the file, the keys and what would work.
"""

from __future__ import annotations

from stampede.errors import UsageError
from stampede.layouts import layout_of
from stampede.spec_fields import SpecFields
from stampede.targets import capabilities_for
from stampede.units import ALIGN_BYTES, BYTES_PER_MIB

MIN_PART_BYTES = 5 * BYTES_PER_MIB   # S3's smallest part (all but the last)


def check_combination(spec: SpecFields, workloads: tuple[str, ...]) -> None:
    """Every rule below, in turn: UsageError at the first that fails. `workloads`: the
    checkpoint.workload names a message offers (stampede.spec's, which imports this module)."""
    _size_rules(spec, workloads)
    for rules in (_pattern_rules, _layout_rules, _cache_rules, _check_rules, _format_rules,
                  _save_rules, _device_rules, _prefix_rules, _stripe_rules):
        rules(spec)


def _size_rules(spec: SpecFields, workloads: tuple[str, ...]) -> None:
    sized = spec.size_total_bytes is not None or spec.size_per_rank_bytes is not None
    workload = any(layout_of(layout).workload_files for layout in spec.layouts)
    if spec.workload != "none" and not workload or \
            (spec.scale != 1 or spec.subset) and spec.workload == "none":
        raise UsageError(f"{spec.source}: checkpoint.workload, scale and subset belong to "
                         "checkpoint.layout \"mlperf\"", hint='layout = ["mlperf"]')
    if spec.checkpoint_source == "existing" or spec.from_path:
        what = "an existing checkpoint" if spec.checkpoint_source == "existing" else "checkpoint.from"
        if sized:
            raise UsageError(f"{spec.source}: checkpoint.size and size_per_rank have no "
                             f"meaning with {what}: its size is the checkpoint's")
        if spec.checkpoint_source == "existing" and spec.from_path:
            raise UsageError(f"{spec.source}: checkpoint.from copies an existing checkpoint "
                             "into a synthetic one; with checkpoint.source = \"existing\" the "
                             "checkpoint is read in place")
    elif workload:
        _workload_rules(spec, sized, workloads)
    elif (spec.size_total_bytes is None) == (spec.size_per_rank_bytes is None):
        raise UsageError(f"{spec.source}: give exactly one of checkpoint.size and "
                         "checkpoint.size_per_rank",
                         hint='for example checkpoint.size = "1GiB"')


def _workload_rules(spec: SpecFields, sized: bool, workloads: tuple[str, ...]) -> None:
    """Layout mlperf: the workload's files, sized by its model (stampede.checkpoint.mlperf)."""
    if spec.workload == "none":
        raise UsageError(f"{spec.source}: checkpoint.layout \"mlperf\" needs "
                         f"checkpoint.workload, one of {', '.join(workloads)}")
    if len(spec.layouts) > 1:
        raise UsageError(f"{spec.source}: checkpoint.layout = {list(spec.layouts)}: mlperf "
                         "runs alone (its files are the workload's)", hint='layout = ["mlperf"]')
    if sized:
        raise UsageError(f"{spec.source}: checkpoint.size and size_per_rank have no meaning "
                         f"with checkpoint.workload = {spec.workload!r}: its model sizes it",
                         hint="shrink it with checkpoint.scale (--scale)")
    if spec.format != "raw" or spec.replicas != 1:
        raise UsageError(f"{spec.source}: checkpoint.layout \"mlperf\" writes raw files, one "
                         "writer each", hint='leave checkpoint.format = "raw" and replicas = 1')


def _pattern_rules(spec: SpecFields) -> None:
    ops = spec.ops
    if "read" in ops and ("open" not in ops or ops.index("open") > ops.index("read")):
        raise UsageError(f"{spec.source}: pattern.ops = {list(ops)}: read needs open before it")
    if "close" in ops and ("open" not in ops or ops.index("open") > ops.index("close")):
        raise UsageError(f"{spec.source}: pattern.ops = {list(ops)}: close needs open before it")
    if "read" in ops and "close" in ops and ops.index("close") < ops.index("read"):
        raise UsageError(f"{spec.source}: pattern.ops = {list(ops)}: read must come before close")


def _layout_rules(spec: SpecFields) -> None:
    if spec.checkpoint_source == "existing":   # its layouts are ignored
        return
    single = [layout for layout in spec.layouts if layout_of(layout).replica_aware]
    if single and spec.replicas < 2:
        raise UsageError(f"{spec.source}: checkpoint.layout {', '.join(single)} needs "
                         f"checkpoint.replicas >= 2 (with one replica it is sharded)",
                         hint="e.g. --set checkpoint.replicas=2")
    whole = [layout for layout in spec.layouts if layout_of(layout).whole_file]
    if whole and spec.h2d != "none":
        raise UsageError(f"{spec.source}: checkpoint.layout {', '.join(whole)} with run.h2d = "
                         f"{spec.h2d!r}: it reads every rank's slice and keeps its own, so "
                         "only its own would go on to the device", hint="run it with "
                         "run.h2d = \"none\", or the device copies with another layout")
    exchanging = [layout for layout in spec.layouts if layout_of(layout).exchange]
    if "read" not in spec.ops and exchanging:
        raise UsageError(f"{spec.source}: pattern.ops = {list(spec.ops)}: "
                         f"{' and '.join(exchanging)} need a read op (they move the bytes "
                         "they read)")


def _cache_rules(spec: SpecFields) -> None:
    if spec.cache == "direct" and spec.block_bytes % ALIGN_BYTES:
        raise UsageError(f"{spec.source}: checkpoint.block_size = {spec.block_bytes}: "
                         f"run.cache = direct needs a multiple of {ALIGN_BYTES} bytes")
    if spec.checkpoint_source == "existing" and spec.cache == "direct":
        raise UsageError(f"{spec.source}: run.cache = \"direct\" with an existing checkpoint: "
                         "its tensors lie at offsets O_DIRECT cannot read",
                         hint="use cold (evicted pages) instead")
    if spec.ceiling and not capabilities_for(spec.target_path).local_files:
        raise UsageError(f"{spec.source}: run.ceiling = true on {spec.target_path!r}: the "
                         "raw-read ceiling reads the node's files through a POSIX path "
                         "(evicted, mincore), which an object store has not")
    if spec.prefetch_bytes and spec.cache == "direct":
        raise UsageError(f"{spec.source}: checkpoint.prefetch = {spec.prefetch_bytes} with "
                         "run.cache = \"direct\": O_DIRECT reads bypass the page cache the "
                         "prefetch fills", hint="use cold, or checkpoint.prefetch = 0")
    if spec.prefetch_bytes and not capabilities_for(spec.target_path).local_files:
        raise UsageError(f"{spec.source}: checkpoint.prefetch = {spec.prefetch_bytes} on "
                         f"{spec.target_path!r}: the prefetch asks the kernel's page cache "
                         "(posix_fadvise), which only a POSIX path has",
                         hint="checkpoint.prefetch = 0")
    if spec.drop_caches and spec.cache != "cold":
        raise UsageError(f"{spec.source}: run.drop_caches = true needs run.cache = \"cold\"")


def _check_rules(spec: SpecFields) -> None:
    if spec.check_finite and spec.from_path:
        raise UsageError(f"{spec.source}: run.check_finite with checkpoint.from: the copy "
                         "holds the source's tensors of every dtype end to end, so checking "
                         "them as one dtype flags good values", hint="use run.verify")
    if spec.check_finite and "read" not in spec.ops:
        raise UsageError(f"{spec.source}: run.check_finite = true needs a read op in pattern.ops")
    if spec.verify != "none" and "read" not in spec.ops:
        raise UsageError(f"{spec.source}: run.verify = {spec.verify!r} needs a read op in "
                         "pattern.ops")


def _format_rules(spec: SpecFields) -> None:
    if (spec.format != "raw" or spec.check_finite) and spec.block_bytes % 4:
        raise UsageError(f"{spec.source}: checkpoint.block_size = {spec.block_bytes}: tensors "
                         "(a format other than raw, or run.check_finite) need a multiple of 4 "
                         "bytes, so blocks start on element boundaries")
    if spec.format == "hdf5" and not capabilities_for(spec.target_path).local_files:
        raise UsageError(f"{spec.source}: checkpoint.format = \"hdf5\" on {spec.target_path!r}: "
                         "HDF5 files are read through a POSIX path (h5py); object stores take "
                         "raw or safetensors")
    if spec.format == "hdf5" and spec.dtype == "bfloat16":
        raise UsageError(f"{spec.source}: checkpoint.dtype = \"bfloat16\": HDF5 has no "
                         "bfloat16 type", hint="use float16 or float32 with hdf5")


def _save_rules(spec: SpecFields) -> None:
    if spec.part_bytes is not None and spec.part_bytes < MIN_PART_BYTES:
        raise UsageError(f"{spec.source}: save.part_size = {spec.part_bytes}: object stores "
                         f"take parts of at least 5 MiB ({MIN_PART_BYTES} bytes)",
                         hint='for example save.part_size = "64MiB", or unset for one PUT')


def _device_rules(spec: SpecFields) -> None:
    """run.exchange and run.h2d = cuda-gds: what they can move, and where from."""
    exchanging = [layout for layout in spec.layouts if layout_of(layout).exchange]
    if spec.exchange == "torch" and (spec.checkpoint_source == "existing" or not exchanging):
        what = "an existing checkpoint's assign policies" if spec.checkpoint_source == \
            "existing" else f"checkpoint.layout = {list(spec.layouts)}"
        raise UsageError(f"{spec.source}: run.exchange = \"torch\" moves the shard of the "
                         f"broadcast and striped layouts; {what} exchange nothing",
                         hint="add broadcast or striped to checkpoint.layout, or leave "
                              "run.exchange = \"mpi\"")
    node_scatter = [layout for layout in spec.layouts if layout_of(layout).exchange == "scatter"]
    if spec.exchange == "torch" and node_scatter and spec.checkpoint_source != "existing":
        raise UsageError(f"{spec.source}: run.exchange = \"torch\" with "
                         f"{', '.join(node_scatter)}: its node's reader sends each rank its "
                         "slice point to point, over MPI only",
                         hint="leave run.exchange = \"mpi\" for it, or run it in a job of "
                              "its own")
    if spec.h2d != "cuda-gds":
        return
    if not capabilities_for(spec.target_path).local_files:
        raise UsageError(f"{spec.source}: run.h2d = \"cuda-gds\" on {spec.target_path!r}: "
                         "cuFile reads POSIX files", hint="use cuda-pinned for object stores")
    if exchanging and spec.exchange == "mpi":
        raise UsageError(f"{spec.source}: run.h2d = \"cuda-gds\" with {', '.join(exchanging)}: "
                         "the bytes land in HBM, and the MPI exchange moves host memory",
                         hint='--set run.exchange=torch (nccl moves device memory)')


def _prefix_rules(spec: SpecFields) -> None:
    """checkpoint.copies and key_prefix: an object store's keys, spread over its partitions
    (a file system has no per-prefix request rate to spread over)."""
    given = [f"{key} = {value!r}" for key, value, default in (
        ("checkpoint.copies", spec.copies, 1), ("checkpoint.key_prefix", spec.key_prefix, "none"))
        if value != default]
    if not given:
        return
    what = " and ".join(given)
    if not capabilities_for(spec.target_path).object_store:
        raise UsageError(f"{spec.source}: {what} on {spec.target_path!r}: prefixes spread "
                         "an object store's requests over its partitions; this target is "
                         "not one", hint="use an s3:// target, or leave checkpoint.copies = 1 "
                                         "and key_prefix = \"none\"")
    if spec.checkpoint_source == "existing" or spec.from_path:
        raise UsageError(f"{spec.source}: {what} with an existing checkpoint (or "
                         "checkpoint.from): its keys are its own", hint="leave them unset")
    plain = [layout for layout in spec.layouts if layout_of(layout).workload_files]
    if plain:
        raise UsageError(f"{spec.source}: {what} with checkpoint.layout {', '.join(plain)}: "
                         "its files are the workload's, under their own names")
    if spec.copies > 1 and spec.restore_from == "saved":
        raise UsageError(f"{spec.source}: checkpoint.copies = {spec.copies} with run.restore = "
                         "\"saved\": a save writes one copy; the copies are prepare's",
                         hint="run.restore = \"prepared\" (or \"auto\": copies > 1 restores the "
                              "prepared checkpoint)")
    if spec.key_prefix == "none":
        return
    unspread = [layout for layout in spec.layouts
                if layout_of(layout).one_file or layout_of(layout).listing]
    if unspread:
        raise UsageError(f"{spec.source}: checkpoint.key_prefix = {spec.key_prefix!r} with "
                         f"checkpoint.layout {', '.join(unspread)}: one object has no shards "
                         "to spread, and a listing lists one prefix (hashed keys lie under many)",
                         hint="run those layouts in a job without key_prefix")


def _stripe_rules(spec: SpecFields) -> None:
    # A backend striping through its own client (cephfs://) is CephFS: known before any
    # I/O, unlike a mount's kind (a -1 there is a note, as on any kind that cannot use it).
    if spec.stripe_count < 0 and capabilities_for(spec.target_path).stripes:
        raise UsageError(f"{spec.source}: target.stripe_count = {spec.stripe_count} on "
                         f"{spec.target_path!r}: -1 is Lustre's \"every OST\"; CephFS "
                         "stripes a file over a number of objects",
                         hint="target.stripe_count = N (objects), or 0 for CephFS's default")
