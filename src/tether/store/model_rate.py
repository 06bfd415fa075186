"""The fleet's model rate (reference §13): leases of request starts and the tokens reported,
by user, in ``model_usage``; the users whose runs wait, by limiter, in ``model_waits``;
decided one at a time under the ``gates`` row ``model``.

``lease_capacity`` is one transaction: lock the gate (``FOR UPDATE`` on PostgreSQL; SQLite
serialises writers at ``BEGIN IMMEDIATE``), read the database's clock, sum what was used
(requests over the last ``window_s + valid_s`` seconds, tokens over the last ``window_s``,
and both over the parts of them the spread counts: ``model_rate_shares.Pace``), in all and by
user, and share what is free among every user waiting fleet-wide (this limiter's wants
and the other limiters' rows), in turn, the user who used least of the window first
(``model_rate_shares.shares``). The caller gets its users' part, one row per user; the part of
the other limiters' users is left for their next lease, and the caller's users still
waiting are written down for the other limiters to see. A granted slot is good for
``valid_s`` after the row's ``at``: counting requests over ``window_s + valid_s`` makes
every slot used in that time still obey "no more than RPM request starts in any
``window_s``" (``model_rate_shares.window`` has the argument).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import LeaseLost
from tether.runs import Lease
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.model_rate_shares import (
    Pace,
    Used,
    Waiting,
    free_at,
    merged,
    room,
    shares,
    window,
)
from tether.store.sql.schema import gates, model_usage, model_waits, run_events
from tether.store.sql.steps import LEASE_HELD, add_event, lease_params

# Rows older than this many windows are deleted when a lease is asked to purge.
KEPT_WINDOWS = 2.0
# A limiter's waiting users are owed capacity until this long after it was told to come
# back (it comes back on time unless it died).
GRACE_S = 5.0
# A limiter told to come back is never told sooner than this (capacity owed to another
# limiter's users is not in the rows until that limiter takes it).
RETRY_S = 0.05

_GATE = sa.select(gates.c.name).where(gates.c.name == "model")
_NOW = sa.select(db_now())


def _since(name: str) -> sa.BindParameter[float]:
    return sa.bindparam(name, type_=sa.Float)


def _sum(column: sa.ColumnElement[int], since: str) -> sa.ColumnElement[int]:
    """The sum of ``column`` over the rows after ``since`` (0 for none)."""
    return sa.func.coalesce(
        sa.func.sum(sa.case((model_usage.c.at > _since(since), column), else_=0)), 0
    )


_SUMS = (
    _sum(model_usage.c.requests, "b_since"),
    _sum(model_usage.c.tokens, "b_tokens_since"),
    _sum(model_usage.c.requests, "b_paced_since"),
    _sum(model_usage.c.tokens, "b_paced_tokens_since"),
)
_IN_WINDOW = model_usage.c.at > _since("b_since")
_USED = sa.select(*_SUMS).where(_IN_WINDOW)
_USED_BY_USER = (
    sa.select(model_usage.c.user_id, _SUMS[0], _SUMS[1])
    .where(_IN_WINDOW, model_usage.c.user_id.is_not(None))
    .group_by(model_usage.c.user_id)
)
_REQUEST_ROWS = (
    sa.select(model_usage.c.at, model_usage.c.requests)
    .where(model_usage.c.at > _since("b_rows_since"), model_usage.c.requests > 0)
    .order_by(model_usage.c.at)
)
_TOKEN_ROWS = (
    sa.select(model_usage.c.at, model_usage.c.tokens)
    .where(model_usage.c.at > _since("b_rows_since"), model_usage.c.tokens > 0)
    .order_by(model_usage.c.at)
)
_INSERT = (
    model_usage.insert()
    .values(
        at=sa.bindparam("b_at"),
        requests=sa.bindparam("b_requests"),
        tokens=sa.bindparam("b_tokens"),
        user_id=sa.bindparam("b_user"),
    )
    .returning(model_usage.c.id)
)
_LEFT = model_usage.c.requests - sa.bindparam("b_n")
_GIVE_BACK = (
    model_usage.update()
    .where(model_usage.c.id == sa.bindparam("b_id"))
    .values(requests=sa.case((_LEFT > 0, _LEFT), else_=0))
)
_PURGE = model_usage.delete().where(model_usage.c.at < sa.bindparam("b_before"))
_WAITER = model_waits.c.waiter == sa.bindparam("b_waiter")
_LAPSED = model_waits.delete().where(model_waits.c.until < sa.bindparam("b_now"))
_WAITS = sa.select(
    model_waits.c.waiter, model_waits.c.user_id, model_waits.c.wanting, model_waits.c.since
)
_FORGET = model_waits.delete().where(_WAITER)
_WAIT = model_waits.insert()
# The latest ``rate_limited`` and ``model_turn`` events of a run: a step has had its
# ``rate_limited`` event when one came after the run's last stored turn.
_LAST_OF_KIND = sa.select(sa.func.max(run_events.c.id)).where(
    run_events.c.run_id == sa.bindparam("b_id"), run_events.c.kind == sa.bindparam("b_kind")
)


@dataclass(frozen=True, kw_only=True)
class Grant:
    """What one lease decided: request starts ``granted`` per user (none when full), the
    row that holds each user's (``rows``), the database time ``at`` of the decision and,
    when the caller did not get all it asked, ``next_at``: the database time at which
    capacity is next expected for it (rows of the window aging out, after what the other
    waiting users are owed), with ``limit``, the one that binds then (``"rpm"`` or
    ``"tpm"``)."""

    granted: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    at: float
    next_at: float | None = None
    limit: str | None = None

    @property
    def total(self) -> int:
        """Every request start granted."""
        return sum(self.granted.values())


@dataclass(frozen=True, kw_only=True)
class _Limits:
    """The limits a lease applies, and the spans it counts over."""

    rpm: int | None
    tpm: int | None
    window_s: float
    valid_s: float

    @property
    def span(self) -> float:
        return window(self.window_s, self.valid_s)

    @property
    def pace(self) -> Pace:
        return Pace.of(self.rpm, self.tpm, self.window_s)

    def params(self, now: float) -> dict[str, float]:
        pace = self.pace
        return {
            "b_since": now - self.span,
            "b_tokens_since": now - self.window_s,
            "b_paced_since": now - pace.requests_s,
            "b_paced_tokens_since": now - pace.tokens_s,
        }


class ModelRate(StoreBase):
    """Leases of model capacity, reported tokens and the ``rate_limited`` event."""

    def lease_capacity(
        self,
        *,
        wants: Mapping[str, int],
        rpm: int | None,
        tpm: int | None,
        window_s: float,
        valid_s: float,
        waiter: str = "",
        tokens: Mapping[str, int] | None = None,
        give_back: Sequence[tuple[int, int]] = (),
        purge: bool = False,
    ) -> Grant:
        """Grant request starts to the users of ``wants`` (user: how many; none: only
        report), as the fleet's turn says, having first given back the unused slots of
        ``give_back`` (``(row id, count)``) and recorded ``tokens`` (ended requests' input
        and output tokens, by user) at the database's now; the users of ``wants`` left
        short are written down as ``waiter``'s, replacing what it wrote before. With
        ``purge``, rows older than ``KEPT_WINDOWS`` windows are deleted on the way. Not safe
        to run twice blindly (a second grant is more capacity), and never retried after an
        ambiguous COMMIT (``hop``): a lost grant is capacity held until it ages out, never
        capacity used twice."""
        limits = _Limits(rpm=rpm, tpm=tpm, window_s=window_s, valid_s=valid_s)
        reported = {user: n for user, n in (tokens or {}).items() if n > 0}
        asked = {user: n for user, n in wants.items() if n > 0}
        with self.engine.begin() as conn:
            now = self._gate(conn)
            for row_id, count in give_back:
                conn.execute(_GIVE_BACK, {"b_id": row_id, "b_n": count})
            if purge:
                conn.execute(_PURGE, {"b_before": now - KEPT_WINDOWS * max(limits.span, 60.0)})
            params = limits.params(now)
            used = _used(conn, params, sum(reported.values()))
            if not asked:
                _record(conn, now, {}, reported)
                return Grant(at=now)
            waiting = _waiting(conn, waiter, asked, params, reported, now)
            free = room(used, limits.pace, rpm=rpm, tpm=tpm)
            given = shares(free, waiting, rpm=rpm, tpm=tpm)
            grant = {user: min(n, given.get(user, 0)) for user, n in asked.items()}
            rows = _record(conn, now, grant, reported)
            short = {user: n - grant[user] for user, n in asked.items() if n > grant[user]}
            since = {w.user: w.since for w in waiting}
            conn.execute(_FORGET, {"b_waiter": waiter})
            full = free is not None and sum(given.values()) >= free
            if not (short or full):
                return Grant(granted=grant, rows=rows, at=now)
            # Full: when more is due, so that the caller's next runs sleep until then.
            owed = sum(given.values()) - sum(grant.values())
            next_at, limit = _next_due(conn, limits, now, used, sum(given.values()), owed)
            if short:
                conn.execute(
                    _WAIT,
                    [
                        {
                            "waiter": waiter,
                            "user_id": user,
                            "wanting": n,
                            "since": since.get(user, now),
                            "until": next_at + GRACE_S,
                        }
                        for user, n in short.items()
                    ],
                )
        return Grant(granted=grant, rows=rows, at=now, next_at=next_at, limit=limit)

    def forget_waits(self, waiter: str) -> None:
        """Strike ``waiter``'s waiting users (its limiter is closing)."""
        with self.engine.begin() as conn:
            conn.execute(_FORGET, {"b_waiter": waiter})

    def _gate(self, conn: Connection) -> float:
        """Lock the gate row (put it back if a restore lost it, so leases are still decided
        one at a time); the database's now."""
        if conn.execute(self.dialect.lock(_GATE)).first() is None:
            conn.execute(self.dialect.insert_new(gates).values(name="model"))
            conn.execute(self.dialect.lock(_GATE)).one()
        return float(conn.execute(_NOW).scalar_one())

    def note_rate_limited(self, lease: Lease, data: dict[str, object]) -> bool:
        """Write the run's ``rate_limited`` event unless its step has one already (one came
        after the run's last ``model_turn``), so it shows at most once per step, whoever
        carries the step; fenced like every write of an owner (``LeaseLost``). Whether it
        was written. Safe twice: the second finds the first."""
        with self.begin() as conn:
            if conn.execute(self.dialect.lock(LEASE_HELD), lease_params(lease)).first() is None:
                raise LeaseLost("this worker no longer owns the run", run_id=lease.run_id)
            last = {
                kind: conn.execute(_LAST_OF_KIND, {"b_id": lease.run_id, "b_kind": kind}).scalar()
                for kind in ("rate_limited", "model_turn")
            }
            if last["rate_limited"] is not None and (
                last["model_turn"] is None or last["rate_limited"] > last["model_turn"]
            ):
                return False
            add_event(conn, lease.run_id, "rate_limited", dict(data))
        return True


