"""`stampede project`: a contention model of the restore (and of the save, below), fitted to
archived runs at a few rank counts and projected to a rank count that cannot be run.

The model, per layout (N ranks leave the start barrier together):

  metadata stall   T_meta(N) = max( k (RTT + s),  RTT + s N k / c_eff )
  data             T_data(N) = b max(storage / B_agg, node / B_node, rank / min(B_client, B_net))
                               + b exchange / B_node + T_read_meta(N)
  reads' requests  T_read_meta(N) = T_meta(N; k + q) - T_meta(N; k)
  time to last rank     T(N) = F + T_meta(N) + T_data(N)

  k        metadata ops each rank issues before its data flows: stat_count + open_count
           per file, + 1 list (list-first), + 1 index (metadata-first); taken from the
           archive as count / (nranks x iterations) of the stat/open/list/index rows, and
           projected by fitting each op's count per iteration as a N + b (list-bcast
           lists once per job, not per rank)
  I        the ranks that issue them: N, except where only a group's readers touch storage
           (leader-reads layouts: broadcast, node-once, owners), whose members wait for
           their reader: I = the readers (storage / rank of the layout's traffic: one per
           node for node-once). The burst is I ranks of k N / I ops each, so T_meta is
           taken at (I, k N / I): the same drain N k s / c, but a reader's unsaturated
           stall is its own k N / I ops in series (node-once's reader: its stat and open,
           whatever N; an average of k = 2 / N per rank put it at 2 / N of them). The
           measured stall and the reads' time are per reader too (x N / I)
  RTT      one metadata op's round trip outside the server (client, network)
  s, c     server time of one op, and the server's threads (ops in service at once)
  c_eff    c, except 1 for the shared layout: every rank's stat and open land on the one
           file's inode, and one server (one Lustre MDT, one S3 prefix) serialises them
           (the save's: its directories' locks, below)
  q        the metadata requests the reads make (a kernel checking the file's size: NFS,
           FUSE, CephFS GETATTRs), in metadata ops per issuing rank (I): they queue at the
           same server as the k ops, so a faster server shortens them too. Fitted from the
           read's own latency: how much of its growth with N follows the metadata ops'
           (stampede.model.fit)
  F        the last rank's time outside its timed ops (fixed_s): from the phase's start
           (its node's first rank out of the start barrier) until it is done, less the
           sum of its ops' durations: its own exit from the barrier (late where ranks
           outnumber cores), Python between ops, the phase's bookkeeping. Measured, not
           fitted: each run's sidecar timeline has every rank's done time and the seconds
           it spent in ops per iteration; a point's F is that of each iteration's last rank,
           the median over iterations (stampede.model.series; 0 where no sidecar says).
           The fit takes it off each run's time before fitting the data term, and the
           projection carries the F of the run nearest the target rank count (the largest
           run's beyond them): F is measured, not modelled in N, so a target past the runs
           can need more of it. It dominates millisecond restores (0.01-0.16 ms at 1-2
           ranks, 0.3-5 ms at 3-4 ranks on 2 cores, against reads of 0.1 ms:
           bench/advisor_check.py); the band spans the runs' smallest and largest F.
           Restores only: a save's timeline also sums ops after it is durable
  storage, node, rank, exchange
           the layout's bytes (in units of b) through the storage, the busiest node's NIC
           (its reads, then the exchange between nodes), one reader: stampede.model.traffic
           from the layout, N, the ranks per node k and the replicas R. All ranks reading
           their shard on one node: storage = node = N, rank = 1, exchange = 0, so T_data =
           b / min(B_agg / N, B_client, B_net)
  B_agg    aggregate storage bandwidth; B_client one client's; B_node one node's NIC (each
           direction; only runs on several nodes tell it from B_agg: give it with --node-gbps
           otherwise); B_net one client's network (indistinguishable from B_client in runs
           on one network: give it with --net-gbps)

Why T_meta has this shape: each rank issues its k ops one after another. While the
server keeps up, each costs RTT + s, so the rank's stall is k (RTT + s). Once the burst
exceeds capacity (N ranks with an op in flight each outrun c threads), the server drains
the burst's N k services c at a time: the last reply comes RTT + N k s / c after the
start. (The issue wrote RTT + s + N k s / c; the first op's s is already one of the N k
drained, so it is not added twice.) With --threads given (a server of known c, such as
`stampede emulate-mds`) the drain is counted in whole rounds, s ceil(N k / c): within a
few % of a simulated closed-loop FIFO server with a constant s at N = 1..8, where the
continuous form misses by up to ~20% near the knee. predict(params, nranks, layout) is
the model alone, for parameters known beforehand (such a validation).

The fit (least squares on relative errors, numpy):
1. Points: per layout, the configuration of its latest valid restore row (the columns that
   change what an op costs; the replica count is the point's own), and the latest run of
   it at each rank and node count (stampede.model.series says which rows were fitted and
   why the others were left out). Fewer than three distinct rank counts is refused: two
   points fit a line through anything.
2. Metadata: the measured stall at N is sum over ops of k_op x lat_p50 (the median rank's
   metadata time; under a saturated closed loop with k >= 2 it approaches the drain, for
   k = 1 a FIFO burst's median is about half of it: the band adds the fit on each op's
   lat_max, the slowest rank's reading, stampede.model.projection). (RTT, s, c) are
   fitted: for each c (a log grid from 1 to 1e6, refined by golden section; c_eff = 1 for
   shared) and each
   split of the rank counts into unsaturated / saturated, the model is linear in
   (RTT, s); the combination with the least error wins (ties: the smaller c). When no
   rank count saturated the server, the points fix only RTT + s, and the fit takes the
   most pessimistic split they allow: as much of it server time s as keeps every run
   unsaturated (RTT = 0 unless c is fixed), with the fewest threads c that do (the knee
   at the largest run). The output says so: the projected stall is then an upper bound.
   Known --rtt-s, --service-s, --threads are held fixed.
3. Reads' requests: q, least squares of the read's measured time per rank (reads per rank x
   its lat_p50) against the metadata ops' measured time per op, both as growth over the
   smallest run, and only when some run saturated the server (else 0: the read's growth is
   the bandwidth's). Both grow in N k s / c once the server is saturated, so the part of
   the read's time that grows in step is the server's; bytes read at B_agg grow linearly
   too, so a run both saturating the server and bandwidth-bound credits the server with
   both (the data's time then shrinks with s in the sizing, which it would not).
   Data: (T(N) - T_meta model(N) - T_read_meta model(N)) / bytes_per_rank = max(storage /
   B_agg, node / B_node, rank / B_client) + exchange / B_node, fitted in (1/B_agg,
   1/B_node, 1/B_client) (stampede.model.traffic.fit_rates). A rate no run was limited by
   is only bounded below: the bound (where it would start to limit the run closest to it;
   for B_agg, the largest run exactly at the limit) is used, and the projected time is
   marked as an upper bound. B_node is left out when every run was on one node.
   Each run's F is taken off its time before the data fit, and added back to its model.
4. Residuals: measured against fitted time to last rank and stall at every rank count.
5. Band (stampede.model.projection): the envelope of the projections of the data fit
   repeated on time_to_last_rank_min_s and _max_s (run-to-run noise carried to N), of
   leave-one-out refits (four or more rank counts), of the metadata fits that miss no run
   by more than its iteration spread (the fastest and slowest drain s/c among them: a
   drain resting on one saturated run is not pinned by it), of the metadata fit on the
   stall read as the slowest rank's (each op's lat_max: the median's reading sits below
   the drain the model projects), of the runs' smallest and largest F, and of each limit
   the runs only bounded, or reached at one run, taken as never reached. It is not a
   confidence interval of the model: no band from a few small runs bounds an
   extrapolation thousands of times beyond them.
Each layout is printed with its configuration (job, backend, fs_type, cache, pattern,
stat_count, open_count), and warm-cache or oversubscribed runs are noted.

The save (`stampede project --phase save`): the same model on `stampede save` rows, the
time to last rank being the save's (from the phase's start until the last rank's bytes
are durable under their final names: completion op `save`), the metadata ops mkdir,
create, open (a shared file's other writers), rename and fsync_dir by default (--op +fsync
adds fsync, or +close: a server whose fsync is a commit request, as emulate-mds --fsync-s is),
the data term the writes and their fsyncs. What serialises them is the directory's lock:
create, rename (and mkdir) change a directory's entries, which a server does one at a
time per directory (a local file system's VFS and an NFS server through it; on one node
the client's kernel does it too), and fsync_dir syncs that one directory. Every save
layout but fan-out puts all its files in one directory: c_eff = 1 (one directory's lock);
fan-out spreads them over checkpoint.fanout directories: c_eff = min(c, fanout). A
server with parallel directory operations (Lustre's MDS creating distinct names in one
directory at once) does not serialise them: there the one-directory projection is an
upper bound. Validation, the publish and retention come after the time to durable and are
not projected.

A CephFS target whose runs kept the MDS's own counts (the sidecar's mds_requests) gets a
second answer beside this fit, from the server's counters instead of stampede's latencies:
the MDS's requests per op at the target (fitted a N + b over the runs) times its own mean
latency of each, drained in series by the one active MDS (stampede.model.mds_drain).

Limits: one server (a file system with several metadata targets spreads a sharded
checkpoint's ops over them: c is then their total, while a shared file still sits on
one); metadata ops are taken to come before data, the reads' own requests (q) queueing
behind them (lock traffic during reads and close are not modelled, nor here an object
store's 503 SlowDown: its request-rate limit is the request-rate table's,
stampede.model.prefix_rate; the save's writes have no q); client dentry/inode caches hit
after the first iteration and flatten T_meta; a warm page cache measures memory, not storage;
ranks outnumbering cores (a laptop sweep) make CPU contention look like server
contention; exchanges within a node are folded into the data term's rates (shared memory:
not a resource of its own), those between nodes follow MPICH's algorithms as traffic says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stampede.layouts import EACH_READS, TABLE
from stampede.model.traffic import MODELS, Geometry, data_seconds, traffic

METADATA_OPS = ("list", "index", "stat", "open")
SAVE_METADATA_OPS = ("mkdir", "create", "open", "rename", "fsync_dir")
SAVE_OPS = ("mkdir", "create", "open", "fsync", "close", "rename", "fsync_dir")   # --op may name
PHASES = ("restore", "save")       # each phase's completion op is its own name


@dataclass(frozen=True)
class Params:
    """The model's parameters for one layout on one storage system (seconds, bytes/s)."""

    rtt_s: float
    service_s: float
    threads: float
    agg_bps: float = math.inf
    client_bps: float = math.inf
    net_bps: float = math.inf
    node_bps: float = math.inf       # one node's NIC, each direction
    ops_per_rank: float = 2.0        # k at the rank count predicted
    bytes_per_rank: float = 0.0      # at the rank count predicted
    whole_rounds: bool = False       # drain in whole rounds of s (a server of known c)
    locks: float | None = None       # the locks the ops spread over (lock_count); None: the
                                     # restore's, from the layout
    ranks_per_node: int = 0          # at the rank count predicted (0: all on one node)
    replicas: int = 1                # at the rank count predicted
    broadcast_group: str = "replica"
    read_ops_per_rank: float = 0.0   # q: the reads' requests that queue at the metadata
                                     # server, in metadata ops per issuing rank
                                     # (fit.read_queue_ops)
    fixed_s: float = 0.0             # F: the last rank's time outside its timed ops (measured)


