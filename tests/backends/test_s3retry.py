"""The S3 client's retry policy (stampede.backends.s3retry), pure: the backoff's bounds,
adaptive's limiter on a virtual clock, and where the mode and attempts come from."""

from __future__ import annotations

from typing import Any

import pytest

from stampede.backends.s3retry import RateLimiter, RetryPolicy, backoff_s, resolve
from stampede.errors import UsageError


class Session:
    """botocore's session as resolve asks it: the configuration variables it holds."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    def get_config_variable(self, name: str) -> Any:
        return self.values.get(name)


def test_standard_backoff_is_full_jitter_doubling_to_20_s() -> None:
    assert [backoff_s(retry, True, 0.5) for retry in (1, 2, 3, 6, 7)] == [0.5, 1, 2, 10, 10]
    assert backoff_s(1, False, 1.0) == 0.05 and backoff_s(3, False, 1.0) == 0.2
    assert backoff_s(5, True, 0.0) == 0.0
    standard = RetryPolicy()
    assert standard.before_request(0.0) == 0.0
    assert standard.after_failure(2, True, 0.0, lambda: 0.25) == 0.5
    assert standard.before_request(0.0) == 0.0     # standard never limits the rate


def test_adaptive_waits_only_after_a_throttle_then_at_a_lower_rate() -> None:
    policy = RetryPolicy("adaptive")
    # 16 requests a second for 1 s: none waits (the limiter is off)
    assert [policy.before_request(i / 16) for i in range(16)] == [0.0] * 16
    assert policy.limiter.measured_per_s == 16.0
    policy.after_failure(1, True, 1.0, lambda: 0.0)
    assert policy.limiter.enabled and policy.limiter.rate_per_s == pytest.approx(0.7 * 16)
    # the next requests, asked all at once, are spaced at the cut rate
    waits = [policy.before_request(1.0) for _ in range(3)]
    assert waits[0] == pytest.approx(1 / 11.2) and waits[2] == pytest.approx(3 / 11.2)
    # a failure that is not throttling does not cut the rate
    policy.after_failure(1, False, 1.0, lambda: 0.0)
    assert policy.limiter.rate_per_s == pytest.approx(11.2)


def test_the_limiter_recovers_without_throttles() -> None:
    limiter = RateLimiter()
    for i in range(8):
        limiter.sent(i / 8)
    limiter.throttled(1.0)
    assert limiter._rate(1.0) == pytest.approx(0.7 * 8)
    assert limiter._rate(6.0) == pytest.approx(0.7 * 8 + 0.1 * 8 * 5)


def test_mode_and_attempts_from_options_then_the_aws_configuration() -> None:
    options: dict[str, Any] = {"retry_mode": "adaptive", "max_attempts": 5}
    policy = resolve(options, Session(retry_mode="standard", max_attempts=9))
    assert (policy.mode, policy.max_attempts, policy.source) == ("adaptive", 5, "storage_options")
    assert options == {}    # taken: not passed on
    # AWS_RETRY_MODE / AWS_MAX_ATTEMPTS or the profile, as botocore's session reads them
    policy = resolve({}, Session(retry_mode="adaptive", max_attempts=7))
    assert (policy.mode, policy.max_attempts) == ("adaptive", 7)
    assert policy.source == "AWS environment, profile or botocore's default"
    policy = resolve({}, Session())
    assert (policy.mode, policy.max_attempts, policy.source) == ("standard", 3, "default")


@pytest.mark.parametrize(("options", "session", "said"), [
    ({"retry_mode": "legacy"}, Session(), "retry_mode = 'legacy' (storage_options): must be "
                                          "one of standard, adaptive"),
    ({}, Session(retry_mode="fast"), "retry_mode = 'fast' (AWS environment"),
    ({"max_attempts": 0}, Session(), "max_attempts = 0 (storage_options): must be a whole "
                                     "number >= 1 (1: no retries)"),
    ({"max_attempts": 2.5}, Session(), "max_attempts = 2.5"),
    ({}, Session(max_attempts="many"), "max_attempts = 'many' (AWS environment"),
])
def test_bad_values_are_refused_with_where_they_came_from(options: dict[str, Any],
                                                          session: Session, said: str) -> None:
    with pytest.raises(UsageError) as raised:
        resolve(options, session)
    assert str(raised.value).startswith(said)
