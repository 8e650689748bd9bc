"""Real loaders beside the storage ceiling (`stampede loaders`): the libraries ML jobs load
checkpoints with, each timed on every rank from the start barrier until the rank's last
tensor is in memory, over the same assignment stampede's own restore reads.

The registry is data, as the backends' is: a loader's module is imported only when it runs,
and a loader whose package is missing is skipped with the install hint, never run as
something else. Each module offers:

  prepare(comm, work, device) -> state   untimed, collectively: what a job has before it
                                         loads (a process group, an empty state_dict)
  load(state, record) -> held            timed: the loader's own calls, each phase it
                                         exposes stamped with record(op, start_ns, bytes)
  release(state)                         untimed, after each load (buffers it kept)
  finish(state)                          untimed, once at the end

`held` maps a name to each tensor (or slice) the rank holds at the end, for the digests.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from stampede.errors import install_hint


@dataclass(frozen=True)
class LoaderEntry:
    name: str                     # on the command line and in the backend column
    module: str                   # stampede.run.loaders.<module>
    formats: tuple[str, ...]      # the catalogue formats it reads (existing.catalogue)
    packages: tuple[str, ...]     # what must import for it to run
    extra: str                    # the setup.cfg extra that installs it
    phases: tuple[str, ...]       # the ops it times inside the restore, in order
    how: str                      # the calls, as the report's footnote says them


LOADERS = {entry.name: entry for entry in (
    LoaderEntry("safetensors", "safetensors_open", ("safetensors",), ("safetensors", "torch"),
                "loaders-safetensors", ("header", "load", "touch"),
                "safe_open(framework='pt', device) per file (header), get_tensor or "
                "get_slice per tensor (load), on the host one byte of every page of the "
                "mapped tensors read (touch)"),
    LoaderEntry("torch.load", "torch_load", ("torch",), ("torch",), "loaders-torch",
                ("load",), "torch.load(map_location=device, weights_only=True) per file"),
    LoaderEntry("dcp", "dcp_load", ("dcp",), ("torch",), "loaders-torch",
                ("index", "plan", "load"),
                "torch.distributed.checkpoint.load over gloo, DefaultLoadPlanner: "
                ".metadata (index), planning collectives (plan), read_data (load)"),
    LoaderEntry("runai", "runai", ("safetensors",), ("runai_model_streamer", "torch"),
                "loaders-runai", ("header", "load"),
                "SafetensorsStreamer.stream_files (header), get_tensors (load)"),
    LoaderEntry("fastsafetensors", "fastsafe", ("safetensors",), ("fastsafetensors", "torch"),
                "loaders-fastsafetensors", ("header", "load", "deserialise"),
                "SafeTensorsFileLoader.add_filenames (header), copy_files_to_device "
                "(load), get_tensor (deserialise)"),
    LoaderEntry("tensorizer", "tensorizer_load", ("tensorizer",), ("tensorizer", "torch"),
                "loaders-tensorizer", ("load",), "TensorDeserializer(path, device) per file"),
)}


def missing_package(entry: LoaderEntry) -> str:
    """Why the loader cannot run here ("" when it can): its package, and how to install it."""
    for package in entry.packages:
        try:
            found = importlib.util.find_spec(package) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{package} is not installed ({install_hint(entry.extra)})"
    return ""


def loader_module(entry: LoaderEntry) -> ModuleType:
    return importlib.import_module(f"stampede.run.loaders.{entry.module}")
