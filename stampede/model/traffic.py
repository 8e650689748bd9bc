"""Where a layout's bytes go across nodes (pure): the data term of the contention model
(stampede.model.contention) and its fit, for ranks on several nodes.

N ranks on n nodes of k (ranks fill node 0 first: rank r is on node r div k, as mpiexec
-hosts and Slurm's block distribution place them), R replicas of S = N / R shards, each
rank ending with its shard of b bytes. A phase reads from storage, then (broadcast,
striped) exchanges over MPI. Per phase, the bytes through each shared resource, at its
busiest instance, in units of b:

  storage   all storage reads                          through B_agg (the storage's total)
  node      storage reads into the busiest node        through B_node (one node's NIC)
  rank      one reader's storage reads                 through B_client (and B_net)
  exchange  bytes between nodes through the busiest    through B_node, after the reads
            NIC, one after another

  T_data = b max(storage / B_agg, node / B_node, rank / min(B_client, B_net))
           + b exchange / B_node

  layout                      storage       node            rank   exchange
  shared, sharded, ...        N             k               1      0
  whole-file                  N S           k S             S      0
  broadcast (by replica)      S             leaders on a    1      rounds(g) x groups rooted
                                            node (<= k)            on the busiest node
  broadcast (by node)         per node the  min(k, S)       1      0 (within the node)
                              shards on it
  striped                     N / R         k / R           1 / R  (R - 1) / R per rank of
                                                                   the node whose ring
                                                                   neighbour is elsewhere
  node-once                   n S           S               S      0 (within the node)
  owners                      S             as broadcast by replica (its owners are
                                            replica 0's ranks when the shards are equal)

A broadcast group is the R ranks of one shard, over g nodes. MPICH broadcasts between
nodes along a binomial tree below 8 nodes (ceil(log2 g) rounds, each moving the shard
over every busy NIC once) and by scatter + ring allgather from 8 (2 (g - 1) / g); inside a
node it uses shared memory, taken as free: far faster than a NIC or storage. A striped
group's Allgatherv is a ring over its members in replica order. With one node, node = N
= storage for every layout that reads on all ranks: B_node cannot be told from B_agg,
and is left out (unlimited) unless given.

`fit_rates` fits 1 / B_agg, 1 / B_node and 1 / B_client to measured data times (least
squares on relative errors): which term of the max each point is limited by is chosen
by alternating (assign each point its largest term, refit), from starts that give each
term, and each split of the points between two terms, its turn; the least error wins. A
rate no point was limited by is only bounded: it is set where it would start to limit
the point closest to it (the most pessimistic value the points allow), and marked so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from stampede.layouts import (
    EACH_READS,
    EACH_READS_ALL,
    LEADER_BCAST,
    NODE_ONCE,
    OWNER_BCAST,
    STRIPE_ALLGATHER,
    TABLE,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]   # numpy's, imported inside the functions that solve

EXCHANGE_FREE_NODES = 1
BINOMIAL_BELOW = 8          # MPICH: MPIR_CVAR_BCAST_MIN_PROCS
RESOURCES = ("B_agg", "B_node", "B_client")


@dataclass(frozen=True)
class Geometry:
    """Where the ranks are and how the checkpoint is replicated."""

    nranks: int
    ranks_per_node: int = 0          # 0: all on one node
    replicas: int = 1
    broadcast_group: str = "replica"

    @property
    def per_node(self) -> int:
        k = self.ranks_per_node
        return self.nranks if k <= 0 or k >= self.nranks else k

    @property
    def nnodes(self) -> int:
        return -(-self.nranks // self.per_node)

    @property
    def shards(self) -> int:
        replicas = max(1, min(self.replicas, self.nranks))
        return max(1, self.nranks // replicas)


@dataclass(frozen=True)
class Traffic:
    """Bytes through each resource in one phase, in units of a rank's shard."""

    storage: float
    node: float
    rank: float
    exchange: float


def bcast_rounds(nodes: int) -> float:
    """How many times a shard crosses the busiest NIC when g nodes of a group get it."""
    if nodes <= EXCHANGE_FREE_NODES:
        return 0.0
    if nodes < BINOMIAL_BELOW:
        return float(math.ceil(math.log2(nodes)))
    return 2.0 * (nodes - 1) / nodes


