"""The arithmetic of the fleet's model rate (reference §13), as pure functions: how much
of the window is free, when more frees, how request starts are spread over the window,
and how what is free is shared out among the users who wait for it.

``store/model_rate.py`` calls these under the ``gates`` row lock, with the rows of
``model_usage`` and ``model_waits`` it read; the tests call them directly.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Request starts are spread over the window: at most a ``SPREAD``-th of RPM (at least one)
# leased in the matching part of it, and tokens kept under a ``SPREAD``-th of TPM over a
# ``SPREAD``-th of the window. So capacity frees all along the window, rather than all
# at once a window after a burst, and a user who comes while another's run has used
# every slot waits about a ``SPREAD``-th of the window for the next, not a whole window.
SPREAD = 10


def granted(want: int, requests: int, tokens: int, *, rpm: int | None, tpm: int | None) -> int:
    """How many of ``want`` request starts the window allows while ``requests`` were leased
    in the request window and ``tokens`` reported in the token window: none while the
    tokens are at ``tpm`` or over; else up to what ``rpm`` leaves."""
    if tpm is not None and tokens >= tpm:
        return 0
    if rpm is None:
        return want
    return max(0, min(want, rpm - requests))


@dataclass(frozen=True, kw_only=True)
class Used:
    """What the fleet used: requests leased over the request window and tokens reported
    over the token window, and the same over the parts of them the spread counts
    (``Pace``)."""

    requests: int = 0
    tokens: int = 0
    paced_requests: int = 0
    paced_tokens: int = 0


def room(used: Used, pace: Pace, *, rpm: int | None, tpm: int | None) -> int | None:
    """How many request starts may be granted now: what the window allows (``granted``)
    and its spread leaves; None when no RPM is set and the tokens allow any number."""
    if pace.tokens is not None and used.paced_tokens >= pace.tokens:
        return 0
    left = granted(rpm or 1, used.requests, used.tokens, rpm=rpm, tpm=tpm)
    if rpm is None or pace.requests is None:
        return None if left else 0
    return min(left, max(0, pace.requests - used.paced_requests))


def free_at(rows: Sequence[tuple[float, int]], most: int, span: float) -> float:
    """When rows of a window ``span`` seconds long (``(at, amount)``, oldest first, all in
    the window now) will have aged out enough that the amounts left sum below ``most``:
    the ``at`` of the last row that must go, plus ``span`` (a row at ``at`` is out of the
    window from ``at + span`` on). The last row's when even every row must go."""
    left = sum(amount for _, amount in rows)
    for at, amount in rows:
        left -= amount
        if left < most:
            return at + span
    return rows[-1][0] + span if rows else 0.0


def window(window_s: float, valid_s: float) -> float:
    """The span a lease counts requests over. A slot leased at ``a`` starts a request at
    some ``s`` in ``[a, a + valid_s]``. Take any ``window_s`` of starts ``[t, t + window_s)``:
    their leases fall in ``(t - valid_s, t + window_s)``, and the last of those leases, at
    ``a_last``, counted every row after ``a_last - window_s - valid_s < t - valid_s``, so
    with its own grant they add up to RPM at most."""
    return window_s + valid_s


@dataclass(frozen=True, kw_only=True)
class Pace:
    """The spread of request starts (``SPREAD``): at most ``requests`` leased in any
    ``requests_s`` seconds, and a start only while the tokens reported in the last
    ``tokens_s`` are below ``tokens``; None where no limit is set."""

    requests: int | None
    requests_s: float
    tokens: int | None
    tokens_s: float

    @classmethod
    def of(cls, rpm: int | None, tpm: int | None, window_s: float) -> Pace:
        """The spread of ``rpm`` and ``tpm`` over ``window_s``: a part of the window as long
        as it takes RPM to lease its share (one at least), and a tenth of TPM in a tenth."""
        share = None if rpm is None else math.ceil(rpm / SPREAD)
        requests_s = 0.0 if rpm is None or share is None else window_s * share / rpm
        tokens = None if tpm is None else max(1, tpm // SPREAD)
        return cls(requests=share, requests_s=requests_s, tokens=tokens, tokens_s=window_s / SPREAD)


@dataclass(frozen=True, kw_only=True)
class Waiting:
    """A user whose runs wait for capacity, fleet-wide: how many starts they want, since
    when the earliest waits, and what the user used of the window (requests leased, and
    tokens reported)."""

    user: str
    wanting: int
    since: float
    requests: int = 0
    tokens: int = 0


def load(waiting: Waiting, extra: int, *, rpm: int | None, tpm: int | None) -> float:
    """The share of the window ``waiting``'s user used, with ``extra`` more starts: its
    requests of RPM or its tokens of TPM, whichever is the larger part."""
    parts = [0.0]
    if rpm:
        parts.append((waiting.requests + extra) / rpm)
    if tpm:
        parts.append(waiting.tokens / tpm)
    return max(parts)


def shares(
    free: int | None, waiting: Sequence[Waiting], *, rpm: int | None, tpm: int | None
) -> dict[str, int]:
    """``free`` starts (None: as many as wanted) given out one at a time to the waiting
    users in turn: each to the user whose share of the window, counting the starts given
    so far, is least, the one waiting longest first among equals. What each user gets."""
    given = {w.user: 0 for w in waiting}
    if free is None:
        return {w.user: w.wanting for w in waiting}
    turns = [(load(w, 0, rpm=rpm, tpm=tpm), w.since, w.user, w) for w in waiting if w.wanting]
    heapq.heapify(turns)
    while free > 0 and turns:
        _, since, user, w = heapq.heappop(turns)
        given[user] += 1
        free -= 1
        if given[user] < w.wanting:
            share = load(w, given[user], rpm=rpm, tpm=tpm)
            heapq.heappush(turns, (share, since, user, w))
    return given


def merged(
    mine: Mapping[str, int],
    since: Mapping[str, float],
    others: Sequence[tuple[str, int, float]],
    used: Mapping[str, tuple[int, int]],
    now: float,
) -> list[Waiting]:
    """Every user waiting, fleet-wide: this limiter's wants (``mine``, waiting ``since`` as
    its rows say, else from ``now``) with the other limiters' rows ``(user, wanting,
    since)``, each with what the user used (``used``: requests, tokens)."""
    wanting: dict[str, int] = {}
    first: dict[str, float] = {}
    for user, count, waited in [
        *((u, n, since.get(u, now)) for u, n in mine.items() if n > 0),
        *others,
    ]:
        wanting[user] = wanting.get(user, 0) + count
        first[user] = min(first.get(user, waited), waited)
    return [
        Waiting(
            user=user,
            wanting=count,
            since=first[user],
            requests=used.get(user, (0, 0))[0],
            tokens=used.get(user, (0, 0))[1],
        )
        for user, count in wanting.items()
    ]
