"""The window arithmetic of the fleet's model rate (reference §13, ``store/model_rate.py``)
and the limiter's coalescing (``_runtime/shared/model_rate_limiter.py``) on a SQLite store.

A lease at ``a`` counts the requests leased over the window plus the slots' validity, so
that however each slot is used within its validity, no window holds more than RPM starts.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st
from waiting import until

from tether._runtime.shared.model_rate_limiter import RateLimiter
from tether.store import Store
from tether.store.model_rate_shares import Pace, Waiting, free_at, granted, load, shares, window
from tether.store.sql.schema import model_usage

W = 60.0
V = 1.0


def test_a_grant_is_what_rpm_leaves_and_none_while_tokens_reach_tpm() -> None:
    assert granted(5, 0, 0, rpm=None, tpm=None) == 5
    assert granted(5, 8, 0, rpm=10, tpm=None) == 2
    assert granted(5, 10, 0, rpm=10, tpm=None) == 0
    assert granted(5, 12, 0, rpm=10, tpm=None) == 0  # over (a lowered RPM): none, not less
    assert granted(3, 0, 99, rpm=10, tpm=100) == 3  # below TPM: requests may start
    assert granted(3, 0, 100, rpm=10, tpm=100) == 0  # at TPM: none
    assert granted(0, 0, 0, rpm=10, tpm=100) == 0  # a report only


def test_capacity_comes_back_when_enough_of_the_oldest_rows_left_the_window() -> None:
    rows = [(100.0, 2), (105.0, 1), (110.0, 3)]  # 6 leased
    assert free_at(rows, 6, 61.0) == 100.0 + 61.0  # one must go: the oldest row frees 2
    assert free_at(rows, 4, 61.0) == 105.0 + 61.0  # 6 → 3 takes the two oldest
    assert free_at(rows, 1, 61.0) == 110.0 + 61.0  # all must go
    assert free_at([], 1, 61.0) == 0.0
    assert window(60.0, 1.0) == 61.0


def _starts(leases: list[tuple[float, int, float]], rpm: int, span: float) -> list[float]:
    """Lease in turn at each ``(at, want, use)`` as the store does (counting the rows of
    the last ``span``), and start each granted request ``use`` seconds after its lease."""
    rows: list[tuple[float, int]] = []
    starts: list[float] = []
    for at, want, use in leases:
        used = sum(n for a, n in rows if a > at - span)
        grant = granted(want, used, 0, rpm=rpm, tpm=None)
        rows.append((at, grant))
        starts.extend([at + use] * grant)
    return starts


def _most_in_a_window(starts: list[float]) -> int:
    return max((sum(1 for t in starts if s <= t < s + W) for s in starts), default=0)


@given(
    rpm=st.integers(1, 6),
    leases=st.lists(
        st.tuples(st.floats(0.0, 30.0), st.integers(1, 4), st.floats(0.0, V, exclude_max=False)),
        max_size=40,
    ),
)
def test_no_window_holds_more_than_rpm_starts_however_slots_are_used_in_their_validity(
    rpm: int, leases: list[tuple[float, int, float]]
) -> None:
    at = 0.0
    timed = []
    for gap, want, use in leases:  # leases one after another (the gate serialises them)
        at += gap
        timed.append((at, want, use))
    assert _most_in_a_window(_starts(timed, rpm, window(W, V))) <= rpm


def test_counting_the_window_alone_would_let_a_late_used_slot_overlap_the_next_window() -> None:
    leases = [(0.0, 3, V), (W + V / 2, 3, 0.0)]  # 3 used at the end of their validity
    assert _most_in_a_window(_starts(leases, 3, W)) == 6  # what the margin prevents
    assert _most_in_a_window(_starts(leases, 3, window(W, V))) == 3


async def test_runs_wanting_a_slot_at_once_share_leases(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    limiter = RateLimiter(store, rpm=1000, window_s=W)  # the spread: 100 at once
    try:

        async def one() -> bool:
            async def on_wait(limit: str, wait_s: float) -> None:
                raise AssertionError("no wait below the limit")

            granted, _ = await limiter.acquire(
                "ana", on_wait=on_wait, check=lambda: None, stopping=lambda: False
            )
            return granted

        assert await asyncio.gather(*(one() for _ in range(20))) == [True] * 20
        assert 1 <= limiter.leases < 20
    finally:
        limiter.close()
        store.close()


@pytest.mark.slow
async def test_a_full_fleet_waits_once_then_the_stopping_worker_gives_up(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    limiter = RateLimiter(store, rpm=1, window_s=W)
    waits: list[tuple[str, float]] = []
    stopping = asyncio.Event()

    async def on_wait(limit: str, wait_s: float) -> None:
        waits.append((limit, wait_s))
        stopping.set()  # the worker begins to stop while the run waits

    try:
        first = await limiter.acquire(
            "ana", on_wait=on_wait, check=lambda: None, stopping=lambda: False
        )
        second = await limiter.acquire(
            "ana", on_wait=on_wait, check=lambda: None, stopping=stopping.is_set
        )
        assert first[0] is True and second[0] is False
        assert len(waits) == 1 and waits[0][0] == "rpm" and waits[0][1] > W - 1
        assert limiter.waiting == 0
        # The first lease said the fleet is full until its slot ages out: the second run
        # slept without asking the store.
        assert limiter.leases == 1
    finally:
        limiter.close()
        store.close()


async def test_reported_tokens_reach_the_store_by_the_timer_when_no_lease_comes(
    sqlite_url: str,
) -> None:
    store = Store(sqlite_url)
    limiter = RateLimiter(store, tpm=100, window_s=W, flush_s=0.05)
    try:
        limiter.report("ana", 40)
        limiter.report("bo", 2)

        def recorded() -> int:
            with store.engine.connect() as conn:
                return int(conn.execute(sa.select(sa.func.sum(model_usage.c.tokens))).scalar() or 0)

        assert await until(recorded, what="the tokens flushed") == 42
        assert limiter.leases == 0  # no lease was needed for it
    finally:
        limiter.close()
        store.close()


def test_nothing_is_sent_without_a_limit() -> None:
    limiter = RateLimiter.off()
    limiter.report("ana", 1000)
    limiter.close()
    assert not limiter.enabled and limiter.leases == 0


# -- the spread and the turns ------------------------------------------------------------


def test_the_spread_lets_a_tenth_of_the_window_start_in_a_tenth_of_it() -> None:
    assert Pace.of(300, None, W) == Pace(requests=30, requests_s=6.0, tokens=None, tokens_s=6.0)
    # Fewer than ten a window: one at a time, each as far apart as the window allows.
    assert Pace.of(3, 1000, W) == Pace(requests=1, requests_s=20.0, tokens=100, tokens_s=6.0)


@st.composite
def _queue(draw: st.DrawFn) -> tuple[int, list[Waiting]]:
    users = draw(st.integers(1, 5))
    waiting = [
        Waiting(
            user=f"u{i}",
            wanting=draw(st.integers(0, 6)),
            since=draw(st.floats(0.0, 10.0)),
            requests=draw(st.integers(0, 20)),
            tokens=draw(st.integers(0, 5000)),
        )
        for i in range(users)
    ]
    return draw(st.integers(0, 20)), waiting


@given(_queue(), st.sampled_from([(20, None), (None, 5000), (20, 5000)]))
def test_what_is_free_goes_in_turn_the_least_used_first(
    queue: tuple[int, list[Waiting]], limits: tuple[int | None, int | None]
) -> None:
    free, waiting = queue
    rpm, tpm = limits
    given = shares(free, waiting, rpm=rpm, tpm=tpm)
    assert sum(given.values()) == min(free, sum(w.wanting for w in waiting))
    for w in waiting:
        assert 0 <= given[w.user] <= w.wanting
    for u in waiting:  # u's last start went to it while it had used no more than v has now
        for v in waiting:
            if given[u.user] and given[v.user] < v.wanting:
                last = (load(u, given[u.user] - 1, rpm=rpm, tpm=tpm), u.since, u.user)
                assert last <= (load(v, given[v.user], rpm=rpm, tpm=tpm), v.since, v.user)


def test_without_a_bound_everyone_waiting_gets_all_they_want() -> None:
    waiting = [Waiting(user="ana", wanting=3, since=1.0), Waiting(user="bo", wanting=0, since=0)]
    assert shares(None, waiting, rpm=None, tpm=100) == {"ana": 3, "bo": 0}
