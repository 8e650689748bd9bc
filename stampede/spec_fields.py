"""A job's values once parsed: the fields of stampede.spec.JobSpec (SpecFields), below both
spec and spec_rules, so the rules that span several options read the job spec builds and
hands them, and spec imports the rules one way. Each field's option (key, parser, help,
column) is defined once, in stampede.spec.OPTIONS."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction


@dataclass(frozen=True)
class SpecFields:
    """What a job asks for, parsed and validated (stampede.spec.JobSpec adds what needs the
    option table: the CSV columns, the command to repeat it)."""

    name: str
    source: str
    target_path: str
    checkpoint_source: str
    assign: tuple[str, ...]
    from_path: str
    storage_options: dict[str, object]
    stripe_count: int
    stripe_size_bytes: int | None
    size_total_bytes: int | None
    size_per_rank_bytes: int | None
    layouts: tuple[str, ...]
    workload: str
    scale: Fraction
    subset: bool
    replicas: int
    broadcast_group: str
    index_bytes: int
    block_bytes: int
    prefetch_bytes: int
    format: str
    dtype: str
    ops: tuple[str, ...]
    stat_count: int
    open_count: int
    order: str
    iterations: int
    warmup: int
    cache: str
    drop_caches: bool
    ceiling: bool
    rank_shift: int
    jitter: str
    seed: int
    h2d: str
    exchange: str
    max_error_fraction: float
    samples: str
    deadline_s: float
    verify: str
    check_finite: bool
    fanout: int
    copies: int
    key_prefix: str
    save_mode: str
    durability: str
    validate: str
    keep: int
    mkdir_by: str
    part_bytes: int | None
    tier_dir: str
    tier_peers: int
    tier_placement: str
    spare_nodes: int
    lost_nodes: int
    tier_publish: str
    tier_drain: str
    tier_versions: int
    keep_local: int
    keep_peer: int
    keep_storage: int
    restore_from: str
    archive_path: str
    values: Mapping[str, object] = field(default_factory=dict)  # key -> value, for display
    overrides: tuple[str, ...] = ()     # the --set texts, as given: to repeat a command
    trace_limit: int = 0                # --trace: the most its trace may hold (0: no trace)
