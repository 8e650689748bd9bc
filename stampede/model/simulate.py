"""The metadata service the contention model describes, simulated event by event on a
virtual clock: the model's check that no machine can disturb.

stampede.model.contention.predict() is a closed form of this service; `stampede
emulate-mds` builds it for real, on a real clock, on a machine whose load moves every
time it measures. This is the third form: the service itself, each request entering and
leaving on a clock that only the simulation advances, so the model can be compared with
it exactly (or to a stated tolerance where the closed form is an approximation), in
milliseconds, and a wrong parameter shown to miss.

The service is the emulator's (stampede.emulate.mds, stampede.emulate.writable):

  slots    C of them; a request holds one for its own service time S (ops may differ:
           the emulator's --create-s, --rename-s ...), then leaves
  locks    before its slot a request may queue on locks, first come first served, taken
           in the order it lists them and held until it leaves its slot: the emulator's
           lock per file (--serialize-inode), per parent directory (--serialize-dir), a
           rename's two parents in path order
  queue    a request that finds every slot busy waits in arrival order (the emulator's
           semaphore does not promise the order, which changes who waits, not how long
           the slots stay busy)
  ranks    each issues its requests one after another, a closed loop: a request reaches
           the server RTT after the rank's previous reply (the first: RTT after the
           rank's start), its reply reaches the rank at once. RTT is the round trip
           outside the server, counted once per request
  ops      what a rank times (a stat, a create) is a run of requests: a stat through the
           emulator's FUSE mount is a LOOKUP of its directory, a LOOKUP of the file and a
           GETATTR, each a request; an op's latency runs from the rank's previous reply
           to the reply of its last request, as stampede times it

Ties (two events at one instant) go in the order they were scheduled, ranks in rank
order: the simulation is deterministic.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial


@dataclass(frozen=True)
class Request:
    """One request to the server: its service time and the locks it queues on first."""

    service_s: float
    locks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Op:
    """What a rank times: a name and the requests it costs, in order."""

    name: str
    requests: tuple[Request, ...]


@dataclass(frozen=True)
class Served:
    """One request as the simulated server served it (seconds on the virtual clock)."""

    rank: int
    op: str
    locks: tuple[str, ...]
    arrived_s: float
    taken_s: float          # took its slot (after its locks)
    left_s: float           # = taken_s + its service time
    slot: int


@dataclass(frozen=True)
class Simulation:
    """What a simulated burst did: every request served, every op's latency, each rank's
    last reply."""

    served: tuple[Served, ...]
    latencies_s: dict[str, tuple[float, ...]]    # op -> every rank's latencies of it
    done_s: tuple[float, ...]                    # rank -> its last reply

    @property
    def last_s(self) -> float:
        """The metadata stall of the last rank: the model's T_meta."""
        return max(self.done_s, default=0.0)

    def stall_s(self, ops_per_rank: dict[str, float]) -> float:
        """The stall as stampede's fit measures it from an archive (stampede.model.fit's
        Point.meta_s): the sum over ops of its count per rank times its p50 latency."""
        return sum(count * statistics.median(self.latencies_s[op])
                   for op, count in ops_per_rank.items() if self.latencies_s.get(op))

    def peak_in_service(self) -> int:
        """The most requests holding a slot at once (never more than the slots)."""
        edges = sorted([(item.taken_s, 1) for item in self.served] +
                       [(item.left_s, -1) for item in self.served])
        peak = current = 0
        for _, step in edges:          # at one instant a leave (-1) sorts before a take
            current += step
            peak = max(peak, current)
        return peak


@dataclass
class _Pending:
    """A request on its way through the server."""

    rank: int
    op: str
    request: Request
    arrived_s: float
    next_lock: int = 0
    taken_s: float = 0.0
    slot: int = -1