@dataclass(frozen=True)
class Prediction:
    layout: str
    nranks: int
    meta_s: float
    data_s: float        # the reads and the exchange
    limit: str           # which bandwidth sets the reads: B_agg, B_node, B_client, B_net
    saturated: bool      # the metadata burst exceeds the server's capacity
    rate_bps: float      # the per-rank rate of the reads
    exchange_s: float = 0.0    # of data_s: between nodes, through the NICs
    nnodes: int = 1
    read_meta_s: float = 0.0   # of data_s: the reads' requests at the metadata server
    fixed_s: float = 0.0       # F: the last rank's time outside its timed ops

    @property
    def total_s(self) -> float:
        return self.fixed_s + self.meta_s + self.data_s

    @property
    def bound_by(self) -> str:
        """The largest part of the time to last rank, and the resource behind it."""
        parts = {"the metadata server": self.meta_s + self.read_meta_s,
                 f"the reads, through {self.limit}":
                     self.data_s - self.exchange_s - self.read_meta_s,
                 "the exchange between nodes, through B_node": self.exchange_s,
                 "the time outside the timed ops (F)": self.fixed_s}
        return max(parts, key=lambda name: parts[name])


def lock_count(layout: str, phase: str = "restore", fanout: int = 0) -> float:
    """How many locks a layout's metadata ops spread over, each taken one op at a time
    (inf: none binds). Restore: the shared file's inode (1), else none. Save: the
    directories its files' entries change in: fan-out's `fanout`, every other layout's 1."""
    described = TABLE.get(layout)   # None: an existing checkpoint's assign policy
    if phase == "save":
        return float(fanout) if described is not None and described.fanout_dirs and fanout > 0 \
            else 1.0
    return 1.0 if described is not None and described.shared_inode else math.inf


