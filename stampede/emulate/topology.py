"""The plan of an emulated cluster on one machine (pure: names, addresses, shaping, the
commands that build it, the hosts file, the launcher hydra calls). stampede.emulate.cluster
runs it.

Every host is a network namespace `stampede-<id>-<host>` with one NIC, `eth0`: one end of
a veth pair whose other end, `p-<host>`, is a port of the bridge `br0` in the switch's
namespace `stampede-<id>-switch`. Both ends are created inside the namespaces, so nothing
is added to the machine's own network: the links live and die with the namespaces. What
the machine does see is each namespace's name (/run/netns/<name>) and its hosts file
(/etc/netns/<name>/hosts, which `ip netns exec` binds over /etc/hosts, so the hosts find
each other by name), and both carry the cluster's id: a cleanup pass finds them.

  head      mpiexec and the user's command run here (an unshaped link): the login node
  node0..   the compute nodes, k ranks each; the NIC shaped to the node link
  storage   the object store, behind the storage link

A link's shaping holds in each direction (a full-duplex NIC): on the host's egress (eth0)
and on the bridge port's egress toward the host, so a node of B GB/s uploads and downloads
at B each, and a latency L is added to each crossing (a round trip between two hosts
crosses four: 2 (L_a + L_b)). Rates are tc's token bucket (tbf), delays netem's. Addresses
come from 198.18.0.0/24 by default (RFC 2544: set aside for benchmarking networks); every
cluster can use the same range, for no two clusters share a namespace.

Ranks are launched by hydra (MPICH's mpiexec) through its ssh launcher, with a program of
ours as `ssh`: it starts the host's proxy in the host's network namespace and a UTS
namespace of its own whose hostname is the host's name, so MPI sees one node per host
(COMM_TYPE_SHARED, processor names) and the ranks of two nodes talk over their NICs.
"""

from __future__ import annotations

import ipaddress
import math
import shlex
from dataclasses import dataclass

from stampede.errors import UsageError
from stampede.units import BYTES_PER_GB, BYTES_PER_KIB, BYTES_PER_MIB, MS_PER_S

NETNS_PREFIX = "stampede-"          # every namespace: stampede-<id>-<host>
BRIDGE = "br0"
NIC = "eth0"
DEFAULT_SUBNET = "198.18.0.0/24"
HEAD, STORAGE = "head", "storage"
FIRST_NODE_HOST = 10                # node i is the subnet's address 10 + i
MAX_GBPS = 400.0
# MPI between nodes over TCP on eth0: UCX would otherwise find the other "node" on the
# same machine (one boot id) and use shared memory or CMA, and no byte would cross a NIC.
# Ranks of one node still use MPICH's shared memory, as on a real node.
MPI_ENVIRONMENT = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": NIC, "FI_PROVIDER": "tcp"}


@dataclass(frozen=True)
class Link:
    """How one host's link is shaped, each direction: None = as fast as the machine."""

    gbps: float | None = None
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.gbps is not None and not (0 < self.gbps <= MAX_GBPS):
            raise ValueError(f"link rate {self.gbps} GB/s: must be > 0 and <= {MAX_GBPS:g}")
        if not (0 <= self.latency_ms < 10_000) or math.isnan(self.latency_ms):
            raise ValueError(f"link latency {self.latency_ms} ms: must be >= 0 and < 10 s")

    @property
    def shaped(self) -> bool:
        return self.gbps is not None or self.latency_ms > 0

    def describe(self) -> str:
        rate = "unshaped" if self.gbps is None else f"{self.gbps:g} GB/s"
        return rate + (f", +{self.latency_ms:g} ms each way" if self.latency_ms else "")


@dataclass(frozen=True)
class Host:
    """One namespace of the cluster: its name (hostname and /etc/hosts), its address."""

    name: str
    netns: str
    address: str
    port: str           # its veth end on the bridge, in the switch namespace
    link: Link
    slots: int = 0      # ranks it runs (compute nodes only)


@dataclass(frozen=True)
class ClusterPlan:
    cluster_id: str
    switch: str                     # the namespace holding the bridge
    head: Host
    nodes: tuple[Host, ...]
    storage: Host | None
    prefix_length: int

    @property
    def hosts(self) -> tuple[Host, ...]:
        return (self.head, *self.nodes, *((self.storage,) if self.storage else ()))

    @property
    def namespaces(self) -> tuple[str, ...]:
        """Every namespace, the switch last (removing it last keeps the bridge to the end)."""
        return (*(host.netns for host in self.hosts), self.switch)

    @property
    def nranks(self) -> int:
        return sum(node.slots for node in self.nodes)

    @property
    def hydra_hosts(self) -> str:
        """mpiexec's -hosts: node0:2,node1:2 (ranks fill node0 first, then node1, ...)."""
        return ",".join(f"{node.name}:{node.slots}" for node in self.nodes)

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no host {name!r} in cluster {self.cluster_id} "
                       f"(hosts: {', '.join(h.name for h in self.hosts)})")


def netns_name(cluster_id: str, host: str) -> str:
    return f"{NETNS_PREFIX}{cluster_id}-{host}"


def owner_of(name: str) -> str | None:
    """The cluster id in a namespace or directory name of ours, else None."""
    if not name.startswith(NETNS_PREFIX):
        return None
    cluster_id, dash, host = name[len(NETNS_PREFIX):].partition("-")
    return cluster_id if dash and host and is_cluster_id(cluster_id) else None


def is_cluster_id(text: str) -> bool:
    """Ids are 8 lowercase hex digits (stampede.emulate.cluster draws them)."""
    return len(text) == 8 and all(c in "0123456789abcdef" for c in text)