@dataclass
class _Server:
    threads: int
    rtt_s: float
    sequences: Sequence[Sequence[Op]]
    events: list[tuple[float, int, Callable[[float], None]]] = field(default_factory=list)
    order: int = 0
    free_slots: list[int] = field(default_factory=list)
    slot_queue: deque[_Pending] = field(default_factory=deque)
    holders: dict[str, _Pending] = field(default_factory=dict)
    lock_queues: dict[str, deque[_Pending]] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)
    position: list[tuple[int, int]] = field(default_factory=list)   # rank -> (op, request)
    op_started_s: list[float] = field(default_factory=list)
    latencies_s: dict[str, list[float]] = field(default_factory=dict)
    done_s: list[float] = field(default_factory=list)

    def schedule(self, time_s: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self.events, (time_s, self.order, action))
        self.order += 1

    def issue(self, rank: int, now_s: float) -> None:
        """The rank's next request leaves it now and arrives RTT later; or it is done."""
        op_index, request_index = self.position[rank]
        if op_index == len(self.sequences[rank]):
            self.done_s[rank] = now_s
            return
        if request_index == 0:
            self.op_started_s[rank] = now_s
        self.schedule(now_s + self.rtt_s, lambda at_s: self.arrive(rank, at_s))

    def arrive(self, rank: int, now_s: float) -> None:
        op_index, request_index = self.position[rank]
        op = self.sequences[rank][op_index]
        self.lock_next(_Pending(rank, op.name, op.requests[request_index], now_s), now_s)

    def lock_next(self, pending: _Pending, now_s: float) -> None:
        """Take the request's locks in order, queueing at the first one held; then a slot."""
        locks = pending.request.locks
        while pending.next_lock < len(locks):
            key = locks[pending.next_lock]
            if key in self.holders:
                self.lock_queues.setdefault(key, deque()).append(pending)
                return
            self.holders[key] = pending
            pending.next_lock += 1
        if self.free_slots:
            self.take_slot(pending, heapq.heappop(self.free_slots), now_s)
        else:
            self.slot_queue.append(pending)

    def take_slot(self, pending: _Pending, slot: int, now_s: float) -> None:
        pending.taken_s, pending.slot = now_s, slot
        self.schedule(now_s + pending.request.service_s, lambda at_s: self.leave(pending, at_s))

    def leave(self, pending: _Pending, now_s: float) -> None:
        """The slot goes to the next in its queue, then each lock to the next in its own
        (the emulator leaves its slot, then its locks), then the rank issues its next."""
        self.served.append(Served(pending.rank, pending.op, pending.request.locks,
                                  pending.arrived_s, pending.taken_s, now_s, pending.slot))
        if self.slot_queue:
            self.take_slot(self.slot_queue.popleft(), pending.slot, now_s)
        else:
            heapq.heappush(self.free_slots, pending.slot)
        for key in pending.request.locks:
            waiting = self.lock_queues.get(key)
            if waiting:
                following = waiting.popleft()
                self.holders[key] = following
                following.next_lock += 1
                self.lock_next(following, now_s)
            else:
                del self.holders[key]
        rank = pending.rank
        op_index, request_index = self.position[rank]
        op = self.sequences[rank][op_index]
        if request_index + 1 < len(op.requests):
            self.position[rank] = (op_index, request_index + 1)
        else:
            self.latencies_s.setdefault(op.name, []).append(now_s - self.op_started_s[rank])
            self.position[rank] = (op_index + 1, 0)
        self.issue(rank, now_s)


def simulate(sequences: Sequence[Sequence[Op]], threads: int, rtt_s: float = 0.0,
             start_s: Sequence[float] | None = None) -> Simulation:
    """Serve each rank's ops (sequences[rank], issued one after another) through `threads`
    slots; every rank starts at 0 (or at start_s[rank])."""
    if threads < 1:
        raise ValueError(f"threads {threads}: must be at least 1")
    nranks = len(sequences)
    server = _Server(threads, rtt_s, sequences, free_slots=list(range(threads)),
                     position=[(0, 0)] * nranks, op_started_s=[0.0] * nranks,
                     done_s=[0.0] * nranks)
    for rank in range(nranks):
        server.schedule(start_s[rank] if start_s else 0.0, partial(server.issue, rank))
    while server.events:
        now_s, _, action = heapq.heappop(server.events)
        action(now_s)
    return Simulation(tuple(server.served),
                      {op: tuple(values) for op, values in server.latencies_s.items()},
                      tuple(server.done_s))


def repeated(op: Op, count: int) -> tuple[Op, ...]:
    """`count` of one op, one after another."""
    return (op,) * count