def issuers(layout: str, geometry: Geometry) -> float:
    """I: the ranks that issue a layout's metadata ops (and its reads): every rank, or
    where only readers touch storage (leader_reads), the readers (storage / rank)."""
    described = TABLE.get(layout)
    if described is None or not described.leader_reads:
        return float(geometry.nranks)
    flow = traffic(layout, geometry)
    return min(max(flow.storage / flow.rank, 1.0), geometry.nranks) if flow.rank > 0 \
        else float(geometry.nranks)


def per_issuer(layout: str, geometry: Geometry) -> float:
    """N / I: how many times a rank's average of ops (or of their time) one issuer has."""
    return geometry.nranks / issuers(layout, geometry)


def burst(layout: str, geometry: Geometry, ops_per_rank: float) -> tuple[float, float]:
    """(I, k N / I): the ranks that issue the metadata ops, and each one's ops, from k, the
    average over all ranks."""
    issuing = issuers(layout, geometry)
    return issuing, ops_per_rank * geometry.nranks / issuing


def effective_threads(layout: str, threads: float, locks: float | None = None) -> float:
    """c_eff = min(c, the locks the ops spread over): 1 for the restore's shared inode and
    the save's one directory."""
    return min(threads, lock_count(layout) if locks is None else locks)


def metadata_stall(nranks: float, ops_per_rank: float, rtt_s: float, service_s: float,
                   threads: float, whole_rounds: bool = False) -> float:
    """T_meta = max(k (RTT + s), RTT + s N k / c): alone, or draining the burst."""
    if ops_per_rank <= 0:
        return 0.0
    rounds = nranks * ops_per_rank / threads
    if whole_rounds:
        rounds = math.ceil(rounds - 1e-9)
    return max(ops_per_rank * (rtt_s + service_s), rtt_s + service_s * rounds)


