"""Schedules (reference §13): validating a cron expression and its timezone, the ticks it
gives, adding, reading and deleting schedules (the Engine's schedule methods call these),
and firing the ticks that are due.

A schedule's expression has the five standard fields (or ``@hourly``, ``@daily``,
``@weekly``, ``@monthly``), read by croniter in the schedule's IANA timezone (UTC by
default), so a tick at 09:00 in Europe/Paris stays at 09:00 across daylight saving
changes. Every time compared is the database's clock: ``next_at`` is computed from it
and a tick is due once that clock passes it.

Firing (``fire_due``, a worker's side task): for each due schedule, the scope of its user
is resolved, then one transaction claims the tick (``next_at`` moved on to the first tick
after now, conditional on the value read) and inserts its run; ticks that passed while no
worker ran are counted ``missed`` and start no run of their own, so a fleet that comes
back after downtime starts one catch-up run per schedule.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.step.first_messages import first_messages
from tether.budget import Limits, parse_limits, within_cap
from tether.errors import InvalidInput, NotFound
from tether.failpoints import fail
from tether.runs import Run, iso
from tether.store.schedules import ScheduleRecord
from tether.telemetry.metrics import SCHEDULE_TICKS

if TYPE_CHECKING:
    from tether._runtime.shared.services import Services

log = logging.getLogger(__name__)

ALIASES = frozenset({"@hourly", "@daily", "@weekly", "@monthly"})
MAX_CRON_CHARS = 255
# Ticks counted one by one when a schedule was missed for long; past this many the
# count stops (a minutely schedule missed for a week is ``10000``, not 10,080).
MAX_MISSED_COUNTED = 10_000
# Due schedules fired per pass; a pass goes on while a batch came back full.
BATCH = 50


def cron(expression: Any) -> str:
    """A cron expression of five fields, or one of ``ALIASES``, that fires (``0 0 31 2 *``
    never does); else ``invalid_input``."""
    shape = (
        "cron must be five fields (minute hour day-of-month month day-of-week, such as "
        "'0 9 * * 1') or one of @hourly, @daily, @weekly, @monthly"
    )
    if not isinstance(expression, str) or len(expression) > MAX_CRON_CHARS:
        raise InvalidInput(shape)
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text not in ALIASES:
            raise InvalidInput(shape)
        return text
    if len(text.split(" ")) != 5 or not croniter.is_valid(text):
        raise InvalidInput(shape)
    try:  # whether it fires does not depend on the zone or the year: one search tells
        croniter(text, datetime.now(UTC)).get_next(datetime)
    except CroniterError:
        raise InvalidInput(f"cron {text!r} never fires (no day matches it)") from None
    return text


def timezone(name: Any) -> str:
    """An IANA timezone name (``Europe/Paris``, ``UTC``); else ``invalid_input``."""
    problem = "timezone must be an IANA timezone name, such as Europe/Paris or UTC"
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise InvalidInput(problem)
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"{problem}; {name!r} is not one") from exc
    return name


def next_tick(expression: str, zone: str, after: float) -> float:
    """The first tick of ``expression`` in ``zone`` strictly after ``after`` (epoch s)."""
    start = datetime.fromtimestamp(after, ZoneInfo(zone))
    return float(croniter(expression, start).get_next(datetime).timestamp())


def missed_ticks(schedule: ScheduleRecord, now: float) -> tuple[int, float]:
    """The ticks of ``schedule`` that passed after its due one, up to ``now``, and the
    first tick after ``now`` (its ``next_at`` once this tick is fired)."""
    missed, tick = 0, next_tick(schedule.cron, schedule.timezone, schedule.next_at)
    while tick <= now and missed < MAX_MISSED_COUNTED:
        missed += 1
        tick = next_tick(schedule.cron, schedule.timezone, tick)
    if tick <= now:
        tick = next_tick(schedule.cron, schedule.timezone, now)
    return missed, tick


async def add_schedule(
    services: Services,
    user: str,
    cron_expression: str,
    question: str,
    *,
    limits: Limits | Mapping[str, Any] | None = None,
    timezone_name: str = "UTC",
) -> ScheduleRecord:
    """A schedule of ``user``: each tick of ``cron_expression`` (in ``timezone_name``)
    starts a run of ``user`` asking ``question`` with ``limits``. ``invalid_input``
    for a bad expression, timezone, question or limits (nothing is stored)."""
    inputs.user_id(user)
    inputs.text(question, "question", inputs.MAX_QUESTION_CHARS)
    expression, zone = cron(cron_expression), timezone(timezone_name)
    given = limits.to_json() if isinstance(limits, Limits) else limits
    if given is not None:  # checked now, applied to each run as it starts
        settings = services.settings
        limits_ = parse_limits(dict(given), settings.default_limits)
        within_cap(limits_, settings.max_limits, "the schedule's limits")
    added = await hop(
        services.store.create_schedule,
        schedule_id=uuid.uuid4().hex,
        user_id=user,
        cron=expression,
        timezone=zone,
        question=question,
        limits=dict(given) if given is not None else None,
        first_tick=lambda now: next_tick(expression, zone, now),
    )
    services.schedules_added.set()  # this process's ticking wakes for it
    return added


async def list_schedules(services: Services, user: str | None = None) -> list[ScheduleRecord]:
    """``user``'s schedules (everyone's without ``user``: the operator's view)."""
    return await hop(services.store.list_schedules, user)


