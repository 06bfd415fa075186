"""Failed authentications (an API key sent as a bearer token or typed into the sign-in
form, or a published user's sign-in button) slow down only the credentials that failed: a
valid key or sign-in is never refused because of others' failures, whoever shares its
address (a NAT, an office proxy).

- **Per credential**, checked before the key is looked up: a credential that failed
  ``max_failures`` times within ``window_s`` is refused ``429 too_many_attempts`` with
  ``Retry-After`` until its count drains (one more failure allowed every ``window_s /
  max_failures``), so a client looping a revoked key costs no lookups. A valid key never
  fails, so it is never refused.
- **Per address, failures only**: an address whose failures are past the same limit has
  its further *failures* answered ``429`` (instead of ``401``) with ``Retry-After``, and
  is logged once as it crosses the limit (for the operator or fail2ban). Its valid keys
  are looked up and accepted as any other. IPv6 addresses count per /64, what one
  client usually holds.

Guessing a key is kept hopeless by the key, not by these counts: tether's keys carry 256
random bits. Refusing an address would let one script lock out everyone behind it.

Each count is one number (GCRA: the time its failures drain by), kept for a digest of the
credential (this memory never holds a key) or the address, in two tables of at most
``max_tracked`` entries, the least recently failed going first: distinct bad keys by the
million cost at most their bound (17 MB for both tables full). The counts live in this
process (a restart forgets them, and each process of a fleet counts its own): a
fleet-wide limit belongs in the proxy in front (docs/operations.md)."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from collections.abc import Callable

from tether.errors import TooManyAttempts

log = logging.getLogger(__name__)

MAX_TRACKED = 50_000  # credentials, and addresses, remembered at once (each table)


class Drains:
    """Failures per key that drain at a steady rate (GCRA): up to ``burst`` at once, then
    one more every ``window_s / burst``; a bounded table, least recently failed first out."""

    def __init__(self, burst: int, window_s: float, max_tracked: int) -> None:
        self._every = window_s / burst
        self._window = window_s
        self._max_tracked = max_tracked
        self._drained_at: dict[bytes | str, float] = {}  # when its failures have drained

    def wait(self, key: bytes | str, now: float) -> float:
        """How long ``key`` must wait before another failure is within the limit (0: it
        is within it now)."""
        drained_at = self._drained_at.get(key)
        if drained_at is None:
            return 0.0
        if drained_at <= now:
            del self._drained_at[key]  # forgotten once drained: the table holds the live
            return 0.0
        return max(0.0, drained_at - now - (self._window - self._every))

    def count(self, key: bytes | str, now: float) -> None:
        """One more failure of ``key`` (drained by at most a window from now)."""
        drained_at = max(self._drained_at.pop(key, now), now) + self._every
        self._drained_at[key] = min(drained_at, now + self._window)  # most recent last
        while len(self._drained_at) > self._max_tracked:
            del self._drained_at[next(iter(self._drained_at))]

    def __len__(self) -> int:
        return len(self._drained_at)


class AuthAttempts:
    """The counts of failed authentications of one process, per credential and per
    address (module docstring)."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self._clock = clock
        self.credentials = Drains(max_failures, window_s, max_tracked)
        self.addresses = Drains(max_failures, window_s, max_tracked)

    def check(self, credential: str) -> None:
        """Refuse (``TooManyAttempts``) a credential that failed too often lately; called
        before it is looked up. Nothing about its address is asked."""
        wait = self.credentials.wait(_digest(credential), self._clock())
        if wait > 0:
            raise _refusal("this key failed too many times", wait)

    def failed(self, address: str, credential: str) -> TooManyAttempts | None:
        """Count a failed authentication of ``credential`` from ``address``; the refusal to
        answer it with (instead of ``unauthenticated``) when the address's failures were
        already past the limit, else None."""
        now = self._clock()
        where = _address_key(address)
        wait = self.addresses.wait(where, now)
        self.credentials.count(_digest(credential), now)
        self.addresses.count(where, now)
        if wait <= 0:
            if self.addresses.wait(where, now) > 0:  # this failure crossed the limit
                log.warning(
                    "too many failed authentications from one address",
                    extra={"action": "auth", "address": where, "limit": self.max_failures},
                )
            return None
        return _refusal("too many failed authentications from this address", wait)


def _refusal(why: str, wait: float) -> TooManyAttempts:
    retry = max(1, math.ceil(wait))
    return TooManyAttempts(f"{why}; try again in {retry}s", retry_after_s=retry)


def _digest(credential: str) -> bytes:
    # The credential is kept only as a digest: this memory never holds a key.
    return hashlib.sha256(credential.encode("utf-8", "replace")).digest()[:16]


def _address_key(address: str) -> str:
    """An IPv4 address as it is; an IPv6 one as its /64 (one client usually holds a whole
    /64, and could otherwise spread its failures over 2**64 addresses)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address[:100]
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:  # ::ffff:10.0.0.1 is 10.0.0.1
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)
