"""The fleet's model rate (reference §17): leases of request starts and the tokens reported,
in ``model_usage``, decided one at a time under the ``gates`` row ``model``.

``lease_capacity`` is one transaction: lock the gate (``FOR UPDATE`` on PostgreSQL; SQLite
serialises writers at ``BEGIN IMMEDIATE``), read the database's clock, sum the requests of
the rows of the last ``window_s + valid_s`` seconds and the tokens of the last ``window_s``,
grant up to the requests asked for, and insert one row holding the grant and the tokens
the caller reports. A granted slot is good for ``valid_s`` after the row's ``at``: counting
requests over ``window_s + valid_s`` makes every slot used in that time still obey "no more
than RPM request starts in any ``window_s``" (``window`` below has the argument).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from tether.errors import LeaseLost
from tether.runs import Lease
from tether.store.base import StoreBase
from tether.store.clock import db_now
from tether.store.schema import gates, model_usage, run_events
from tether.store.statements import LEASE_HELD, add_event, lease_params

# Rows older than this many windows are deleted when a lease is asked to purge.
KEPT_WINDOWS = 2.0

_GATE = sa.select(gates.c.name).where(gates.c.name == "model")
_NOW = sa.select(db_now())
_USED = sa.select(
    sa.func.coalesce(sa.func.sum(model_usage.c.requests), 0),
    sa.func.coalesce(
        sa.func.sum(
            sa.case((model_usage.c.at > sa.bindparam("b_tokens_since"), model_usage.c.tokens))
        ),
        0,
    ),
).where(model_usage.c.at > sa.bindparam("b_since"))
_REQUEST_ROWS = (
    sa.select(model_usage.c.at, model_usage.c.requests)
    .where(model_usage.c.at > sa.bindparam("b_since"), model_usage.c.requests > 0)
    .order_by(model_usage.c.at)
)
_TOKEN_ROWS = (
    sa.select(model_usage.c.at, model_usage.c.tokens)
    .where(model_usage.c.at > sa.bindparam("b_since"), model_usage.c.tokens > 0)
    .order_by(model_usage.c.at)
)
_INSERT = (
    model_usage.insert()
    .values(
        at=sa.bindparam("b_at"),
        requests=sa.bindparam("b_requests"),
        tokens=sa.bindparam("b_tokens"),
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
# The latest ``rate_limited`` and ``model_turn`` events of a run: a step has had its
# ``rate_limited`` event when one came after the run's last stored turn.
_LAST_OF_KIND = sa.select(sa.func.max(run_events.c.id)).where(
    run_events.c.run_id == sa.bindparam("b_id"), run_events.c.kind == sa.bindparam("b_kind")
)


@dataclass(frozen=True, kw_only=True)
class Grant:
    """What one lease decided: ``granted`` request starts (0 when full), the row that
    holds them (``lease_id``, None when nothing was inserted), the database time ``at``
    of the decision and, when no capacity is left after it, ``next_at``: the database time
    at which capacity is next expected (rows of the window aging out), with ``limit``, the
    one that binds then (``"rpm"`` or ``"tpm"``)."""

    granted: int
    lease_id: int | None
    at: float
    next_at: float | None = None
    limit: str | None = None


def granted(want: int, requests: int, tokens: int, *, rpm: int | None, tpm: int | None) -> int:
    """How many of ``want`` request starts may be granted while ``requests`` were leased in
    the request window and ``tokens`` reported in the token window: none while the
    tokens are at ``tpm`` or over; else up to what ``rpm`` leaves."""
    if tpm is not None and tokens >= tpm:
        return 0
    if rpm is None:
        return want
    return max(0, min(want, rpm - requests))


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


class Rates(StoreBase):
    """Leases of model capacity, reported tokens and the ``rate_limited`` event."""

    def lease_capacity(
        self,
        *,
        requests: int,
        rpm: int | None,
        tpm: int | None,
        window_s: float,
        valid_s: float,
        tokens: int = 0,
        give_back: Sequence[tuple[int, int]] = (),
        purge: bool = False,
    ) -> Grant:
        """Grant up to ``requests`` request starts (0: only report), having first given
        back the unused slots of ``give_back`` (``(lease_id, count)``) and recorded
        ``tokens`` (ended requests' input and output tokens) at the database's now; with
        ``purge``, rows older than ``KEPT_WINDOWS`` windows are deleted on the way. Not
        safe to run twice blindly (a second grant is more capacity), and never retried
        after an ambiguous COMMIT (``hop``): a lost grant is capacity held until it ages
        out, never capacity used twice."""
        span = window(window_s, valid_s)
        with self.engine.begin() as conn:
            if conn.execute(self.dialect.lock(_GATE)).first() is None:
                # The migration's row is gone (a restore without it): put it back, so that
                # leases are still decided one at a time, never side by side unlocked.
                conn.execute(self.dialect.insert_new(gates).values(name="model"))
                conn.execute(self.dialect.lock(_GATE)).one()
            now = float(conn.execute(_NOW).scalar_one())
            for row_id, count in give_back:
                conn.execute(_GIVE_BACK, {"b_id": row_id, "b_n": count})
            if purge:
                conn.execute(_PURGE, {"b_before": now - KEPT_WINDOWS * max(span, 60.0)})
            params = {"b_since": now - span, "b_tokens_since": now - window_s}
            used, seen = (int(v) for v in conn.execute(_USED, params).one())
            seen += tokens
            grant = granted(requests, used, seen, rpm=rpm, tpm=tpm)
            lease_id: int | None = None
            if grant or tokens:
                values = {"b_at": now, "b_requests": grant, "b_tokens": tokens}
                lease_id = conn.execute(_INSERT, values).scalar_one()
            full_rpm = rpm is not None and used + grant >= rpm
            full_tpm = tpm is not None and seen >= tpm
            if not requests or not (full_rpm or full_tpm):
                return Grant(granted=grant, lease_id=lease_id, at=now)
            due: dict[str, float] = {}
            if full_rpm and rpm is not None:
                rows = [(float(a), int(n)) for a, n in conn.execute(_REQUEST_ROWS, params)]
                due["rpm"] = free_at(rows, rpm, span)
            if full_tpm and tpm is not None:
                since = {"b_since": now - window_s}
                rows = [(float(a), int(n)) for a, n in conn.execute(_TOKEN_ROWS, since)]
                due["tpm"] = free_at(rows, tpm, window_s)
        limit = max(due, key=lambda name: due[name])
        return Grant(granted=grant, lease_id=lease_id, at=now, next_at=due[limit], limit=limit)

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
