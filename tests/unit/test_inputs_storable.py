"""Input no backend can store (``tether.inputs.storable``): a NUL character or a lone
surrogate in any string or key, at any depth, is ``invalid_input`` naming where it is; the
JSON reader and every engine method (``opens``) refuse it before anything else; and a
start time must exist in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tether.engine.opening import opens
from tether.errors import InvalidInput
from tether.inputs import json_value, start_at, storable


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("q\x00", "^question must not contain NUL characters$"),
        ({"item": "b\x00"}, "^item in question must not contain NUL"),
        ({"a": [1, {"deep": ["x", "y\x00"]}]}, r"^a\[1\]\.deep\[1\] in question must not"),
        ({"ok": 1, "k\x00": 2}, "^a key of question must not contain NUL"),
        ({"a": {"k\ud800": 1}}, "^a key of a in question is not valid Unicode text"),
        (["\udfff"], r"^\[0\] in question is not valid Unicode text"),
        (("t", "u\x00"), r"^\[1\] in question must not"),
    ],
)
def test_a_nul_or_a_lone_surrogate_anywhere_is_refused_saying_where(value: Any, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        storable(value, "question")


def test_what_can_be_stored_passes_whatever_its_shape() -> None:
    fine = {"a": ["é", "\u202e", "\\u0000", 1, 2.5, None, True], "b": {"c": "\ufffd"}}
    storable(fine, "x")  # nothing raised: escaped text and other characters are kept as sent
    looped: dict[str, Any] = {"name": "ok"}
    looped["self"] = looped  # a structure that holds itself is walked once, not forever
    storable(looped, "x")
    storable(datetime.now(UTC), "x")  # other objects are not strings


def test_the_json_reader_refuses_an_escaped_nul_but_keeps_an_escaped_backslash() -> None:
    with pytest.raises(InvalidInput, match=r"^arguments\.item in the body must not contain NUL"):
        json_value('{"arguments": {"item": "b\\u0000"}}', "the body")
    with pytest.raises(InvalidInput, match="lone surrogate"):
        json_value('["\\ud800"]', "the body")
    assert json_value('{"a": "\\\\u0000"}', "the body") == {"a": "\\u0000"}
    assert json_value('"\\ud83d\\ude00"', "the body") == "\U0001f600"  # a pair is a character


class Door:
    """An engine-like object: ``opens`` checks its methods' arguments, then opens it."""

    opened = 0

    async def open(self) -> None:
        self.opened += 1

    @opens
    async def decide(self, run_id: str, approver: str, *, decisions: list[Any]) -> str:
        return f"{run_id}:{approver}:{len(decisions)}"


async def test_an_engine_method_refuses_unstorable_arguments_by_name_before_opening() -> None:
    door = Door()
    with pytest.raises(InvalidInput, match=r"^approver must not contain NUL"):
        await door.decide("r1", "dana\x00", decisions=[])
    with pytest.raises(InvalidInput, match=r"^\[0\]\.reason in decisions must not"):
        await door.decide("r1", "dana", decisions=[{"reason": "no\x00"}])
    assert door.opened == 0  # refused before anything else
    assert await door.decide("r1", "dana", decisions=[{"reason": "ok"}]) == "r1:dana:1"
    assert door.opened == 1


@pytest.mark.parametrize(
    "value",
    [
        "0001-01-01T00:00:00+00:01",  # year 0 in UTC
        "9999-12-31T23:59:59-14:00",  # year 10000 in UTC
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),
        "2030-01-01T00:00:00Z\x00",  # fromisoformat would read past the NUL
    ],
)
def test_a_start_time_outside_utcs_years_or_with_a_nul_is_invalid_input(value: Any) -> None:
    with pytest.raises(InvalidInput, match="start_at"):
        start_at(value)


def test_the_first_and_last_seconds_of_utcs_years_are_start_times() -> None:
    assert start_at("0001-01-01T00:00:00+00:00") == datetime(1, 1, 1, tzinfo=UTC).timestamp()
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert start_at("9999-12-31T23:59:59Z") == last.timestamp()
