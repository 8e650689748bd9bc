"""The S3 client's retry policy, pure (the clock and the random draw are injected):
AWS's two retry modes as their SDKs document them, chosen per job or from the AWS
configuration.

- `standard` (the default): a failed request that may succeed later (throttling, other
  5xx, transient codes, transport failures) is attempted again, up to `max_attempts` in
  all (3 by default), after a backoff of `random() * min(base * 2^(retry - 1), 20 s)`
  (full jitter), `base` 1 s after a throttling answer and 50 ms after another failure
  (stampede's choice, so that a dropped kept-alive connection costs little). The SDKs'
  retry quota (a budget of retries per client) is left out: a benchmark wants every
  retry it can make, counted.
- `adaptive`: standard, plus a client-side rate limiter that only engages once the
  store throttled: from then on each request first waits for a token of a bucket whose
  rate drops to BETA x the rate measured when a throttling answer came, and climbs back
  by RECOVERY_PER_S of that rate each second without one (multiplicative decrease,
  additive increase: the idea of the SDKs' CUBIC limiter, simpler).

Chosen by, first to last: the job's storage options (`retry_mode`, `max_attempts`), the
environment (AWS_RETRY_MODE, AWS_MAX_ATTEMPTS), the AWS config file's profile
(`retry_mode`, `max_attempts`), the defaults; botocore's session reads the last three.
Time waiting, for a backoff or for the limiter's token, is what the caller adds up as
time backing off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

MODES = ("standard", "adaptive")
DEFAULT_MODE = "standard"
DEFAULT_MAX_ATTEMPTS = 3     # AWS's standard default: 1 request + 2 retries
BASE_S = {True: 1.0, False: 0.05}    # after throttling, after another failure
MAX_BACKOFF_S = 20.0
BETA = 0.7                   # the rate kept after a throttling answer (the SDKs' beta)
RECOVERY_PER_S = 0.1         # of the rate at the last throttle, regained each second
MIN_RATE_PER_S = 0.5
MEASURE_WINDOW_S = 0.5       # the request rate measured over about this long
SESSION_SOURCE = "AWS environment, profile or botocore's default"


def backoff_s(retry: int, throttling: bool, draw: float) -> float:
    """The wait before retry number `retry` (1, 2, ...): full jitter, `draw` in [0, 1)."""
    return draw * min(BASE_S[throttling] * 2 ** (retry - 1), MAX_BACKOFF_S)


@dataclass
class RateLimiter:
    """adaptive's client-side limiter: off until a throttling answer, then a token bucket
    (burst 1) at `rate_per_s`, which `throttled` cuts and each quiet second restores."""

    enabled: bool = False
    rate_per_s: float = 0.0
    last_throttle_rate_per_s: float = 0.0
    last_throttle_s: float = 0.0
    tokens: float = 1.0
    updated_s: float = 0.0
    measured_per_s: float = 0.0
    _window: list[float] = field(default_factory=list)

    def sent(self, now: float) -> None:
        """A request left at `now`: the measured rate follows."""
        self._window.append(now)
        while self._window and now - self._window[0] > MEASURE_WINDOW_S:
            self._window.pop(0)
        span = now - self._window[0]
        self.measured_per_s = (len(self._window) - 1) / max(span, MEASURE_WINDOW_S)

    def throttled(self, now: float) -> None:
        base = self.measured_per_s if not self.enabled else min(self.measured_per_s,
                                                                self._rate(now))
        self.last_throttle_rate_per_s = max(MIN_RATE_PER_S, base)
        self.last_throttle_s = now
        self.rate_per_s = max(MIN_RATE_PER_S, BETA * self.last_throttle_rate_per_s)
        if not self.enabled:
            self.enabled, self.tokens, self.updated_s = True, 0.0, now

    def _rate(self, now: float) -> float:
        regained = RECOVERY_PER_S * self.last_throttle_rate_per_s * (now - self.last_throttle_s)
        return self.rate_per_s + regained

    def wait_s(self, now: float) -> float:
        """Seconds to wait before a request at `now` (0 when off or a token is there);
        the token is taken either way (the caller waits, then sends)."""
        if not self.enabled:
            return 0.0
        rate = self._rate(now)
        self.tokens = min(1.0, self.tokens + (now - self.updated_s) * rate)
        self.updated_s = now
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / rate


@dataclass
class RetryPolicy:
    mode: str = DEFAULT_MODE
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    source: str = "default"
    limiter: RateLimiter = field(default_factory=RateLimiter)

    def restart(self) -> None:
        """As a new process's client: the rate limiter off, nothing measured."""
        self.limiter = RateLimiter()

    def before_request(self, now: float) -> float:
        """Seconds to wait before sending (adaptive's limiter; 0 in standard)."""
        if self.mode != "adaptive":
            return 0.0
        wait = self.limiter.wait_s(now)
        self.limiter.sent(now + wait)
        return wait

    def after_failure(self, retry: int, throttling: bool, now: float,
                      draw: Callable[[], float]) -> float:
        """The backoff before retry number `retry`; adaptive's limiter slows on throttling."""
        if self.mode == "adaptive" and throttling:
            self.limiter.throttled(now)
        return backoff_s(retry, throttling, draw())

    def describe(self) -> dict[str, object]:
        return {"mode": self.mode, "max_attempts": self.max_attempts, "from": self.source,
                "backoff": "full jitter x 2^n from 1 s (throttling: 429, 503, throttling "
                           f"codes) or 50 ms, <= {MAX_BACKOFF_S:g} s",
                **({"rate_limiter": f"after a throttle: {BETA:g} x the measured rate, "
                                    f"+{RECOVERY_PER_S:g} of it per second"}
                   if self.mode == "adaptive" else {})}


class ConfigSource(Protocol):
    """What resolve asks of botocore's session."""

    def get_config_variable(self, logical_name: str) -> object: ...


def resolve(options: dict[str, object], session: ConfigSource | None) -> RetryPolicy:
    """The policy from the job's storage options (popped), else botocore's session (the
    environment, then the profile), else the defaults. Bad values: UsageError."""
    from stampede.errors import UsageError

    mode, mode_from = options.pop("retry_mode", None), "storage_options"
    if mode is None:
        mode, mode_from = _config(session, "retry_mode"), SESSION_SOURCE
    if mode is None:
        mode, mode_from = DEFAULT_MODE, "default"
    if mode not in MODES:
        raise UsageError(f"retry_mode = {mode!r} ({mode_from}): must be one of "
                         f"{', '.join(MODES)}")
    attempts, attempts_from = options.pop("max_attempts", None), "storage_options"
    if attempts is None:
        attempts, attempts_from = _config(session, "max_attempts"), SESSION_SOURCE
    if attempts is None:
        attempts, attempts_from = DEFAULT_MAX_ATTEMPTS, "default"
    try:
        count = int(str(attempts).strip().removesuffix(".0"))
    except ValueError:
        count = 0
    if count < 1 or str(attempts).strip() not in (str(count), f"{count}.0"):
        raise UsageError(f"max_attempts = {attempts!r} ({attempts_from}): must be a whole "
                         "number >= 1 (1: no retries)")
    sources = {mode_from, attempts_from}
    return RetryPolicy(mode, count, " and ".join(sorted(sources)))


def _config(session: ConfigSource | None, name: str) -> object:
    if session is None:
        return None
    try:
        return session.get_config_variable(name)
    except Exception:   # an unreadable profile: botocore says why when credentials load
        return None
