"""What a layout asks of an object store, prefix by prefix: pure, no I/O.

S3 rates each partitioned prefix on its own (at least stampede.targets.S3_PREFIX_RATES_PER_S:
5,500 GET/HEAD and 3,500 PUT/POST a second), so a restore's cost there is its busiest
prefix's requests a second, not its bytes. A key's prefix here is its first component
under the target (under the version's directory for a save): the plain layouts ask
everything of one (sharded/ or shared/), checkpoint.copies = K spreads it over K (copy-k/),
checkpoint.key_prefix = "hash" over one per shard (its hashed first component; S3 meets
them apart once it has partitioned the target).

Each op is what stampede's S3 client sends for it (stampede.backends.s3): stat and open a
HEAD each, a read one ranged GET per block, a formatted file's header a GET (at least: a
header past the first page takes more), the shared index a HEAD and a GET per block, a
listing a LIST per 1,000 names; close sends nothing. A broadcast group's members that do
not lead read nothing. A save (copies = 1) writes each object with one PUT, or with
save.part_size a POST to start it, a PUT per part and a POST to complete it (the
pointer's one PUT aside).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

from stampede.checkpoint.plan import (
    RankPlan,
    checkpoint_files,
    copy_of,
    plan_rank,
    reads_storage,
)
from stampede.layouts import layout_of
from stampede.spec import JobSpec
from stampede.targets import S3_PREFIX_RATES_PER_S

LIST_PAGE_NAMES = 1_000   # names per LIST answer (S3's MaxKeys)
READS = ("GET", "HEAD", "LIST")   # against the prefix's read rate
WRITES = ("PUT", "POST")          # against its write rate


def prefix_of(relpath: str) -> str:
    """A key's prefix: its first component ("copy-1/", "a3f9/", "sharded/"); "" for a key
    at the target's top."""
    head, sep, _ = relpath.partition("/")
    return f"{head}/" if sep else ""


class PrefixLoad(NamedTuple):
    """One layout's requests at its busiest prefix, per restore (and per save)."""

    layout: str
    keys: str                    # how its keys are spread: "plain", "2 copies", "hash", ...
    prefixes: int                # the prefixes its restore's requests meet
    busiest: str                 # the prefix that meets the most of them
    requests: Counter[str]       # at `busiest`, per restore: GET, HEAD, LIST
    restore_s: float             # the restore time the rates are over
    save_prefixes: int = 0       # a save's: 0 when the layout saves none here
    save_busiest: str = ""
    save_writes: int = 0         # PUT and POST at the save's busiest prefix, per save
    copies_for_rate: int | None = 1   # the checkpoint.copies that bring the busiest
                                 # prefix to S3's read rate (None: more than one a rank)

    @property
    def reads(self) -> int:
        return sum(self.requests[method] for method in READS)

    @property
    def reads_per_s(self) -> float:
        return self.reads / self.restore_s

    @property
    def read_share(self) -> float:
        """Of S3's documented GET/HEAD rate per prefix (1.0: at it; above: 503s)."""
        return self.reads_per_s / S3_PREFIX_RATES_PER_S["read"]

    @property
    def writes_per_s(self) -> float:
        return self.save_writes / self.restore_s

    @property
    def write_share(self) -> float:
        return self.writes_per_s / S3_PREFIX_RATES_PER_S["write"]