# Each layout's traffic is counted in closed form, never by walking the ranks or the nodes:
# a projection to 10^9 nodes answers as fast as one to 4 (tests/model/test_traffic.py checks
# every count against the walk over the ranks at small sizes).

def _node(geometry: Geometry, rank: int) -> int:
    return rank // geometry.per_node


def _node_sizes(geometry: Geometry) -> tuple[int, int, int]:
    """(full nodes, ranks per full node, ranks on the last partial node (0: none))."""
    k, n = geometry.per_node, geometry.nranks
    return n // k, k, n % k


def _broadcast_by_replica(geometry: Geometry) -> Traffic:
    shards, k = geometry.shards, geometry.per_node
    replicas = geometry.nranks // shards
    if shards >= k:   # node h roots its own shards, each sent to R nodes
        sent = min(k, shards) * bcast_rounds(replicas)
    else:             # every group's root (shard s < S < k) on node 0
        base = (replicas - 1) * shards   # shard s's last replica: rank s + base
        low = base // k                  # its node for the first shards, one more after
        wider = max(0, shards - max(0, (low + 1) * k - base))
        sent = (shards - wider) * bcast_rounds(low + 1) + wider * bcast_rounds(low + 2)
    return Traffic(storage=float(shards), node=float(min(shards, k)), rank=1.0,
                   exchange=float(sent))