async def get_schedule(
    services: Services, schedule_id: str, *, user: str | None = None
) -> ScheduleRecord:
    """A schedule; ``not_found`` when it is missing or not ``user``'s."""
    found = await hop(services.store.get_schedule, _schedule_id(schedule_id))
    if found is None or (user is not None and found.user_id != user):
        raise NotFound("no such schedule")
    return found


async def delete_schedule(services: Services, schedule_id: str, *, user: str) -> None:
    """Delete ``user``'s schedule (its runs stay); ``not_found`` if it is not theirs."""
    if not await hop(services.store.delete_schedule, _schedule_id(schedule_id), user):
        raise NotFound("no such schedule")


def _schedule_id(value: Any) -> str:
    if not isinstance(value, str) or not inputs.RUN_ID.fullmatch(value):
        raise NotFound("no such schedule")
    return value


async def fire_due(services: Services) -> int:
    """Fire every schedule due now, by the database's clock: one run per schedule, however
    many ticks of it passed; the number of runs this process started. Another worker that
    fired a tick first makes this one a no-op for it."""
    fired = 0
    while True:
        now, due = await hop(services.store.due_schedules, BATCH)
        # In an order of its own, so workers racing for one batch mostly fire different
        # ticks rather than queue on the same rows.
        random.shuffle(due)
        for schedule in due:
            if await _fire(services, schedule, now) is not None:
                fired += 1
        if len(due) < BATCH:
            return fired


async def _fire(services: Services, schedule: ScheduleRecord, now: float) -> Run | None:
    missed, next_at = missed_ticks(schedule, now)
    agent = services.agent
    scope = await agent.resolve_scope(schedule.user_id)
    settings = services.settings
    limits = parse_limits(schedule.limits, settings.default_limits).at_most(settings.max_limits)
    run = {
        "run_id": uuid.uuid4().hex,
        "user_id": schedule.user_id,
        "question": schedule.question,
        "route": {"agent": agent.name},
        "limits": limits,
        "scope": scope.to_json(),
        "versions": agent.versions(),
        "agent_version": agent.agent_version,
        "messages": first_messages(agent, schedule.question, follow_up=False),
        # No priority: 0, or the user's bound when it is lower (``users.admit``).
        "priority_bound": settings.max_priority,
    }
    started = await hop(
        services.store.fire_tick,
        schedule,
        next_at=next_at,
        missed=missed,
        run=run,
        between=lambda: fail("after_tick_claim"),
    )
    if started is None:
        return None
    SCHEDULE_TICKS.labels(outcome="fired").inc()
    if missed:
        SCHEDULE_TICKS.labels(outcome="missed").inc(missed)
    extra = {"action": "tick", "run_id": started.id, "schedule_id": schedule.id}
    log.info("schedule fired", extra={**extra, "missed": missed, "next_at": iso(next_at)})
    return started
