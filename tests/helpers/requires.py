"""What a test needs that is optional (a package, a service, root, a FUSE library): where
it is missing the test skips with the reason, except where CI sets the matching
STAMPEDE_REQUIRE_<NAME>=1, which turns that skip into a failure (a green CI run cannot
hide a test that did not run)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

# What CI requires (.ci/run sets each): the names a test may pass as `requirement`.
REQUIREMENTS = ("SLURM", "S3", "NFS", "TORCH", "FUSE", "HDF5", "PLOT", "ROOT", "LOADERS", "NETNS",
                "NETEM", "BROWSER", "DOCS", "CEPH", "OPLOOP")


def unavailable(reason: str, requirement: str) -> NoReturn:
    """Skip with the reason, or fail where STAMPEDE_REQUIRE_<requirement>=1."""
    assert requirement in REQUIREMENTS, requirement
    variable = f"STAMPEDE_REQUIRE_{requirement}"
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason} ({variable}=1: required here)")
    pytest.skip(reason)


def module(name: str, requirement: str, install: str = "pip install -r requirements/test.txt") -> ModuleType:
    """The module, imported; unavailable() when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        unavailable(f"{name} is not installed ({error}): {install}", requirement)


def fuse() -> None:
    """A test that mounts stampede's FUSE file systems (libfuse 3 and mfusepy, as root)."""
    from stampede.emulate.mount import fuse_unavailable

    reason = fuse_unavailable()
    if reason:
        unavailable(reason, "FUSE")


def netns() -> None:
    """A test that builds an emulated cluster (network namespaces, veth, tc; root)."""
    from stampede.emulate.cluster import unavailable as cluster_unavailable

    reason = cluster_unavailable()
    if reason:
        unavailable(reason, "NETNS")


def netem() -> None:
    """A test that delays a link (the kernel's netem qdisc)."""
    netns()
    from stampede.emulate.cluster import netem_unavailable

    reason = netem_unavailable()
    if reason:
        unavailable(reason, "NETEM")
