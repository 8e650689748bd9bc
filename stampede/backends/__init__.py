"""Storage backends: one module each, one small contract, chosen by the target.

The registry is data (like fsspec's `known_implementations`): a backend's module is only
imported when a job uses it, and a missing optional dependency is reported with the
command that installs it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from stampede.backends.base import Backend
from stampede.errors import UsageError, install_hint

S3_HINT = install_hint("s3")
FSSPEC_HINT = install_hint("fsspec")


@dataclass(frozen=True)
class BackendEntry:
    module: str
    cls: str
    install_hint: str
    requires: tuple[str, ...] = ()   # packages imported up front, so a missing one is named


REGISTRY: dict[str, BackendEntry] = {
    "posix": BackendEntry("stampede.backends.posix", "PosixBackend", ""),
    "s3": BackendEntry("stampede.backends.s3", "S3Backend", S3_HINT, ("botocore",)),
    "gs": BackendEntry("stampede.backends.fsspec", "FsspecBackend", "pip install gcsfs",
                       ("fsspec", "gcsfs")),
    "gcs": BackendEntry("stampede.backends.fsspec", "FsspecBackend", "pip install gcsfs",
                        ("fsspec", "gcsfs")),
    "memory": BackendEntry("stampede.backends.fsspec", "FsspecBackend", FSSPEC_HINT,
                           ("fsspec",)),
    "nfs": BackendEntry("stampede.backends.nfs", "NfsBackend",
                        "apt-get install libnfs13 (Debian/Ubuntu; dnf install libnfs on RHEL)"),
    "file": BackendEntry("stampede.backends.fsspec", "FsspecBackend", FSSPEC_HINT,
                         ("fsspec",)),
}


def backend_name_for(target_path: str) -> str:
    """Which backend serves a target: a URL's scheme, or posix for a plain path."""
    scheme, sep, _ = target_path.partition("://")
    if not sep:
        return "posix"
    if scheme not in REGISTRY or scheme == "posix":
        raise UsageError(f"target.path = {target_path!r}: no backend for {scheme}:// "
                         f"(available: a POSIX path, or "
                         f"{', '.join(f'{name}://' for name in sorted(REGISTRY) if name != 'posix')})")
    return scheme


def open_backend(target_path: str, storage_options: dict[str, Any] | None = None) -> Backend:
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
