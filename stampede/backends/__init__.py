"""Storage backends: one module each, one small contract, chosen by the target.

The registry is data (like fsspec's `known_implementations`): a backend's module is only
imported when a job uses it, and a missing optional dependency is reported with the
command that installs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from stampede.backends.base import Backend
from stampede.errors import UsageError


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    install_hint: str


REGISTRY: dict[str, BackendEntry] = {
    "posix": BackendEntry("stampede.backends.posix", "PosixBackend", ""),
}


def backend_name_for(target_path: str) -> str:
    """Which backend serves a target: a URL's scheme, or posix for a plain path."""
    scheme, sep, _ = target_path.partition("://")
    if not sep:
        return "posix"
    if scheme not in REGISTRY:
        raise UsageError(f"target.path = {target_path!r}: no backend for {scheme}:// "
                         f"(available: {', '.join(sorted(REGISTRY))})")
    return scheme


def open_backend(target_path: str) -> Backend:
    name = backend_name_for(target_path)
    entry = REGISTRY[name]
    try:
        module = importlib.import_module(entry.module)
    except ImportError as error:
        raise UsageError(f"backend {name!r} needs a package that is not installed ({error.name})",
                         hint=entry.install_hint) from None
    backend: Backend = getattr(module, entry.cls)(target_path)
    return backend