def plan_cluster(cluster_id: str, nodes: int, ranks_per_node: int, node_link: Link = Link(),
                 storage_link: Link | None = Link(), subnet: str = DEFAULT_SUBNET) -> ClusterPlan:
    """N nodes of k ranks, a head and (unless storage_link is None) a storage host."""
    if not is_cluster_id(cluster_id):
        raise ValueError(f"cluster id {cluster_id!r}: must be 8 lowercase hex digits")
    network = ipaddress.ip_network(subnet)
    if nodes < 1 or ranks_per_node < 1:
        raise UsageError(f"--nodes {nodes} --ranks-per-node {ranks_per_node}: both must be "
                         "at least 1")
    if network.num_addresses < FIRST_NODE_HOST + nodes + 2:
        raise UsageError(f"{subnet}: too small for {nodes} nodes (node i takes address "
                         f"{FIRST_NODE_HOST} + i)")

    def host(name: str, index: int, link: Link, slots: int = 0) -> Host:
        return Host(name=name, netns=netns_name(cluster_id, name),
                    address=str(network.network_address + index), port=f"p-{name}", link=link,
                    slots=slots)

    return ClusterPlan(
        cluster_id=cluster_id, switch=netns_name(cluster_id, "switch"), head=host(HEAD, 1, Link()),
        nodes=tuple(host(f"node{i}", FIRST_NODE_HOST + i, node_link, ranks_per_node)
                    for i in range(nodes)),
        storage=host(STORAGE, 2, storage_link) if storage_link is not None else None,
        prefix_length=network.prefixlen)


def shaping(link: Link) -> list[list[str]]:
    """tc arguments (after `tc -n NETNS`, with DEV for the device) that shape one direction:
    netem for the delay at the root, a token bucket under it for the rate."""
    commands: list[list[str]] = []
    parent = ["root"]
    if link.latency_ms > 0:
        commands.append(["qdisc", "add", "dev", "DEV", "root", "handle", "1:", "netem", "delay",
                         f"{link.latency_ms:g}ms", "limit", "100000"])
        parent = ["parent", "1:1"]
    if link.gbps is not None:
        rate_bytes = link.gbps * BYTES_PER_GB
        # The bucket: 1 ms of the rate (at least 32 KiB, so a full-size frame always fits);
        # the queue: 100 ms of it (at least 1 MiB), so TCP keeps the link busy rather than
        # halving its window at every burst of eight ranks' requests.
        burst = max(int(rate_bytes / MS_PER_S), 32 * BYTES_PER_KIB)
        limit = max(int(rate_bytes / 10), BYTES_PER_MIB)
        commands.append(["qdisc", "add", "dev", "DEV", *parent, "handle", "10:", "tbf", "rate",
                         f"{int(rate_bytes * 8)}bit", "burst", str(burst), "limit", str(limit)])
    return commands


def build_commands(plan: ClusterPlan) -> list[list[str]]:
    """Every ip and tc command that builds the cluster, in order (each namespace is created
    before anything goes into it)."""
    switch = plan.switch
    commands = [["ip", "netns", "add", switch],
                ["ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge"],
                ["ip", "-n", switch, "link", "set", BRIDGE, "up"]]
    for host in plan.hosts:
        commands += [
            ["ip", "netns", "add", host.netns],
            ["ip", "-n", switch, "link", "add", "name", host.port, "type", "veth", "peer", "name",
             NIC, "netns", host.netns],
            ["ip", "-n", switch, "link", "set", host.port, "master", BRIDGE, "up"],
            ["ip", "-n", host.netns, "addr", "add", f"{host.address}/{plan.prefix_length}",
             "dev", NIC],
            ["ip", "-n", host.netns, "link", "set", NIC, "up"],
            ["ip", "-n", host.netns, "link", "set", "lo", "up"],
        ]
        for netns, device in ((host.netns, NIC), (switch, host.port)):
            commands += [["tc", "-n", netns, *[device if word == "DEV" else word for word in tc]]
                         for tc in shaping(host.link)]
    return commands


def hosts_file(plan: ClusterPlan) -> str:
    """/etc/hosts inside every namespace of the cluster."""
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{host.address} {host.name}" for host in plan.hosts]
    return "\n".join(lines) + "\n"


def in_host(host: Host, argv: list[str]) -> list[str]:
    """A command run as on `host`: in its network namespace, with its hostname (a UTS
    namespace of its own)."""
    return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', host.name, *argv]


def launcher_script(plan: ClusterPlan) -> str:
    """The program hydra runs as ssh: `LAUNCHER [ssh options] HOST COMMAND...`. It drops the
    options and runs COMMAND on HOST (in_host), with MPI between nodes over TCP."""
    cases = "\n".join(f"  {node.name}) netns={shlex.quote(node.netns)} ;;" for node in plan.nodes)
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in MPI_ENVIRONMENT.items())
    return f"""#!/bin/sh
# hydra's ssh launcher for stampede emulate-cluster {plan.cluster_id}:
#   THIS [ssh options] HOST COMMAND...  ->  COMMAND on HOST's namespaces, hostname HOST
while [ $# -gt 0 ]; do
  case "$1" in
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
case "$host" in
{cases}
  *) echo "emulate-cluster {plan.cluster_id}: no node named '$host'" >&2; exit 255 ;;
esac
export {exports}
exec ip netns exec "$netns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
"""


def mpiexec_arguments(plan: ClusterPlan, launcher: str) -> list[str]:
    """What goes after mpiexec to spread its ranks over the nodes (then -n N and the program)."""
    return ["-launcher", "ssh", "-launcher-exec", launcher, "-hosts", plan.hydra_hosts]
