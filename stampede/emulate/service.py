"""The service time of the metadata-server emulator: how a slot is held, and what was held.

A slot's service ends at a deadline, take-time + S on the monotonic clock, whatever the
request's own work took inside it (`hold_until`). A plain `time.sleep(S)` after the work
held each slot about 0.1 ms past S on the 2-core machine this was built on: the timer
slack of the sleeping thread (50 µs by default on Linux) plus the wake-up, and the work
itself on top. So `hold_until` sleeps to `spin_s` short of the deadline and spends the
rest yielding the CPU (`os.sched_yield` releases the GIL, so the other slots' threads and
the ranks run meanwhile) until the clock reaches it; `precise_timers` removes the slack
of the calling thread and of the threads it starts afterwards (libfuse's workers are
started by the thread that mounts). `bench/emulator_precision.py` measured the choices.

`ServiceTally` keeps, per op, what every request asked and what it held (held = from
taking the slot to releasing it), at 1 µs resolution in counters whose size is bounded
by the distinct values, not by the number of requests: the emulator's summary reports
the held time next to the asked one, so a run can show that the service time it
modelled is the one that was served.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from stampede.units import MS_PER_S, US_PER_S

PR_SET_TIMERSLACK = 29
TIMER_SLACK_NS = 1            # the least the kernel allows: wake at the time asked
SPIN_S = 100e-6               # the end of the hold spent yielding, not sleeping
MAX_SPIN_FRACTION = 0.25      # of a service time: what a busy slot may cost in CPU
REALTIME_PRIORITY = 1         # SCHED_FIFO's lowest: above every ordinary process


def precise_timers() -> None:
    """Timer slack 1 ns for this thread and the threads it creates from now on (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)   # best effort: only precision


def realtime_priority() -> str:
    """SCHED_FIFO for this thread and the threads it creates from now on, if allowed:
    what the threads now run at, in words. A busy machine then delays neither the wake-up
    at the end of a sleep nor the pick-up of a request; the spin at the end of each hold
    is bounded (spin_for), and the kernel's real-time throttling bounds the rest."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except OSError as error:      # a container without CAP_SYS_NICE or real-time runtime
        return f"normal priority (SCHED_FIFO refused: {error.strerror})"
    return f"real-time priority (SCHED_FIFO {REALTIME_PRIORITY})"


def spin_for(service_s: float, spin_s: float = SPIN_S) -> float:
    """The spin of a hold of service_s: spin_s, but never more than a fraction of it."""
    return min(spin_s, service_s * MAX_SPIN_FRACTION)


def hold_until(deadline_s: float, spin_s: float = SPIN_S) -> None:
    """Return at deadline_s (time.monotonic()), not before, and as little after as can be."""
    asleep_s = deadline_s - time.monotonic() - spin_s
    if asleep_s > 0:
        time.sleep(asleep_s)
    while time.monotonic() < deadline_s:
        os.sched_yield()


@dataclass
class OpTally:
    """One op's requests: counts and sums, and held / held-minus-asked times in µs."""

    count: int = 0
    in_service: int = 0         # requests of this op holding a slot now
    peak_in_service: int = 0    # the most at once: 1 when a lock let them through one by one
    asked_s: float = 0.0
    held_s: float = 0.0
    queued_s: float = 0.0
    held_us: Counter[int] = field(default_factory=Counter)
    over_us: Counter[int] = field(default_factory=Counter)

    def add(self, asked_s: float, held_s: float, queued_s: float) -> None:
        self.count += 1
        self.asked_s += asked_s
        self.held_s += held_s
        self.queued_s += queued_s
        self.held_us[round(held_s * US_PER_S)] += 1
        self.over_us[round((held_s - asked_s) * US_PER_S)] += 1

    def summary(self) -> dict[str, float]:
        """Means and percentiles in seconds (percentiles to the µs): the summary's numbers."""
        count = max(self.count, 1)
        return {"count": self.count, "asked_mean_s": self.asked_s / count,
                "held_mean_s": self.held_s / count, "held_p50_s": percentile(self.held_us, 0.5),
                "over_p50_s": percentile(self.over_us, 0.5),
                "over_p99_s": percentile(self.over_us, 0.99),
                "queued_mean_s": self.queued_s / count, "peak_in_service": self.peak_in_service}


def percentile(counts: Counter[int], fraction: float) -> float:
    """The smallest value (µs, returned in s) with at least `fraction` of the counts at or below."""
    total = sum(counts.values())
    if not total:
        return 0.0
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen >= fraction * total:
            return value / US_PER_S
    return max(counts) / US_PER_S


