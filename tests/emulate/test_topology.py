"""The plan of an emulated cluster (pure): names, addresses, shaping, the launcher."""

from __future__ import annotations

import subprocess

import pytest

from stampede.emulate.topology import (
    Link,
    build_commands,
    hosts_file,
    launcher_script,
    mpiexec_arguments,
    owner_of,
    plan_cluster,
    shaping,
)
from stampede.errors import UsageError

ID = "0123abcd"


def test_every_host_has_its_own_address_and_names_carry_the_cluster_id() -> None:
    plan = plan_cluster(ID, 3, 2, Link(0.1), Link(0.05))
    assert [h.name for h in plan.hosts] == ["head", "node0", "node1", "node2", "storage"]
    addresses = [h.address for h in plan.hosts]
    assert len(set(addresses)) == 5 and all(a.startswith("198.18.0.") for a in addresses)
    assert all(owner_of(netns) == ID for netns in plan.namespaces)
    assert plan.namespaces[-1] == plan.switch            # removed last
    assert plan.nranks == 6 and plan.hydra_hosts == "node0:2,node1:2,node2:2"
    assert owner_of("stampede-probe12-x") is None and owner_of("other-0123abcd-node0") is None
    assert "198.18.0.11 node1" in hosts_file(plan).splitlines()


def test_links_are_shaped_both_ways_and_nothing_goes_to_the_machines_own_network() -> None:
    plan = plan_cluster(ID, 2, 1, Link(0.1), Link(0.05, 2.0))
    commands = build_commands(plan)
    # every command names one of the cluster's namespaces: none touches the machine's own
    assert all(command[:3] == ["ip", "netns", "add"] or command[1] == "-n" for command in commands)
    assert all(command[-1].startswith("stampede-") or command[1] == "-n" for command in commands)
    tbf = [command for command in commands if "tbf" in command]
    assert len(tbf) == 2 * 3                        # node0, node1, storage: each direction
    rates = {command[command.index("rate") + 1] for command in tbf}
    assert rates == {"800000000bit", "400000000bit"}  # GB/s x 8
    assert sum("netem" in command for command in commands) == 2   # storage only, 2 ways
    assert shaping(Link()) == []


@pytest.mark.parametrize(("nodes", "ranks"), [(0, 1), (2, 0)])
def test_a_cluster_of_nothing_is_a_usage_error(nodes: int, ranks: int) -> None:
    with pytest.raises(UsageError, match="at least 1"):
        plan_cluster(ID, nodes, ranks)


@pytest.mark.parametrize(("gbps", "latency_ms"), [(0.0, 0.0), (-1.0, 0.0), (1e4, 0.0),
                                                  (None, -1.0)])
def test_impossible_links_are_refused(gbps: float | None, latency_ms: float) -> None:
    with pytest.raises(ValueError):
        Link(gbps, latency_ms)


def test_the_launcher_takes_hydras_ssh_arguments(tmp_path) -> None:
    """The launcher as hydra calls it (`-x HOST "COMMAND"`): it picks the node's namespace;
    an unknown host is refused (run with `ip` replaced by echo: no namespace needed)."""
    plan = plan_cluster(ID, 2, 2)
    script = tmp_path / "ssh"
    script.write_text(launcher_script(plan).replace("exec ip netns exec", "exec echo"))
    script.chmod(0o755)
    shown = subprocess.run([str(script), "-x", "-o", "BatchMode=yes", "node1", "proxy --a 1"],
                           capture_output=True, text=True, check=True).stdout
    assert shown.startswith(f"stampede-{ID}-node1 unshare --uts sh -c")
    assert shown.rstrip().endswith("node1 proxy --a 1")
    refused = subprocess.run([str(script), "-x", "node9", "proxy"], capture_output=True, text=True)
    assert refused.returncode == 255 and "no node named 'node9'" in refused.stderr
    assert mpiexec_arguments(plan, str(script))[-2:] == ["-hosts", "node0:2,node1:2"]
