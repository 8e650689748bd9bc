"""`torch.load` of torch.save zips (`*.bin`, `*.pt`), as transformers loads a
`pytorch_model.bin`: `torch.load(path, map_location=device, weights_only=True)` per file,
one call that reads, unpickles and rebuilds every storage (op load: its phases are not
exposed; common.whole_files times it)."""

from __future__ import annotations

from stampede.run.loaders.common import flat_tensors, keeps_nothing, whole_files


def _tensors(path: str, device: str) -> dict[str, object]:
    import torch  # imported by prepare already: a lookup in sys.modules

    return flat_tensors(torch.load(path, map_location=device, weights_only=True))


prepare, load = whole_files("torch", _tensors)
release = finish = keeps_nothing