class ServiceTally:
    """Every op's OpTally, added to by the slots' threads at once, and the most requests
    that were in service at once: of all ops (never more than the slots: the check that
    they bind) and of each op (1 where a lock let its requests through one at a time)."""

    def __init__(self, ops: tuple[str, ...]) -> None:
        self._guard = threading.Lock()
        self.ops = {op: OpTally() for op in ops}
        self.in_service = 0
        self.peak_in_service = 0

    def started(self, op: str) -> None:
        """A request of `op` took its slot."""
        with self._guard:
            self.in_service += 1
            self.peak_in_service = max(self.peak_in_service, self.in_service)
            tally = self.ops[op]
            tally.in_service += 1
            tally.peak_in_service = max(tally.peak_in_service, tally.in_service)

    def add(self, op: str, asked_s: float, held_s: float, queued_s: float) -> None:
        """A request that started() released its slot after held_s."""
        with self._guard:
            self.in_service -= 1
            self.ops[op].in_service -= 1
            self.ops[op].add(asked_s, held_s, queued_s)

    def summaries(self) -> dict[str, dict[str, float]]:
        with self._guard:
            return {op: tally.summary() for op, tally in self.ops.items() if tally.count}

    def text(self) -> str:
        """One line: requests served, then per op its count and the time held vs asked."""
        summaries = self.summaries()
        served = sum(int(numbers["count"]) for numbers in summaries.values())
        parts = [f"{op} {int(numbers['count'])} ({held_text(numbers)})" for op, numbers in summaries.items()]
        return (f"{served} metadata request(s) served, at most {self.peak_in_service} at once"
                + (": " + ", ".join(parts) if parts else ""))


def held_text(numbers: dict[str, float]) -> str:
    """asked 1.000 ms, held 1.002 ms mean (+0.2%) / 1.001 ms p50, over p99 +0.040 ms; queued
    ... mean; at most 2 at once"""
    asked_s, held_s = numbers["asked_mean_s"], numbers["held_mean_s"]
    relative = f" ({held_s / asked_s - 1:+.1%})" if asked_s else ""
    return (f"asked {asked_s * MS_PER_S:.3f} ms, held {held_s * MS_PER_S:.3f} ms mean{relative} / "
            f"{numbers['held_p50_s'] * MS_PER_S:.3f} ms p50, over asked "
            f"{numbers['over_p99_s'] * MS_PER_S:.3f} ms p99; queued "
            f"{numbers['queued_mean_s'] * MS_PER_S:.3f} ms mean; at most "
            f"{int(numbers['peak_in_service'])} at once")


class Slots:
    """C service slots, each numbered: a request takes one (waiting while all are busy)
    and gives it back; the log says which slot served it."""

    def __init__(self, count: int) -> None:
        self._condition = threading.Condition()
        self._free = list(range(count - 1, -1, -1))    # popped from the end: slot 0 first

    @contextmanager
    def taken(self) -> Iterator[int]:
        with self._condition:
            while not self._free:
                self._condition.wait()
            slot = self._free.pop()
        try:
            yield slot
        finally:
            with self._condition:
                self._free.append(slot)
                self._condition.notify()


LOG_LIMIT = 200_000          # requests kept by default (about 50 MiB); the rest only counted


@dataclass(frozen=True)
class Served:
    """One request the emulator served, as its log (--log) records it. Times are the
    monotonic clock's (time.monotonic(), shared by every process on the machine):
    arrived (the request reached the server), taken (it had its locks and a slot), left
    (its hold ended; the slot and the locks were released right after)."""

    op: str
    paths: tuple[str, ...]       # the path it names; a rename's two
    locks: tuple[str, ...]       # the locks it queued on, in order: "file:PATH", "dir:PATH"
    arrived_s: float
    taken_s: float
    left_s: float
    slot: int


class ServiceLog:
    """Every request served, up to `limit` (the rest counted in `dropped`), kept in
    memory and written when the emulator stops (a write per request would be part of
    the service it measures)."""

    def __init__(self, limit: int = LOG_LIMIT) -> None:
        self.limit = limit
        self.dropped = 0
        self._guard = threading.Lock()
        self._entries: list[Served] = []

    def add(self, served: Served) -> None:
        with self._guard:
            if len(self._entries) < self.limit:
                self._entries.append(served)
            else:
                self.dropped += 1

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Served]:
        """The requests kept so far, in the order they left their slots."""
        with self._guard:
            return list(self._entries)

    def write(self, path: str) -> None:
        """The log as JSON lines, one request each (Served's fields), in the order the
        requests left their slots."""
        import json
        from dataclasses import asdict

        with open(path, "w") as stream:
            for served in self.entries():
                stream.write(json.dumps(asdict(served)) + "\n")


def read_log(path: str) -> list[Served]:
    """A log that `emulate-mds --log` wrote."""
    import json

    with open(path) as stream:
        return [Served(**{**entry, "paths": tuple(entry["paths"]), "locks": tuple(entry["locks"])})
                for entry in map(json.loads, stream)]
