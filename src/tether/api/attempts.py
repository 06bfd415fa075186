"""Failed authentications, counted per client address and per credential presented (an API
key, typed into the sign-in form or sent as a bearer token): past the limit within the
window, further attempts are refused ``429 too_many_attempts`` with ``Retry-After`` before
any key is looked up, so guessing keys gets nowhere. A successful authentication is never
counted or slowed.

The counts live in this process (a restart forgets them, and each process of a fleet
counts its own): a fleet-wide limit belongs in the proxy in front (docs/operations.md)."""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from tether.errors import TooManyAttempts

MAX_TRACKED = 100_000  # addresses and credentials remembered at once; the oldest go first


class AuthAttempts:
    """The sliding-window counts of failed authentications of one process."""

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
        self._max_tracked = max_tracked
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def check(self, address: str, credential: str) -> None:
        """Refuse (``TooManyAttempts``) an attempt from ``address`` or with ``credential``
        while either has ``max_failures`` failures within the window."""
        now = self._clock()
        waits = [self._wait(bucket, now) for bucket in _buckets(address, credential)]
        wait = max(waits)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise TooManyAttempts(
                f"too many failed authentications; try again in {retry}s", retry_after_s=retry
            )

    def failed(self, address: str, credential: str) -> None:
        """Count one failed authentication against ``address`` and ``credential``."""
        now = self._clock()
        for bucket in _buckets(address, credential):
            times = self._failures.pop(bucket, None) or deque(maxlen=self.max_failures)
            times.append(now)
            self._failures[bucket] = times  # most recent last
        while len(self._failures) > self._max_tracked:
            self._failures.popitem(last=False)

    def _wait(self, bucket: str, now: float) -> float:
        times = self._failures.get(bucket)
        if times is None:
            return 0.0
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[bucket]
            return 0.0
        if len(times) < self.max_failures:
            return 0.0
        return times[0] + self.window_s - now


def _buckets(address: str, credential: str) -> tuple[str, ...]:
    # The credential is kept only as a digest: this memory never holds a key.
    digest = hashlib.sha256(credential.encode("utf-8", "replace")).hexdigest()
    return (f"address:{address}", f"credential:{digest}")
