"""A real one-node Slurm on this machine, for tests: munged, slurmctld and slurmd.

Started as /work/shared/notes/services.md says (a generated slurm.conf on 127.0.0.1 in a
directory the caller owns, MPI through pmi2), and stopped by the PIDs recorded at start,
never by name. Its two ports (slurmctld's, slurmd's) are drawn free from PORT_RANGE, not
Slurm's fixed 6817/6818, so that two suites on one machine each have a cluster; a start
that loses a port race (a daemon's "Address already in use") is tried again on others.

Job ids start at a random FirstJobId, not at 1: MPICH names a step's shared-memory
segment after its PMI job id (/dev/shm/mpich_shm_<FNV-1a of "JOBID.STEP">_<node>), an
aborted step leaves that file behind, and a later step with the same id on a fresh
cluster attached to it and failed in MPI_Init ("UCX ERROR failed to unpack address,
invalid bandwidth 0.00"). stop() removes the segments of this cluster's own steps.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo")
PORT_RANGE = (16_000, 19_999)       # apart from the S3 servers' (tests/helpers/s3server.py)
START_TRIES = 3
PORT_TAKEN = "Address already in use"
POLL_S = 0.25
START_TIMEOUT_S = 30.0
MAX_FIRST_JOB_ID = 60_000_000       # below Slurm's MaxJobId (67,043,328)
MAX_STEPS = 64                      # step ids whose MPICH segments stop() looks for
STOP_TIMEOUT_S = 10.0

SLURM_CONF = """\
ClusterName=stampede-test
FirstJobId={first_job_id}
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/run/munge.socket.2
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
StateSaveLocation={base}/spool/ctld
SlurmdSpoolDir={base}/spool/slurmd
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmi2
ReturnToService=2
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} Sockets=1 CoresPerSocket={cpus} ThreadsPerCore=1 \
RealMemory={memory_mib} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmUnavailable(Exception):
    """Slurm is not installed here, or could not be started: the reason to skip."""


