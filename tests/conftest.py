"""Fixtures: the real stampede command (under the venv's own mpiexec for tests marked
`mpi`), real checkpoints other tools wrote, and a FUSE guard. Helpers are in
tests/helpers/."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers import checkpoints, requires
from tests.helpers.jobs import RUN_TIMEOUT_S

# The real S3 server's fixtures (s3_server for the session, s3_env per test).
pytest_plugins = ["tests.helpers.s3server", "tests.helpers.cluster"]


@pytest.fixture
def stampede(tmp_path: Path, request: pytest.FixtureRequest
             ) -> Callable[..., subprocess.CompletedProcess[str]]:
    """stampede(*args, np=N): run the CLI, under mpiexec -n N when N is given. A test that
    launches ranks must carry the `mpi` marker (`pytest -m "not mpi"` then leaves it out)."""

    def launch(*args: str, np: int | None = None, timeout: float = RUN_TIMEOUT_S,
               cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "stampede", *args]
        if np is not None:
            if request.node.get_closest_marker("mpi") is None:
                pytest.fail(f"{request.node.nodeid} launches mpiexec without the mpi marker")
            mpiexec = find_mpiexec()
            if mpiexec is None:
                pytest.fail("mpiexec not found: pip install -e '.[mpi,test]'")
            command = [mpiexec, "-n", str(np), *command]
        # Output to a pipe, as in a batch log: pytest's own COLUMNS (80) is not the
        # user's; the tests of reports at 80 columns set it themselves.
        environment = {name: value for name, value in os.environ.items()
                       if name not in ("COLUMNS", "LINES")}
        environment.update(env or {})
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or tmp_path, env=environment)

    return launch


@pytest.fixture
def fuse_ready() -> None:
    """The test mounts a FUSE file system: skip (fail in CI) where that cannot be done."""
    requires.fuse()


@pytest.fixture
def no_mount_left(tmp_path: Path) -> Iterator[None]:
    """The test ends with nothing mounted under its directory, whatever happened."""
    from stampede.emulate.mount import force_unmount

    yield
    left = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(str(tmp_path))]
    for mountpoint in left:
        force_unmount(Path(mountpoint))
    assert not left, f"mounts left behind: {left}"


# --- real checkpoints that stampede did not write (tests/helpers/checkpoints.py), made once ---

@pytest.fixture(scope="session")
def published() -> Path:
    return checkpoints.published_safetensors()


@pytest.fixture(scope="session")
def sharded(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.reshard_safetensors(published, tmp_path_factory.mktemp("sharded"))


@pytest.fixture(scope="session")
def hdf5_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    requires.module("h5py", "HDF5")
    return checkpoints.write_hdf5(tmp_path_factory.mktemp("hdf5")).parent


@pytest.fixture(scope="session")
def dcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.write_dcp(tmp_path_factory.mktemp("dcp"))


@pytest.fixture(scope="session")
def torch_bin(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.write_torch_bin(published, tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="session")
def tensorizer_file(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoints.write_tensorizer(published, tmp_path_factory.mktemp("tensorizer"))