def _used(conn: Connection, params: dict[str, float], reported: int) -> Used:
    """What the fleet used, the tokens being reported now included."""
    requests, tokens, paced, paced_tokens = (int(v) for v in conn.execute(_USED, params).one())
    return Used(
        requests=requests,
        tokens=tokens + reported,
        paced_requests=paced,
        paced_tokens=paced_tokens + reported,
    )


def _waiting(
    conn: Connection,
    waiter: str,
    asked: Mapping[str, int],
    params: dict[str, float],
    reported: Mapping[str, int],
    now: float,
) -> list[Waiting]:
    """Every user waiting fleet-wide (``asked`` for ``waiter``, the other limiters' rows
    still good), each with what it used of the window."""
    conn.execute(_LAPSED, {"b_now": now})
    mine: dict[str, float] = {}
    others: list[tuple[str, int, float]] = []
    for row in conn.execute(_WAITS):
        if row.waiter == waiter:
            mine[row.user_id] = float(row.since)
        else:
            others.append((row.user_id, int(row.wanting), float(row.since)))
    used = {user: (int(r), int(t)) for user, r, t in conn.execute(_USED_BY_USER, params)}
    for user, n in reported.items():
        requests, tokens = used.get(user, (0, 0))
        used[user] = (requests, tokens + n)
    return merged(asked, mine, others, used, now)


