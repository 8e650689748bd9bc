"""What a CephFS metadata server counts: its `perf dump` (mds_server's req_<op>_latency,
the mds section's requests and capability messages), asked with a bound, and the deltas
between two dumps (pure). Two callers: a cephfs:// backend asks through its own rank's
client (stampede.run.mds_counts); a POSIX target on a ceph-fuse or kernel CephFS mount
asks through a client made from the node's own Ceph config, the one the mount used
(stampede.filesystems' counters hook), or the `ceph` CLI where no client can be made.

libcephfs waits for a command's answer without a limit (a dead MDS stays in the map until
its beacons are missed), so the question is asked from a thread and given up after the
bound: the thread is left waiting (a daemon: it keeps no process alive)."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

from stampede.errors import StampedeError
from stampede.libcephfs import Mount

Counters = dict[str, object]
KEY = "mds_requests"   # the sidecar's key, in each layout
NODE_TIMEOUT_S = 20    # a POSIX target has no storage_options.timeout_s: this bound instead
DEFAULT_CONF = Path("/etc/ceph/ceph.conf")
# the mds section's totals kept beside the per-op requests: a shared-file storm shows in
# the capabilities the MDS had to revoke from one client to grant another
TOTALS = {"request": "requests", "reply": "replies", "ceph_cap_op_revoke": "caps_revoked",
          "ceph_cap_op_grant": "caps_granted", "handle_client_caps": "cap_messages"}


def perf_dump(client: Mount, timeout_s: float, mds_spec: str = "*") -> Counters:
    """The MDS's perf dump over the wire (as `ceph tell mds.* perf dump`; several active
    MDSs: the first's), asked through `client`; TimeoutError after `timeout_s`."""
    answer: list[object] = []

    def ask() -> None:
        try:
            answer.append(client.mds_command(mds_spec, {"prefix": "perf dump"}))
        except OSError as error:
            answer.append(error)

    asking = threading.Thread(target=ask, name="stampede-mds-perf", daemon=True)
    asking.start()
    asking.join(timeout_s)
    if not answer:
        raise TimeoutError(errno.ETIMEDOUT, f"no answer from the MDS within {timeout_s:g} s",
                           "perf dump")
    if isinstance(answer[0], OSError):
        raise answer[0]
    return _json(str(answer[0]))


def node_conf() -> Path | None:
    """The node's Ceph config, as a ceph-fuse mount found it: $CEPH_CONF, else
    /etc/ceph/ceph.conf (None: neither is a file)."""
    named = os.environ.get("CEPH_CONF")
    for candidate in (Path(named) if named else None, DEFAULT_CONF):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def node_perf_dump(timeout_s: float = NODE_TIMEOUT_S) -> Counters | str:
    """The MDS's perf dump asked from this node as its CephFS mount was made: a libcephfs
    client from the node's config (its keyring, its user: client.admin unless it says
    otherwise), else `ceph tell mds.* perf dump`; where neither answers, why (a line)."""
    conf = node_conf()
    if conf is None:
        return ("not counted: no Ceph config on this node ($CEPH_CONF, "
                f"{DEFAULT_CONF}) to ask the MDS with")
    import subprocess  # rank 0 of a CephFS mount alone: every rank imports this module

    why = []
    try:
        return _through_libcephfs(conf, timeout_s)
    except (OSError, ValueError, ImportError) as error:
        why.append(f"libcephfs: {_said(error)}")
    except StampedeError as error:   # libcephfs is not installed
        why.append(f"libcephfs: {error}")
    try:
        return _through_cli(conf, timeout_s)
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        why.append(f"ceph tell: {_said(error)}")
    return f"not counted: the MDS did not answer ({'; '.join(why)})"


_clients: dict[Path, Mount] = {}   # one per config, kept: its own mount is not a layout's


def _through_libcephfs(conf: Path, timeout_s: float) -> Counters:
    """Asked through one client of the node's config, made at the first question and kept
    to the process's end (it gives its session back then): a client made per question
    would add its own mount's requests to every layout's counts."""
    client = _clients.get(conf)
    if client is None:
        bound = str(max(1, round(timeout_s)))
        settings = {"client_mount_timeout": bound, "rados_mon_op_timeout": bound,
                    "rados_osd_op_timeout": bound, "client_shutdown_timeout": bound,
                    # its errors are this line's, not lines on stderr
                    "err_to_stderr": "false", "log_to_stderr": "false"}
        client = _clients[conf] = Mount(settings, str(conf), None, None)
    try:
        return perf_dump(client, timeout_s)
    except TimeoutError:   # the client waits on: the next question gets a new one
        del _clients[conf]
        raise


def _through_cli(conf: Path, timeout_s: float) -> Counters:
    import shutil
    import subprocess

    if shutil.which("ceph") is None:
        raise FileNotFoundError(errno.ENOENT, "the ceph CLI is not installed", "ceph")
    done = subprocess.run(
        ["ceph", "--conf", str(conf), "--connect-timeout", str(max(1, round(timeout_s))),
         "tell", "mds.*", "perf", "dump"],
        capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise OSError(errno.EIO, f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return _json(done.stdout)


def _json(text: str) -> Counters:
    """The first JSON object of a dump (`ceph tell mds.*` puts 'mds.a: ' before it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError(f"no perf dump in the answer: {text[:200]!r}")
    found, _ = json.JSONDecoder().raw_decode(text[start:])
    if not isinstance(found, dict):
        raise ValueError("the perf dump is not a JSON object")
    return found


def _said(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror + (f" ({error.filename})" if error.filename else "")
    return str(error) or type(error).__name__


def deltas(start: Counters, end: Counters) -> dict[str, object]:
    """Pure: per op the requests the MDS handled between two perf dumps and their mean
    latency (ms), busiest first; the mds section's TOTALS moved."""
    restarted = _count(_section(end, "mds"), "request") < _count(_section(start, "mds"), "request")
    if restarted:   # a new MDS process: its counters began at zero after `start`
        start = {}
    first, last = _section(start, "mds_server"), _section(end, "mds_server")
    ops: dict[str, dict[str, float]] = {}
    for key, now in last.items():
        if not (key.startswith("req_") and key.endswith("_latency") and isinstance(now, dict)):
            continue
        then = first.get(key)
        then = then if isinstance(then, dict) else {}
        count = int(now.get("avgcount", 0)) - int(then.get("avgcount", 0))
        if count > 0:
            seconds = float(now.get("sum", 0.0)) - float(then.get("sum", 0.0))
            ops[key[len("req_"):-len("_latency")]] = {
                "requests": count, "mean_ms": round(seconds / count * 1e3, 6)}
    before_mds, after_mds = _section(start, "mds"), _section(end, "mds")
    totals = {name: _count(after_mds, key) - _count(before_mds, key)
              for key, name in TOTALS.items()}
    return {"ops": dict(sorted(ops.items(), key=lambda item: -item[1]["requests"])), **totals,
            **({"restarted": "the MDS restarted during the layout: counts since its restart"}
               if restarted else {})}


def _section(dump: Counters, name: str) -> dict[str, object]:
    found = dump.get(name)
    return found if isinstance(found, dict) else {}


def _count(section: dict[str, object], key: str) -> int:
    value = section.get(key, 0)
    return value if isinstance(value, int) else 0
