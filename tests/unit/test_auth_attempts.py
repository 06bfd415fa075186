"""Failed authentications are counted per address and per credential in a sliding window
(``tether.api.attempts``); the clock is the test's, so nothing here depends on timing."""

from __future__ import annotations

import pytest

from tether.api.attempts import AuthAttempts
from tether.errors import TooManyAttempts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_refused_after_its_failures_until_the_oldest_leaves_the_window() -> None:
    clock = Clock()
    attempts = AuthAttempts(3, 60.0, clock=clock)
    for n in range(3):
        attempts.check("10.0.0.1", f"guess-{n}")
        attempts.failed("10.0.0.1", f"guess-{n}")
        clock.now += 1
    with pytest.raises(TooManyAttempts) as refused:
        attempts.check("10.0.0.1", "the-right-key")  # refused before any lookup
    assert refused.value.code == "too_many_attempts"
    assert refused.value.details["retry_after_s"] == 57  # the first failure leaves at 1060
    attempts.check("10.0.0.2", "the-right-key")  # another address is not affected
    clock.now = 1060.0
    attempts.check("10.0.0.1", "the-right-key")


def test_one_credential_tried_from_many_addresses_is_refused_too() -> None:
    attempts = AuthAttempts(3, 60.0, clock=Clock())
    for n in range(3):
        attempts.failed(f"10.0.0.{n}", "a-revoked-key")
    with pytest.raises(TooManyAttempts):
        attempts.check("10.0.9.9", "a-revoked-key")
    attempts.check("10.0.9.9", "another-key")


def test_successes_are_never_counted() -> None:
    attempts = AuthAttempts(2, 60.0, clock=Clock())
    for _ in range(100):
        attempts.check("10.0.0.1", "the-right-key")  # nothing recorded: never refused


def test_the_memory_is_bounded_oldest_first() -> None:
    attempts = AuthAttempts(1, 60.0, clock=Clock(), max_tracked=4)
    attempts.failed("10.0.0.1", "k1")
    attempts.failed("10.0.0.2", "k2")
    attempts.failed("10.0.0.3", "k3")  # pushes out the first address and key
    attempts.check("10.0.0.1", "k1")
    with pytest.raises(TooManyAttempts):
        attempts.check("10.0.0.3", "k9")
