"""What a rank prepares, untimed, for one save of one version (`SaveSetup`): built by
stampede.run.save, read by the timed save (stampede.run.save_pattern, save_files,
save_objects) and its validation (stampede.run.save_checks)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stampede import mpi
from stampede.backends.base import Backend
from stampede.buffers import AlignedBuffer
from stampede.checkpoint.plan import Extent
from stampede.checkpoint.save_plan import SavePlan
from stampede.run.where import Where


@dataclass
class SaveSetup:
    """What a rank prepares, untimed, for one save (one version) of one layout."""

    plan: SavePlan
    backend: Backend
    paths: dict[str, object]        # relpath -> the backend's name (files, partials, dirs)
    model: AlignedBuffer            # the shard in memory, this version's content
    check: AlignedBuffer            # one block: validation re-reads into it
    block_bytes: int
    world: mpi.Comm
    group: mpi.Comm | None = None   # striped: the ranks writing one shard's file
    staging: AlignedBuffer | None = None   # save.mode = async: the copy written from
    direct: bool = False
    durable: bool = True            # save.durability = fsync
    part_bytes: int | None = None   # object stores: save.part_size (None: one PUT per file)
    mkdir_every: bool = False       # save.mkdir = every
    validate: str = "xxh3"          # none | sha256 | xxh3 | finite
    finite_dtype: str = ""          # validate = finite: the elements' dtype
    expected: dict[Extent, str] = field(default_factory=dict)   # validate's hash per extent
    headers: dict[str, memoryview] = field(default_factory=dict)   # relpath -> header bytes
    bases: dict[str, dict[str, int]] = field(default_factory=dict)  # relpath -> tensor -> offset
    index: memoryview | None = None     # metadata-first, rank 0: the index's bytes
    pointer: str = ""               # rank 0: the layout's pointer (relpath) and its bytes
    pointer_bytes: bytes = b""
    # rank 0 on an object store: the pointer's ETag when this version began (None: there was
    # none), the condition of the publish's PUT (stampede.run.save_objects)
    pointer_etag: str | None = None
    spine: tuple[str, ...] = ()     # rank 0: directories fsynced before the publish
    releasing: bool = False         # versions are released after a publish (every rank)
    releases: tuple[str, ...] = ()  # this rank's share of the released versions' files
    release_dirs: tuple[str, ...] = ()   # rank 0: their directories, deepest first
    deadline_ns: int = 0
    owned: list[AlignedBuffer] = field(default_factory=list)   # buffers of this version alone
    where: Where | None = None      # --trace: each op's file and offset (kept over versions)