def _crossing(geometry: Geometry, node: int) -> int:
    """Ranks on `node` whose ring neighbour (rank - S, mod the ranks) is on another node."""
    shards, k = geometry.shards, geometry.per_node
    total = shards * (geometry.nranks // shards)
    first, end = node * k, min((node + 1) * k, total)
    if first >= end:
        return 0
    # the ranks whose neighbour is on this node: [first + S, end + S), mod total
    low, high = first + shards, end + shards
    same = max(0, min(end, min(high, total)) - max(first, low))        # below the wrap
    if high > total:
        wrapped_low = max(low, total) - total
        same += max(0, min(end, high - total) - max(first, wrapped_low))
    return (end - first) - same


def _striped(geometry: Geometry) -> Traffic:
    shards = geometry.shards
    replicas = geometry.nranks // shards
    k = geometry.per_node
    exchange = 0.0
    if replicas > 1:   # nodes alike but for those at the wrap and the last: those counted
        last = -(-shards * replicas // k) - 1
        turn = max(0, shards * replicas - shards) // k
        candidates = {0, 1, turn - 1, turn, turn + 1, last - 1, last}
        exchange = max(_crossing(geometry, node) for node in candidates if 0 <= node <= last) \
            * (replicas - 1) / replicas
    return Traffic(storage=geometry.nranks / replicas, node=k / replicas, rank=1 / replicas,
                   exchange=exchange)


def _broadcast(geometry: Geometry) -> Traffic:
    if geometry.broadcast_group == "node":
        full, k, rest = _node_sizes(geometry)
        most = min(k if full else rest, geometry.shards)
        total = full * min(k, geometry.shards) + min(rest, geometry.shards)
        return Traffic(storage=float(total), node=float(most), rank=1.0, exchange=0.0)
    return _broadcast_by_replica(geometry)


def _each_reads(geometry: Geometry) -> Traffic:
    return Traffic(storage=float(geometry.nranks), node=float(geometry.per_node),
                   rank=1.0, exchange=0.0)


def _each_reads_all(geometry: Geometry) -> Traffic:
    """Every rank reads every shard (the naive whole-file load), keeping its own."""
    shards = float(geometry.shards)
    return Traffic(storage=geometry.nranks * shards, node=geometry.per_node * shards,
                   rank=shards, exchange=0.0)


def _node_once(geometry: Geometry) -> Traffic:
    """One reader per node reads every shard; its node's ranks get theirs within the node
    (shared memory, taken as free): storage serves the checkpoint once per node."""
    shards = float(geometry.shards)
    return Traffic(storage=geometry.nnodes * shards, node=shards, rank=shards, exchange=0.0)


def _owner_bcast(geometry: Geometry) -> Traffic:
    """Each shard read once, by its owner (with equal shards, its lowest holder: replica
    0's rank, as broadcast by replica), then broadcast to its other holders (none with
    one replica: each rank reads its own, as shared)."""
    return _broadcast_by_replica(geometry)


# stampede.layouts names each layout's model (Layout.traffic)
MODELS: dict[str, Callable[[Geometry], Traffic]] = {
    EACH_READS: _each_reads, EACH_READS_ALL: _each_reads_all, LEADER_BCAST: _broadcast,
    STRIPE_ALLGATHER: _striped, NODE_ONCE: _node_once, OWNER_BCAST: _owner_bcast}


def traffic(layout: str, geometry: Geometry) -> Traffic:
    """The bytes of one phase of `layout` at `geometry` (the module's table); a name that
    is no layout (an existing checkpoint's assign policy: every rank reads its own bytes)
    as EACH_READS."""
    described = TABLE.get(layout)
    return MODELS[described.traffic if described else EACH_READS](geometry)


class LayoutBytes(NamedTuple):
    """What storage serves one layout's restore phase at a geometry (the module's table in
    bytes), beside the unique bytes the job needs (S shards of b)."""

    layout: str
    storage_bytes: float      # read from storage by all ranks
    node_bytes: float         # read from storage into the busiest node
    reader_bytes: float       # read from storage by one reader
    exchange_bytes: float     # through the busiest NIC between nodes, after the reads
    needed_bytes: float       # the unique bytes the job needs

    @property
    def amplification(self) -> float:
        """Bytes read from storage over the bytes needed (stampede.results.amplification)."""
        return self.storage_bytes / self.needed_bytes if self.needed_bytes > 0 else math.nan


def layout_bytes(geometry: Geometry, bytes_per_rank: float) -> list[LayoutBytes]:
    """Every layout's bytes at `geometry`, each rank ending with b = bytes_per_rank: those
    a checkpoint of S shards can be laid out as (not MLPerf's own files; those that need
    replicas only where there are some)."""
    found = []
    for name, described in TABLE.items():
        if described.workload_files or (described.replica_aware and geometry.replicas < 2):
            continue
        flow = traffic(name, geometry)
        found.append(LayoutBytes(name, flow.storage * bytes_per_rank, flow.node * bytes_per_rank,
                                 flow.rank * bytes_per_rank, flow.exchange * bytes_per_rank,
                                 geometry.shards * bytes_per_rank))
    return found


def data_seconds(flow: Traffic, bytes_per_rank: float, agg_bps: float, node_bps: float,
                 client_bps: float) -> tuple[float, float, str]:
    """(read s, exchange s, the resource that limits the reads) for one phase."""
    terms = {"B_agg": flow.storage / agg_bps, "B_node": flow.node / node_bps,
             "B_client": flow.rank / client_bps}
    limit = max(terms, key=lambda name: terms[name])
    if bytes_per_rank <= 0:
        return 0.0, 0.0, limit
    read = bytes_per_rank * terms[limit]
    exchange = bytes_per_rank * flow.exchange / node_bps if flow.exchange else 0.0
    return (read if math.isfinite(read) else 0.0), exchange, limit


# --- the fit ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rates:
    """Fitted inverse rates (seconds per byte) and which were only bounded."""

    agg_s_per_byte: float
    node_s_per_byte: float
    client_s_per_byte: float
    bound: tuple[str, ...]          # of RESOURCES: no point was limited by it
    unmeasured: tuple[str, ...]     # of RESOURCES: no point carried bytes through it


class _Problem:
    """y = max(C u) + x u_node, least squares on relative errors, u >= 0 (numpy)."""

    def __init__(self, coefficients: Sequence[Sequence[float]], exchange: Sequence[float],
                 y: Sequence[float], fixed: Sequence[float | None]) -> None:
        import numpy as np

        self.c = np.array(coefficients, dtype=float).reshape(-1, 3)
        self.x = np.array(exchange, dtype=float)
        self.y = np.array(y, dtype=float)
        self.weight = 1 / self.y
        self.fixed = tuple(fixed)
        self.free = [j for j in range(3) if fixed[j] is None]
        self._solved: dict[tuple[int, ...], Floats] = {}

    def model(self, u: Floats) -> Floats:
        return (self.c * u).max(axis=1) + self.x * u[1]

    def error(self, u: Floats) -> float:
        return float((((self.model(u) - self.y) * self.weight) ** 2).sum())

    def solve(self, assignment: tuple[int, ...]) -> Floats:
        """u for this assignment of points to terms: every subset of the free unknowns
        tried as the non-zero ones, the least error (of the whole model) kept."""
        if assignment in self._solved:
            return self._solved[assignment]
        import itertools

        import numpy as np

        chosen = np.array(assignment)
        columns = {j: self.c[:, j] * (chosen == j) + (self.x if j == 1 else 0.0) for j in range(3)}
        base = np.array([f or 0.0 for f in self.fixed])
        target = self.y - sum(columns[j] * base[j] for j in range(3) if self.fixed[j] is not None)
        best, best_u = math.inf, base
        for size in range(len(self.free) + 1):
            for subset in itertools.combinations(self.free, size):
                u = base.copy()
                if subset:
                    design = np.column_stack([columns[j] for j in subset]) * self.weight[:, None]
                    solved = np.linalg.lstsq(design, target * self.weight, rcond=None)[0]
                    if (solved < 0).any():
                        continue
                    u[list(subset)] = solved
                error = self.error(u)
                if error < best * (1 - 1e-12):
                    best, best_u = error, u
        self._solved[assignment] = best_u
        return best_u

    def assign(self, u: Floats, current: tuple[int, ...]) -> tuple[int, ...]:
        """Each point's largest term (ties: the one it had)."""
        terms = self.c * u
        top = terms.max(axis=1)
        return tuple(old if terms[i, old] >= top[i] * (1 - 1e-12) else int(terms[i].argmax())
                     for i, old in enumerate(current))


def _starts(coefficients: Floats) -> list[tuple[int, ...]]:
    """Every point on one term; every split of the points between two terms."""
    count = len(coefficients)
    starts = [(j,) * count for j in range(3)]
    for first in range(3):
        for second in range(first + 1, 3):
            ratio = [row[second] / row[first] if row[first] > 0 else math.inf
                     for row in coefficients]
            order = sorted(range(count), key=lambda i: ratio[i])
            for split in range(1, count):
                assignment = [first] * count
                for i in order[split:]:
                    assignment[i] = second
                starts.append(tuple(assignment))
    return starts


def fit_rates(coefficients: Sequence[Sequence[float]], exchange: Sequence[float],
              y: Sequence[float], fixed: Sequence[float | None] = (None, None, None)) -> Rates:
    """1/B_agg, 1/B_node, 1/B_client (s per byte) for y = max(c . u) + x u_node, where
    coefficients[i] = (storage, node, rank) of point i and y its data time per byte."""
    problem = _Problem(coefficients, exchange, y, fixed)
    best_error, best_u = math.inf, problem.solve(_starts(problem.c)[0])
    for start in _starts(problem.c):
        assignment = start
        for _ in range(30):
            u = problem.solve(assignment)
            again = problem.assign(u, assignment)
            if again == assignment:
                break
            assignment = again
        error = problem.error(u)
        if error < best_error * (1 - 1e-9) - 1e-300:
            best_error, best_u = error, u
    return _bounded(problem, [float(v) for v in best_u])


def _bounded(problem: _Problem, u: list[float]) -> Rates:
    """A free rate that limits no point is put where it would start to limit the one
    closest to it; one no point carried bytes through is left out (unlimited)."""
    bound, unmeasured = [], []
    for j in range(3):
        if problem.fixed[j] is not None:
            continue
        carried = [i for i in range(len(problem.y)) if problem.c[i, j] > 0]
        if not carried:
            u[j] = 0.0
            unmeasured.append(RESOURCES[j])
            continue
        tops = (problem.c * u).max(axis=1)
        # the exchange measures B_node whenever there is one (even as negligible)
        limited = (u[j] > 0 and any(problem.c[i, j] * u[j] >= tops[i] * (1 - 1e-6)
                                    for i in carried)) or (j == 1 and bool((problem.x > 0).any()))
        if not limited:
            u[j] = float(min(tops[i] / problem.c[i, j] for i in carried))
            bound.append(RESOURCES[j])
    return Rates(agg_s_per_byte=u[0], node_s_per_byte=u[1], client_s_per_byte=u[2],
                 bound=tuple(bound), unmeasured=tuple(unmeasured))
