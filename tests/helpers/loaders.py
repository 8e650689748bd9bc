"""What the tests of `stampede loaders` share: a loaders run's sidecar, and the digests
each loader's tensors must have, made from the checkpoint by a plain reference read
(safetensors' load_file, torch.load, DCP's own conversion, tensorizer's eager load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import xxhash

from stampede.existing.assign import assign
from stampede.existing.scan import scan
from tests.helpers import requires
from tests.helpers.jobs import sidecars


def loader_package(name: str) -> None:
    """Skip (fail where CI sets STAMPEDE_REQUIRE_LOADERS=1) when a loader's package is missing."""
    from stampede.run.loaders import LOADERS, missing_package

    why = missing_package(LOADERS[name])
    if why:
        requires.unavailable(f"loader {name}: {why}", "LOADERS")


def sidecar(archive: Path) -> dict[str, Any]:
    """The archive's last run's sidecar."""
    found = sidecars(archive)
    assert found, f"no sidecar beside {archive}"
    return dict(found[-1])


def digest(tensor: Any) -> list[Any]:
    import torch

    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return [int(data.nbytes), xxhash.xxh3_128_hexdigest(data)]


def expected_safetensors(checkpoint: Path, policy: str, nranks: int) -> list[dict[str, Any]]:
    """Per rank: tensor -> the digest of the piece the assignment gives it."""
    import torch
    from safetensors.torch import load_file

    catalogue = scan(str(checkpoint))
    root = Path(catalogue.root)
    tensors = {relpath: load_file(root / relpath) for relpath, _ in catalogue.files}
    ranks = []
    for rank in range(nranks):
        pieces = {}
        for extent in assign(catalogue, policy, nranks, rank):
            tensor = tensors[extent.relpath][extent.tensor]
            flat = tensor.reshape(-1).view(torch.uint8) if tensor.dim() else \
                tensor.reshape(1).view(torch.uint8)
            whole = extent.offset == 0 and extent.length == flat.numel()
            pieces[extent.tensor] = digest(tensor if whole else
                                           flat[extent.offset:extent.offset + extent.length])
        ranks.append(pieces)
    return ranks


def expected_whole(state: dict[str, Any], prefix: str) -> dict[str, list[Any]]:
    """A whole file's tensors, named as the loaders of whole files name them."""
    return {f"{prefix}:{name}": digest(tensor) for name, tensor in state.items()}


def expected_dcp(checkpoint: Path, scratch: Path) -> dict[str, list[Any]]:
    """fqn -> digest of the whole tensor, through DCP's own conversion to a torch file."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    converted = scratch / "reference.pt"
    dcp_to_torch_save(str(checkpoint), str(converted))
    state = torch.load(converted, map_location="cpu", weights_only=False)
    return {name: digest(value) for name, value in state.items()
            if isinstance(value, torch.Tensor)}
