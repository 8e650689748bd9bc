"""CoreWeave tensorizer: `TensorDeserializer(path, device=...)` per file, its default
eager load (headers, then every tensor read and made, with its own reader threads; op
load: the phases are inside the constructor; common.whole_files times it)."""

from __future__ import annotations

from stampede.run.loaders.common import keeps_nothing, whole_files


def _tensors(path: str, device: str) -> dict[str, object]:
    from tensorizer import TensorDeserializer  # imported by prepare already

    deserializer = TensorDeserializer(path, device=device)
    tensors = dict(deserializer.items())
    deserializer.close()
    return tensors


prepare, load = whole_files("tensorizer", _tensors)
release = finish = keeps_nothing
