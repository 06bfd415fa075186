"""Schedules' cron expressions and timezones (reference §13): what is accepted, the next
tick in a timezone (across a daylight saving change), and ticks missed counted."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tether._runtime.fleet.schedules import cron, missed_ticks, next_tick, timezone
from tether.errors import InvalidInput
from tether.store.schedules import ScheduleRecord


@pytest.mark.parametrize(
    "expression",
    [
        "* * * * *",
        "0 9 * * 1",
        "*/15 8-18 * * 1-5",
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "  0   9 * *  MON ",
    ],
)
def test_five_fields_and_the_four_aliases_are_accepted(expression: str) -> None:
    assert cron(expression) == " ".join(expression.split())


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "* * * *",
        "* * * * * *",
        "0 0 9 * * 1",
        "61 * * * *",
        "@yearly",
        "@reboot",
        "every monday",
        "0 9 * * 8",
        None,
        5,
        "x" * 300,
    ],
)
def test_anything_else_is_invalid_input(expression: object) -> None:
    with pytest.raises(InvalidInput, match="five fields"):
        cron(expression)


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *", "0 12 31 4,6,9,11 *"])
def test_a_well_formed_expression_that_never_fires_is_invalid_input(expression: str) -> None:
    with pytest.raises(InvalidInput, match="never fires"):
        cron(expression)


def test_an_expression_that_fires_only_in_leap_years_is_accepted() -> None:
    assert cron("0 0 29 2 *") == "0 0 29 2 *"
    after = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
    assert next_tick("0 0 29 2 *", "UTC", after) == datetime(2028, 2, 29, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("name", ["", "Mars/Olympus", "../etc/passwd", "utc+1", None, "x" * 65])
def test_an_unknown_timezone_is_invalid_input(name: object) -> None:
    with pytest.raises(InvalidInput, match="IANA"):
        timezone(name)


def test_the_next_tick_is_in_the_schedules_timezone() -> None:
    monday_8_utc = datetime(2026, 12, 7, 8, 0, tzinfo=UTC).timestamp()
    paris = next_tick("0 9 * * *", timezone("Europe/Paris"), monday_8_utc - 1)
    assert paris == monday_8_utc  # 09:00 in Paris is 08:00 UTC in winter
    assert next_tick("0 9 * * *", "UTC", monday_8_utc) == monday_8_utc + 3600


def test_a_tick_in_the_hour_skipped_by_daylight_saving_still_comes_once_in_the_future() -> None:
    paris = ZoneInfo("Europe/Paris")
    before = datetime(2027, 3, 27, 12, 0, tzinfo=paris).timestamp()
    first = next_tick("30 2 * * *", "Europe/Paris", before)
    second = next_tick("30 2 * * *", "Europe/Paris", first)
    assert before < first < second
    assert datetime.fromtimestamp(first, paris).date().isoformat() == "2027-03-28"
    assert datetime.fromtimestamp(second, paris).hour == 2  # back to 02:30 the day after
    assert second - first < 86_400 + 3600


def _schedule(next_at: float) -> ScheduleRecord:
    return ScheduleRecord(
        id="s",
        user_id="u",
        cron="0 * * * *",
        timezone="UTC",
        question="q",
        limits=None,
        next_at=next_at,
        created_at=0.0,
        last_fired_at=None,
        fired=0,
        missed=0,
    )


def test_ticks_missed_while_no_worker_ran_are_counted_and_the_next_is_after_now() -> None:
    due = datetime(2026, 12, 7, 8, 0, tzinfo=UTC).timestamp()
    now = due + 3 * 3600 + 60  # 11:01: the 09:00, 10:00 and 11:00 ticks passed too
    missed, following = missed_ticks(_schedule(due), now)
    assert missed == 3 and following == due + 4 * 3600
    assert missed_ticks(_schedule(due), due + 1) == (0, due + 3600)
