"""Storage backends: one module each, one small contract (base), chosen by the target
through the registry (stampede.targets): a backend's module is only imported when a job
uses it, and a missing optional dependency is reported with the command that installs it.
"""

from __future__ import annotations

import importlib

from stampede.backends.base import Backend
from stampede.errors import UsageError
from stampede.targets import REGISTRY, backend_name_for

__all__ = ["REGISTRY", "backend_name_for", "open_backend"]

def open_backend(target_path: str, storage_options: dict[str, object] | None = None) -> Backend:
    """The backend for a target, with its client created (untimed). Credentials are never
    in `storage_options`: clients read them from the environment themselves."""
    name = backend_name_for(target_path)
    entry = REGISTRY[name]
    try:
        for package in entry.requires:
            importlib.import_module(package)
        module = importlib.import_module(entry.module)
    except ImportError as error:
        raise UsageError(f"backend {name!r} needs a package that is not installed ({error.name})",
                         hint=entry.install_hint) from None
    backend: Backend = getattr(module, entry.cls)(target_path, dict(storage_options or {}))
    return backend