def _blocks(nbytes: int, block_bytes: int) -> int:
    return -(-nbytes // block_bytes)


def rank_requests(spec: JobSpec, plan: RankPlan, leads: bool,
                  listed_names: int) -> Counter[tuple[str, str]]:
    """(prefix, method) -> requests of one rank's restore (one pass of its pattern)."""
    found: Counter[tuple[str, str]] = Counter()
    ops = plan.ops
    if leads or not plan.leader_reads:
        for relpath in plan.files:
            prefix = prefix_of(relpath)
            found[prefix, "HEAD"] += plan.stat_count * ("stat" in ops) + \
                plan.open_count * ("open" in ops)
            found[prefix, "GET"] += int(plan.formatted and "read" in ops)
        if "read" in ops:
            for extent in plan.extents:
                found[prefix_of(extent.relpath), "GET"] += _blocks(extent.length, plan.block_bytes)
    if plan.index_file:
        found[prefix_of(plan.index_file), "HEAD"] += 1
        found[prefix_of(plan.index_file), "GET"] += _blocks(spec.index_bytes, plan.block_bytes)
    if plan.list_dir and (plan.rank == 0 or not plan.list_on_root):
        found[prefix_of(f"{plan.list_dir}/"), "LIST"] += max(
            1, _blocks(listed_names, LIST_PAGE_NAMES))
    return +found


def restore_requests(spec: JobSpec, layout: str, nranks: int) -> Counter[tuple[str, str]]:
    """(prefix, method) -> requests of one restore by every rank."""
    files = [relpath for relpath, _ in checkpoint_files(spec, layout, nranks)]
    total: Counter[tuple[str, str]] = Counter()
    if layout_of(layout).whole_file:   # every rank of a copy asks the same: one plan each
        readers = Counter(copy_of(spec, rank) for rank in range(nranks))
        for copy, count in readers.items():
            plan = plan_rank(spec, layout, nranks, copy)
            for key, requests in rank_requests(spec, plan, True, 0).items():
                total[key] += requests * count
        return total
    listed = Counter(relpath.rpartition("/")[0] for relpath in files)   # names per directory
    for rank in range(nranks):
        plan = plan_rank(spec, layout, nranks, rank)
        total.update(rank_requests(spec, plan, reads_storage(spec, plan), listed[plan.list_dir]))
    return total


def save_requests(spec: JobSpec, layout: str, nranks: int) -> Counter[tuple[str, str]]:
    """(prefix, method) -> the requests that write a save's objects (its version's)."""
    total: Counter[tuple[str, str]] = Counter()
    for relpath, nbytes in checkpoint_files(spec, layout, nranks):
        prefix = prefix_of(relpath)
        if spec.part_bytes is None:
            total[prefix, "PUT"] += 1
        else:
            total[prefix, "POST"] += 2
            total[prefix, "PUT"] += max(1, _blocks(nbytes, spec.part_bytes))
    return total


def _by_prefix(requests: Counter[tuple[str, str]], methods: tuple[str, ...]) -> Counter[str]:
    found: Counter[str] = Counter()
    for (prefix, method), count in requests.items():
        if method in methods:
            found[prefix] += count
    return found


def keys_of(spec: JobSpec) -> str:
    """How a job spreads its keys, in a few words."""
    parts = [f"{spec.copies} copies"] if spec.copies > 1 else []
    parts += ["hashed"] if spec.key_prefix == "hash" else []
    return ", ".join(parts) or "plain"


def copies_for_rate(busiest_reads: int, copies: int, nranks: int,
                    restore_s: float) -> int | None:
    """The copies that bring a busiest prefix's `busiest_reads` (with `copies` now) to S3's
    read rate over `restore_s`: round-robin divides them by the copies, the keys otherwise
    spread as now. None where more copies than ranks would be needed: a copy's one reader
    already asks past the rate, and no copies help."""
    needed = max(1, math.ceil(busiest_reads * copies /
                              (S3_PREFIX_RATES_PER_S["read"] * restore_s)))
    return needed if needed <= nranks else None


def prefix_load(spec: JobSpec, layout: str, nranks: int, restore_s: float) -> PrefixLoad:
    """The layout's busiest prefix at `nranks` ranks over a restore of `restore_s`."""
    requests = restore_requests(spec, layout, nranks)
    reads = _by_prefix(requests, READS)
    busiest = max(sorted(reads), key=lambda prefix: reads[prefix]) if reads else ""
    at_busiest = Counter({method: count for (prefix, method), count in requests.items()
                          if prefix == busiest})
    load = PrefixLoad(layout, keys_of(spec), len(reads), busiest, at_busiest, restore_s,
                      copies_for_rate=copies_for_rate(sum(at_busiest[m] for m in READS),
                                                      spec.copies, nranks, restore_s))
    if not layout_of(layout).saves or spec.copies > 1:
        return load
    writes = _by_prefix(save_requests(spec, layout, nranks), WRITES)
    saved = max(sorted(writes), key=lambda prefix: writes[prefix])
    return load._replace(save_prefixes=len(writes), save_busiest=saved,
                         save_writes=writes[saved])
