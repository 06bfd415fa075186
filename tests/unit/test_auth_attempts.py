"""Failed authentications (``tether.api.attempts``) slow down only the credentials that
failed: per credential before the lookup, per address for failures only, in tables of
bounded size; the clock is the test's, so nothing here depends on timing."""

from __future__ import annotations

import logging

import pytest

from tether.api.attempts import AuthAttempts
from tether.errors import TooManyAttempts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_credential_past_its_failures_is_refused_until_one_more_has_drained() -> None:
    clock = Clock()
    attempts = AuthAttempts(3, 60.0, clock=clock)  # three at once, then one every 20 s
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):  # tried from anywhere
        attempts.check("a-revoked-key")
        assert attempts.failed(address, "a-revoked-key") is None
    with pytest.raises(TooManyAttempts) as refused:
        attempts.check("a-revoked-key")  # refused before any lookup
    assert refused.value.code == "too_many_attempts"
    assert refused.value.details["retry_after_s"] == 20
    attempts.check("the-right-key")  # another credential, even from the same addresses
    clock.now += 20
    attempts.check("a-revoked-key")  # one more try has drained


def test_an_address_past_its_failures_has_its_failures_refused_and_nothing_else() -> None:
    clock = Clock()
    attempts = AuthAttempts(3, 60.0, clock=clock)
    for n in range(3):
        attempts.check(f"guess-{n}")
        assert attempts.failed("10.0.0.1", f"guess-{n}") is None  # answered 401
    over = attempts.failed("10.0.0.1", "guess-3")  # looked up, failed, answered 429
    assert over is not None and over.details["retry_after_s"] == 20
    for _ in range(100):
        attempts.check("the-right-key")  # never refused: it never failed
    attempts.check("guess-4")  # a new guess is looked up (the key's entropy stops guessing)
    assert attempts.failed("10.0.0.2", "guess-4") is None  # another address is not slowed


def test_successes_are_never_counted() -> None:
    attempts = AuthAttempts(2, 60.0, clock=Clock())
    for _ in range(100):
        attempts.check("the-right-key")  # nothing recorded: never refused


def test_an_address_crossing_the_limit_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    attempts = AuthAttempts(2, 60.0, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="tether.api.attempts"):
        for n in range(50):
            attempts.failed("10.0.0.1", f"guess-{n}")
    crossed = [r for r in caplog.records if r.getMessage().startswith("too many failed")]
    assert len(crossed) == 1 and getattr(crossed[0], "address", None) == "10.0.0.1"


def test_ipv6_addresses_count_per_64_and_mapped_ipv4_as_ipv4() -> None:
    attempts = AuthAttempts(2, 60.0, clock=Clock())
    attempts.failed("2001:db8:1:2::1", "k1")
    attempts.failed("2001:db8:1:2:ffff::9", "k2")  # the same /64
    assert attempts.failed("2001:db8:1:2::abcd", "k3") is not None
    assert attempts.failed("2001:db8:1:3::1", "k4") is None  # the next /64 is another client
    attempts.failed("::ffff:10.0.0.7", "k5")
    attempts.failed("10.0.0.7", "k6")
    assert attempts.failed("10.0.0.7", "k7") is not None


def test_the_tables_stay_bounded_however_many_distinct_keys_fail() -> None:
    attempts = AuthAttempts(10, 60.0, clock=Clock(), max_tracked=1000)
    for n in range(20_000):
        attempts.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", f"guess-{n}")
    assert len(attempts.credentials) == 1000 and len(attempts.addresses) == 1000


def test_a_drained_count_is_forgotten() -> None:
    clock = Clock()
    attempts = AuthAttempts(3, 60.0, clock=clock)
    attempts.failed("10.0.0.1", "k")
    clock.now += 21  # one failure drains in 20 s
    attempts.check("k")
    assert len(attempts.credentials) == 0
