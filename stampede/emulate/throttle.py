"""The request-rate limit of an object store, pure (no sockets, no wall clock): what
`stampede emulate-s3` (stampede.emulate.s3front) decides for each request before it
forwards it or answers 503 SlowDown.

S3 limits requests per partitioned prefix: at least 5,500 GET/HEAD and 3,500
PUT/COPY/POST/DELETE per second per prefix, and beyond that it answers 503 SlowDown while
it partitions a prefix that stays hot (over minutes), after which each new partition has
a budget of its own. Here:

- each request is a kind: `read` (GET or HEAD of an object), `write` (PUT, POST, DELETE)
  or `list` (a GET on the bucket itself: LIST objects or uploads);
- each (partition, kind) has a token bucket: `rate_per_s` tokens a second up to `burst`;
  a request takes one token, and with none left it is denied (503 SlowDown), told to
  come back when the next token is due (`retry_after_s`);
- a partition is a key prefix within a bucket; a bucket starts as one partition (the
  prefix ""). A partition throttled for longer than `split_delay_s` (its first denial
  that long ago, and no quiet spell of `split_delay_s` without one since) splits: each
  key under it then belongs to the child named by one more character of the key (as S3
  partitions by the key's leading characters), and every child starts with full buckets
  of its own. A key that is the partition's prefix itself stays in it;
- a prefix may start split (`partitioned`: S3 partitions a prefix ahead of a known load
  when asked to): it and every shorter prefix of it are split from the first request,
  so each key under it counts against the partition of one more character (copy-0/ and
  copy-1/ under "ck/copy-", a3f9/ and 07c2/ under "ck/").

Every time is a number the caller passes (`now`, seconds on any monotonic clock), so the
tests run it on a virtual clock with exact counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stampede.targets import S3_PREFIX_RATES_PER_S

KINDS = ("read", "write", "list")
# S3's documented per-prefix rates (stampede.targets); the emulator's defaults divide them
# by DEFAULT_SCALE, so that 2-8 ranks on one machine (a few hundred requests a second
# each) pass them
S3_RATES_PER_S = S3_PREFIX_RATES_PER_S
DEFAULT_SCALE = 100.0
DEFAULT_BURST = 10.0
DEFAULT_SPLIT_DELAY_S = 5.0


def request_kind(method: str, key: str) -> str:
    """read, write or list: what an S3 request counts against. A GET or HEAD of the
    bucket itself (no key) is a LIST; PUT, POST and DELETE are writes, whatever they name."""
    if method in ("PUT", "POST", "DELETE"):
        return "write"
    return "read" if key else "list"


@dataclass
class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` held; full when made."""

    rate_per_s: float
    burst: float
    tokens: float = -1.0          # full, once the first take sees it
    updated_s: float | None = None

    def take(self, now: float) -> float:
        """Take a token at `now`: 0.0 when there was one, else the seconds until one is due
        (the request is denied; nothing is taken)."""
        if self.updated_s is None or self.tokens < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.updated_s) * self.rate_per_s)
        self.updated_s = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


@dataclass
class Partition:
    """A key prefix of a bucket with its buckets, and how long it has been throttled."""

    name: str                            # "bucket/prefix"
    buckets: dict[str, TokenBucket]
    hot_since_s: float | None = None     # the first denial of the current hot spell
    last_denied_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """What became of one request: admitted or denied (then when to retry), and the
    partition ("bucket/prefix") it counted against."""

    admitted: bool
    partition: str
    kind: str
    retry_after_s: float = 0.0

    def retry_after_header(self) -> str:
        """Retry-After's value: whole seconds, at least 1 (HTTP has no fractions)."""
        return str(max(1, math.ceil(self.retry_after_s)))


@dataclass
class Throttle:
    """The partition table of every bucket seen and its rule; `decide` per request."""

    rates_per_s: dict[str, float]
    burst: float = DEFAULT_BURST
    split_delay_s: float = DEFAULT_SPLIT_DELAY_S
    partitions: dict[str, Partition] = field(default_factory=dict)   # by "bucket/prefix"
    splits: list[tuple[float, str]] = field(default_factory=list)    # (when, partition)
    split_names: set[str] = field(default_factory=set)                # partitions split

    def __post_init__(self) -> None:
        for kind in KINDS:
            if self.rates_per_s.get(kind, 0) <= 0:
                raise ValueError(f"rate for {kind}: must be positive")
        if self.burst < 1:
            raise ValueError("burst: must be at least 1")

    def partitioned(self, bucket: str, prefix: str) -> None:
        """Start `prefix` of `bucket` split: it and every prefix of it (as if each had
        been split in turn, at no time: no entry in `splits`)."""
        for end in range(len(prefix) + 1):
            self.split_names.add(f"{bucket}/{prefix[:end]}")

    def partition_of(self, bucket: str, key: str) -> str:
        """The partition ("bucket/prefix") `key` counts against: down the split ones, a
        character of the key at a time."""
        prefix = ""
        while self._split(bucket, prefix) and len(key) > len(prefix):
            prefix = key[:len(prefix) + 1]
        return f"{bucket}/{prefix}"

    def decide(self, method: str, bucket: str, key: str, now: float,
               list_prefix: str = "") -> Decision:
        """`list_prefix`: a LIST's prefix parameter, whose partition the LIST counts
        against (S3 serves a LIST from the partitions of the keys it names)."""
        kind = request_kind(method, key)
        name = self.partition_of(bucket, key if kind != "list" else list_prefix)
        partition = self.partitions.get(name)
        if partition is None:
            partition = self.partitions[name] = Partition(
                name, {k: TokenBucket(self.rates_per_s[k], self.burst) for k in KINDS})
        wait_s = partition.buckets[kind].take(now)
        if not wait_s:
            return Decision(True, name, kind)
        self._note_denial(partition, now)
        return Decision(False, name, kind, wait_s)

    def _note_denial(self, partition: Partition, now: float) -> None:
        """A hot spell starts at a denial after a quiet spell of split_delay_s (or none
        before); a denial split_delay_s or more into one splits the partition."""
        quiet = partition.last_denied_s is None or now - partition.last_denied_s >= self.split_delay_s
        if partition.hot_since_s is None or quiet:
            partition.hot_since_s = now
        partition.last_denied_s = now
        if now - partition.hot_since_s >= self.split_delay_s:
            partition.hot_since_s = partition.last_denied_s = None
            self.splits.append((now, partition.name))
            self.split_names.add(partition.name)

    def _split(self, bucket: str, prefix: str) -> bool:
        return f"{bucket}/{prefix}" in self.split_names
