"""Schedules (reference §13): a cron expression in a timezone and the question each tick
asks as the schedule's user, with the next tick due (``next_at``, the database's clock).

A tick is claimed by a conditional UPDATE that moves ``next_at`` on from the value the
firing worker read, in the transaction that also inserts its run (``creation.insert_run``):
a second worker's UPDATE of the same tick matches no row and creates nothing, and a
worker that dies between the two leaves neither (the transaction never committed), so
every tick starts exactly one run, fleet-wide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Row

from tether.runs import Run, iso
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.creation import insert_run
from tether.store.sql.schema import schedules
from tether.store.users import admit, is_removed

_ID = schedules.c.id == sa.bindparam("b_id")
_OF_USER = schedules.c.user_id == sa.bindparam("b_user")
_NOW = sa.select(db_now())
_DUE = (
    sa.select(schedules)
    .where(schedules.c.next_at <= db_now())
    .order_by(schedules.c.next_at)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
)
_NEXT_DUE_IN = sa.select(sa.func.min(schedules.c.next_at) - db_now())
_TICK = (
    schedules.update()
    .where(_ID, schedules.c.next_at == sa.bindparam("b_expected", type_=sa.Float))
    .values(
        next_at=sa.bindparam("b_next", type_=sa.Float),
        fired=schedules.c.fired + 1,
        missed=schedules.c.missed + sa.bindparam("b_missed", type_=sa.Integer),
        last_fired_at=db_now(),
    )
    .returning(schedules.c.id)
)


@dataclass(frozen=True, kw_only=True)
class ScheduleRecord:
    """A schedule as stored; times in epoch seconds of the database's clock."""

    id: str
    user_id: str
    cron: str
    timezone: str
    question: str
    limits: dict[str, Any] | None
    next_at: float
    created_at: float
    last_fired_at: float | None
    fired: int
    missed: int

    def to_json(self) -> dict[str, Any]:
        """The schedule as the API shows it (reference §13), times ISO-8601 in UTC."""
        last = self.last_fired_at
        return {
            "id": self.id,
            "user_id": self.user_id,
            "cron": self.cron,
            "timezone": self.timezone,
            "question": self.question,
            "limits": self.limits,
            "next_at": iso(self.next_at),
            "created_at": iso(self.created_at),
            "last_fired_at": None if last is None else iso(last),
            "fired": self.fired,
            "missed": self.missed,
        }

    @classmethod
    def from_row(cls, row: Row[Any]) -> ScheduleRecord:
        m = row._mapping
        return cls(**{name: m[name] for name in cls.__dataclass_fields__})


class Schedules(StoreBase):
    """Creating, listing, deleting schedules and firing their ticks."""

    def create_schedule(
        self,
        *,
        schedule_id: str,
        user_id: str,
        cron: str,
        timezone: str,
        question: str,
        limits: dict[str, Any] | None,
        first_tick: Callable[[float], float],
    ) -> ScheduleRecord:
        """Store a schedule whose first tick is ``first_tick(now)``, ``now`` being the
        database's clock, in one transaction; ``InvalidInput`` if the user was removed."""
        with self.begin() as conn:
            admit(conn, self.dialect, user_id)
            now = float(conn.execute(_NOW).scalar_one())
            row = conn.execute(
                schedules.insert()
                .values(
                    id=schedule_id,
                    user_id=user_id,
                    cron=cron,
                    timezone=timezone,
                    question=question,
                    limits=limits,
                    next_at=first_tick(now),
                    created_at=now,
                )
                .returning(schedules)
            ).one()
            return ScheduleRecord.from_row(row)

    def list_schedules(self, user_id: str | None) -> list[ScheduleRecord]:
        """``user_id``'s schedules (everyone's with None), oldest first."""
        query = sa.select(schedules).order_by(schedules.c.created_at, schedules.c.id)
        if user_id is not None:
            query = query.where(schedules.c.user_id == user_id)
        with self.engine.connect() as conn:
            return [ScheduleRecord.from_row(r) for r in conn.execute(query)]

    def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(schedules).where(_ID), {"b_id": schedule_id}).first()
            return ScheduleRecord.from_row(row) if row else None

    def delete_schedule(self, schedule_id: str, user_id: str) -> bool:
        """Delete ``user_id``'s schedule; False when there is none such. Its runs stay."""
        with self.begin() as conn:
            deleted = conn.execute(
                schedules.delete().where(_ID, _OF_USER), {"b_id": schedule_id, "b_user": user_id}
            )
            return deleted.rowcount > 0

    def due_schedules(self, limit: int) -> tuple[float, list[ScheduleRecord]]:
        """The database's clock now and up to ``limit`` schedules whose tick is due by it,
        the longest due first."""
        with self.engine.connect() as conn:
            now = float(conn.execute(_NOW).scalar_one())
            due = conn.execute(_DUE, {"b_limit": limit}).all()
            return now, [ScheduleRecord.from_row(r) for r in due]

    def next_tick_in(self) -> float | None:
        """Seconds until the earliest tick of any schedule (0 when one is due), by the
        database's clock; None without schedules."""
        with self.engine.connect() as conn:
            due = conn.execute(_NEXT_DUE_IN).scalar()
        return None if due is None else max(0.0, float(due))

    def fire_tick(
        self,
        schedule: ScheduleRecord,
        *,
        next_at: float,
        missed: int,
        run: dict[str, Any],
        between: Callable[[], None] = lambda: None,
    ) -> Run | None:
        """Claim the tick of ``schedule`` due at its ``next_at`` (moving it to
        ``next_at``, counting it fired and ``missed`` ticks skipped) and insert its run
        (``insert_run`` of ``run``, with the schedule's id), in one transaction; None
        when another worker claimed this tick first or the user was removed (nothing is
        written). ``between``
        runs after the claim and before the run's INSERT (the ``after_tick_claim``
        failpoint): whatever happens there, both or neither are stored.

        Safe to run twice or concurrently: the claim is conditional on ``next_at`` still
        being the value read, so of the workers racing for one tick exactly one wins."""
        params = {
            "b_id": schedule.id,
            "b_expected": schedule.next_at,
            "b_next": next_at,
            "b_missed": missed,
        }
        with self.begin() as conn:
            # The user's row before the schedule's, as a removal takes them (``users``).
            if is_removed(conn, self.dialect, schedule.user_id):
                return None
            if conn.execute(_TICK, params).first() is None:
                return None
            between()
            return insert_run(conn, self.dialect, schedule_id=schedule.id, **run)
