"""Fixtures: the real stampede command (under the venv's own mpiexec for tests marked
`mpi`), real checkpoints other tools wrote, and a FUSE guard. Helpers are in
tests/helpers/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stampede.launcher import find_mpiexec
from tests.helpers import checkpoints, requires
from tests.helpers.jobs import RUN_TIMEOUT_S

# The real S3 and NFS servers' and Ceph cluster's fixtures (s3_server, nfs_server and
# ceph_cluster for the session; s3_env, nfs_target and cephfs_target per test).
pytest_plugins = ["tests.helpers.s3server", "tests.helpers.nfsserver", "tests.helpers.cephcluster",
                  "tests.helpers.cluster"]

# What makes a test slow is what it launches: ranks under mpiexec (the `mpi` marker), an
# S3 server, a FUSE mount, emulated nodes, a Slurm cluster, a browser, torch's 3-4 s
# import in a subprocess. Such a test is marked `slow` here, by the fixtures it uses, or
# by its module (SLOW_MODULES); `-m "not slow"` leaves the quick tier for the edit loop.
LAUNCHING_FIXTURES = frozenset({"s3_server", "s3_env", "nfs_server", "nfs_target", "ceph_cluster",
                                "cephfs_target", "fuse_ready",
                                "no_mount_left", "nodes", "assessed", "dcp_dir", "dcp4_dir",
                                "torch_bin", "tensorizer_file"})
# ... and the parameters that name one for a fixture to get (request.getfixturevalue)
LAUNCHING_PARAMETERS = frozenset({"s3", "nfs", "cephfs", "dcp_dir", "torch_bin", "tensorizer_file"})
SLOW_MODULES = frozenset({"tests/emulate/test_cluster.py", "tests/commands/test_slurm.py",
                          "tests/commands/test_html.py", "tests/run/test_gpu_check.py"})
# Under pytest-xdist each file's tests go to one worker together (its module fixtures are
# made once), and the files that build emulated nodes (network namespaces) or a Slurm
# cluster share one, so that no two such clusters come and go at once (their tests check
# what is left behind).
WORKER_GROUPS = {"tests/emulate/test_cluster.py": "nodes", "tests/run/test_nodes.py": "nodes",
                 "tests/commands/test_slurm.py": "nodes"}
ROOT = Path(__file__).resolve().parents[1]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduling by scope, a scope being a file or its WORKER_GROUPS group.
    (xdist's own `loadgroup` tags node ids, which pytest 9.2's structured ids ignore.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileOrGroup(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return WORKER_GROUPS.get(module, module)

    return ByFileOrGroup(config, log)


def pytest_sessionstart(session: pytest.Session) -> None:
    """The package's bytecode written once, so that the hundreds of processes the suite
    launches read it rather than compile stampede again each (where the environment sets
    PYTHONDONTWRITEBYTECODE, nothing else would write it: 0.2 s more per process)."""
    import compileall

    if not hasattr(session.config, "workerinput"):      # once, not per xdist worker
        compileall.compile_dir(ROOT / "stampede", quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.relative_to(ROOT).as_posix()
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        parameters = {value for value in (callspec.params.values() if callspec else ())
                      if isinstance(value, str)}
        if (item.get_closest_marker("mpi") or fixtures & LAUNCHING_FIXTURES
                or parameters & LAUNCHING_PARAMETERS or module in SLOW_MODULES):
            item.add_marker(pytest.mark.slow)


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
                pytest.fail("mpiexec not found: pip install -r requirements/test.txt")
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


@pytest.fixture(scope="session", autouse=True)
def sidecars_follow_their_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every run sidecar the session's tests wrote matches results/sidecar-N.schema.json
    (checked once they all ran: a drift fails the session, naming file and field)."""
    from tests.helpers.json_schema import sidecar_problems, written_sidecars

    yield
    broken = {path: found for path, document in written_sidecars(
        tmp_path_factory.getbasetemp()).items() if (found := sidecar_problems(document))}
    assert not broken, "sidecars off their schema:\n" + "\n".join(
        f"{path}: {'; '.join(found[:3])}" for path, found in broken.items())


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


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Path]) -> Path:
    """What `make(directory)` returns, made once for the whole run: under pytest-xdist the
    first worker to ask makes it in the run's shared temporary root (under a lock), the
    others wait and reuse it. For the session fixtures that take seconds (torch's import,
    ranks spawned, a sweep); tests never change what they give."""
    import fcntl

    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                     # pytest-N/, above every worker's popen-gwK/
    made = root / f"{name}.made"               # holds the path `make` returned
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            directory = root / name
            shutil.rmtree(directory, ignore_errors=True)   # a worker that failed half way
            directory.mkdir()
            made.write_text(str(make(directory)))
        return Path(made.read_text())


@pytest.fixture(scope="session")
def dcp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made_once(tmp_path_factory, "dcp", checkpoints.write_dcp)


@pytest.fixture(scope="session")
def dcp4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DCP checkpoint 4 gloo ranks saved: what a resharding restore reads at 2 or 3."""
    return made_once(tmp_path_factory, "dcp4", lambda directory: checkpoints.write_dcp(directory, 4))


@pytest.fixture(scope="session")
def torch_bin(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made_once(tmp_path_factory, "bin",
                     lambda directory: checkpoints.write_torch_bin(published, directory))


@pytest.fixture(scope="session")
def tensorizer_file(published: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return made_once(tmp_path_factory, "tensorizer",
                     lambda directory: checkpoints.write_tensorizer(published, directory))


@pytest.fixture(scope="session")
def assessed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`stampede assess` of a small job at 1, 2 and 3 ranks (real mpiexec, two layouts) to
    a 60 s budget: its report; the archive (report.csv) and sidecars beside it. Shared by the
    tests of assess and html, so that one sweep serves both (tests using it carry `mpi`)."""
    from tests.helpers.jobs import small_job
    from tests.helpers.verdicts import cli

    def sweep(tmp: Path) -> Path:
        job = small_job(tmp, checkpoint={"size": "6MiB", "layout": ["shared", "sharded"]},
                        run={"iterations": 2, "warmup": 1, "verify": "xxh3"})
        report = tmp / "report.html"
        cli("assess", str(job), "--ranks", "1,2,3", "--budget", "60s", "-o", str(report),
            cwd=tmp, timeout=300)
        return report

    return made_once(tmp_path_factory, "assess", sweep)