def _record(
    conn: Connection, now: float, grant: Mapping[str, int], reported: Mapping[str, int]
) -> dict[str, int]:
    """One row per user granted or reporting tokens; the granted users' row ids."""
    rows: dict[str, int] = {}
    for user in sorted({*grant, *reported}):
        requests, tokens = grant.get(user, 0), reported.get(user, 0)
        if requests or tokens:
            values = {"b_at": now, "b_requests": requests, "b_tokens": tokens, "b_user": user}
            row_id = conn.execute(_INSERT, values).scalar_one()
            if requests:
                rows[user] = row_id
    return rows


def _next_due(
    conn: Connection, limits: _Limits, now: float, used: Used, given: int, owed: int
) -> tuple[float, str]:
    """When capacity is next expected for a limiter left short, now that ``given`` starts
    were given out and ``owed`` of them are other limiters' to take: the latest time at
    which every limit that binds frees (the window's and its spread's), and which binds
    then. Never sooner than ``RETRY_S`` from now."""
    pace = limits.pace
    due: list[tuple[float, str]] = []

    def rows(statement: sa.Select[tuple[float, int]], span: float) -> list[tuple[float, int]]:
        return [
            (float(a), int(n)) for a, n in conn.execute(statement, {"b_rows_since": now - span})
        ]

    if limits.rpm is not None and used.requests + given >= limits.rpm:
        due.append(
            (free_at(rows(_REQUEST_ROWS, limits.span), limits.rpm - owed, limits.span), "rpm")
        )
    if pace.requests is not None and used.paced_requests + given >= pace.requests:
        spread = pace.requests_s
        due.append((free_at(rows(_REQUEST_ROWS, spread), pace.requests - owed, spread), "rpm"))
    if limits.tpm is not None and used.tokens >= limits.tpm:
        due.append(
            (free_at(rows(_TOKEN_ROWS, limits.window_s), limits.tpm, limits.window_s), "tpm")
        )
    if pace.tokens is not None and used.paced_tokens >= pace.tokens:
        spread = pace.tokens_s
        due.append((free_at(rows(_TOKEN_ROWS, spread), pace.tokens, spread), "tpm"))
    at, limit = max(due, default=(now, "rpm"))
    return max(at, now + RETRY_S), limit