def read_queue_time(nranks: float, ops_per_rank: float, read_ops: float, rtt_s: float,
                    service_s: float, threads: float, whole_rounds: bool = False) -> float:
    """T_read_meta: what the reads' q requests add, queued at the same server as the k
    metadata ops (the burst is k + q per rank): T_meta(k + q) - T_meta(k)."""
    if read_ops <= 0:
        return 0.0
    return (metadata_stall(nranks, ops_per_rank + read_ops, rtt_s, service_s, threads,
                           whole_rounds)
            - metadata_stall(nranks, ops_per_rank, rtt_s, service_s, threads, whole_rounds))


def is_saturated(nranks: float, ops_per_rank: float, rtt_s: float, service_s: float,
                 threads: float, whole_rounds: bool = False) -> bool:
    alone = ops_per_rank * (rtt_s + service_s)
    return ops_per_rank > 0 and metadata_stall(nranks, ops_per_rank, rtt_s, service_s, threads,
                                               whole_rounds) > alone * (1 + 1e-6)


def data_time(nranks: float, bytes_per_rank: float, agg_bps: float, client_bps: float,
              net_bps: float = math.inf) -> float:
    """T_data of N ranks on one node each reading its shard: b / min(B_agg / N, B_client,
    B_net)."""
    read, _, _ = data_seconds(MODELS[EACH_READS](Geometry(int(nranks))), bytes_per_rank,
                              agg_bps, math.inf, min(client_bps, net_bps))
    return read


def predict(params: Params, nranks: int, layout: str) -> Prediction:
    """Time to last rank = F + T_meta + T_data at `nranks` for `layout`, from known
    parameters."""
    threads = effective_threads(layout, params.threads, params.locks)
    geometry = Geometry(nranks, params.ranks_per_node, params.replicas, params.broadcast_group)
    issued = burst(layout, geometry, params.ops_per_rank)
    meta = metadata_stall(*issued, params.rtt_s, params.service_s, threads, params.whole_rounds)
    read_meta = read_queue_time(*issued, params.read_ops_per_rank, params.rtt_s,
                                params.service_s, threads, params.whole_rounds)
    client = min(params.client_bps, params.net_bps)
    read, exchange, limit = data_seconds(traffic(layout, geometry), params.bytes_per_rank,
                                         params.agg_bps, params.node_bps, client)
    if limit == "B_client" and params.net_bps < params.client_bps:
        limit = "B_net"
    rate = params.bytes_per_rank / read if read > 0 else math.inf
    return Prediction(layout=layout, nranks=nranks, meta_s=meta,
                      data_s=read + exchange + read_meta, read_meta_s=read_meta,
                      limit=limit, rate_bps=rate, exchange_s=exchange, nnodes=geometry.nnodes,
                      fixed_s=params.fixed_s,
                      saturated=is_saturated(*issued, params.rtt_s, params.service_s, threads,
                                             params.whole_rounds))