@dataclass
class SlurmCluster:
    base: Path
    host: str
    cpus: int
    pids: dict[str, int] = field(default_factory=dict)
    ready: bool = False        # sinfo said idle: slurmctld answers

    @property
    def conf(self) -> Path:
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (and the jobs: they inherit it)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def client(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=self.env)

    def logs(self) -> str:
        """The tail of every daemon's log, for a failure message."""
        parts = []
        for log in sorted((self.base / "log").glob("*")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def wait_for_job(self, job_id: str, timeout_s: float = 120) -> None:
        """Poll squeue until the job has left the queue (no busy loop)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            queued = self.client("squeue", "-h", "-j", job_id)
            if queued.returncode == 0 and not queued.stdout.strip():
                return
            time.sleep(POLL_S)
        raise TimeoutError(f"Slurm job {job_id} still queued after {timeout_s} s\n{self.logs()}")

    def queue(self) -> str:
        return self.client("squeue", "-h").stdout.strip()

    def job_ids(self) -> list[str]:
        """Every job slurmctld knows, finished ones included (kept for MinJobAge, 300 s)."""
        shown = self.client("scontrol", "-o", "show", "jobs").stdout
        return re.findall(r"^JobId=(\d+)", shown, flags=re.MULTILINE)

    def stop(self) -> list[str]:
        """Stop every daemon by its PID (SIGTERM, SIGKILL after a while); return the
        slurmstepd processes of this cluster that were still left (killed, by PID)."""
        jobs = []
        if self.ready:                 # a test that failed mid-job: end its jobs first
            self.client("scancel", "--user", str(os.geteuid()))
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self.queue() and time.monotonic() < deadline:
                time.sleep(POLL_S)
            jobs = self.job_ids()
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _terminate(pid)
        left = self.stepds()
        for pid in left:
            _terminate(pid)
        _remove_mpich_segments(jobs)
        return [f"slurmstepd pid {pid}" for pid in left]

    def stepds(self) -> list[int]:
        """slurmstepd processes started by this cluster's slurmd (they carry its SLURM_CONF)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip().startswith("slurmstepd") and \
                        mine in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
        return found


def _fnv1a(text: str) -> str:
    """MPICH's world id: the 32-bit FNV-1a hash of the PMI job id, in hex."""
    value = 2166136261
    for byte in text.encode():
        value = (value ^ byte) * 16777619 % 2**32
    return f"{value:x}"


def _remove_mpich_segments(jobs: list[str]) -> None:
    """Remove the /dev/shm segments that aborted steps of these jobs left behind (a
    step that ends normally removes its own); never one that a process still maps."""
    ours = {_fnv1a(f"{job}.{step}") for job in jobs for step in range(MAX_STEPS)}
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            mapped.update(line.rsplit("/", 1)[-1] for line in maps.read_text().splitlines()
                          if "/dev/shm/mpich_" in line)
    for segment in Path("/dev/shm").glob("mpich_*_*_*"):
        if segment.name.split("_")[2] in ours and segment.name not in mapped:
            segment.unlink(missing_ok=True)


def _terminate(pid: int) -> None:
    """SIGTERM one process we started, SIGKILL if it outlives STOP_TIMEOUT_S; reap it."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(POLL_S / 5)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_S / 5)


def _alive(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)   # our child: reap it
        if finished:
            return False
    except ChildProcessError:
        pass                                        # not our child (munged daemonizes)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":   # exited just now: reap it if it is ours
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _check_prerequisites() -> None:
    missing = [name for name in DAEMONS if shutil.which(name, path=_sbin_path()) is None]
    if missing:
        raise SlurmUnavailable(f"not installed: {', '.join(missing)} "
                               "(apt-get install -y slurm-wlm munge)")
    if os.geteuid() != 0:
        raise SlurmUnavailable("the test cluster runs its daemons as root (SlurmUser=root)")


def choose_ports() -> tuple[int, int]:
    """Two distinct ports of PORT_RANGE that nothing holds now."""
    chosen: list[int] = []
    while len(chosen) < 2:
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in chosen:
            chosen.append(port)
    return chosen[0], chosen[1]


def _sbin_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _which(name: str) -> str:
    found = shutil.which(name, path=_sbin_path())
    assert found is not None
    return found


def _memory_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 // 2   # below the real memory, as slurmd wants
    return 1024


def start(base: Path, timeout_s: float = START_TIMEOUT_S) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under `base`; return once sinfo says idle.

    munged refuses a socket whose every parent directory is not world-searchable, so
    `base` must not lie under a private directory (pytest's tmp_path does): use
    tempfile.mkdtemp() in /tmp. Raises SlurmUnavailable (after stopping whatever did
    start) if Slurm cannot start."""
    _check_prerequisites()
    host = socket.gethostname().split(".")[0]   # `hostname -s`: the node's name
    cluster = SlurmCluster(base=base, host=host, cpus=os.cpu_count() or 1)
    for attempt in range(START_TRIES):
        for sub in ("etc", "munge", "run", "log", "spool"):   # afresh: a try that lost
            shutil.rmtree(base / sub, ignore_errors=True)     # its ports left its files
        for sub in ("etc", "munge", "run", "log", "spool/ctld", "spool/slurmd"):
            (base / sub).mkdir(parents=True, exist_ok=True)
        (base / "munge").chmod(0o700)
        for public in (base, base / "run"):    # munged refuses a socket dir without o+x
            public.chmod(0o755)
        cluster.conf.write_text(SLURM_CONF.format(
            host=host, base=base, ports=choose_ports(), cpus=cluster.cpus,
            memory_mib=_memory_mib(), first_job_id=random.randrange(1000, MAX_FIRST_JOB_ID)))
        try:
            _start_daemons(cluster, timeout_s)
            return cluster
        except SlurmUnavailable as reason:
            cluster.stop()
            if PORT_TAKEN not in str(reason) or attempt + 1 == START_TRIES:
                raise
        except BaseException:
            cluster.stop()
            raise
    raise AssertionError("unreachable")


def _setup_step(command: list[str], cluster: SlurmCluster, timeout_s: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise SlurmUnavailable(f"{Path(command[0]).name} failed (exit {done.returncode}): "
                               f"{done.stderr.strip()}\n{cluster.logs()}")


def _start_daemons(cluster: SlurmCluster, timeout_s: float) -> None:
    base = cluster.base
    key = base / "munge" / "munge.key"
    _setup_step([_which("mungekey"), "-c", "-k", str(key)], cluster, timeout_s)
    munged_pid = base / "run" / "munged.pid"
    _setup_step([_which("munged"), "-S", str(base / "run" / "munge.socket.2"),
                 f"--key-file={key}", f"--log-file={base / 'log' / 'munged.log'}",
                 f"--pid-file={munged_pid}", f"--seed-file={base / 'munge' / 'munged.seed'}"],
                cluster, timeout_s)
    cluster.pids["munged"] = int(munged_pid.read_text())   # munged daemonizes: its pid file
    for name in ("slurmctld", "slurmd"):
        with open(base / "log" / f"{name}.out", "wb") as log:
            daemon = subprocess.Popen([_which(name), "-D", "-f", str(cluster.conf)],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      env=cluster.env, start_new_session=True)
        cluster.pids[name] = daemon.pid
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        for name in ("slurmctld", "slurmd"):
            if not _alive(cluster.pids[name]):
                raise SlurmUnavailable(f"{name} exited at start:\n{cluster.logs()}")
        state = cluster.client("sinfo", "-h", "-o", "%T").stdout.strip()
        if state == "idle":
            cluster.ready = True
            return
        time.sleep(POLL_S)
    raise SlurmUnavailable(f"the node is not idle after {timeout_s} s (sinfo: {state!r}):\n"
                           f"{cluster.logs()}")
