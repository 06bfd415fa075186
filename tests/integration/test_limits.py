"""One cap on limits (``TETHER_MAX_LIMITS``, reference §5, §6), on both backends: a start, a
continuation (its default grant or named limits) and a fork are each refused with
``invalid_input`` naming the limit and the cap when they would give a run more than the
cap, and nothing is created or changed; the default limits of a new run are lowered to a
cap below them.

No worker runs here: the tests carry runs with ``engine.run_until_stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import inprocess
import pytest

from tether import Engine, StopKind
from tether.api.app import create_app
from tether.budget import Limits
from tether.errors import InvalidInput

DANA = {"Authorization": "Bearer key-of-dana"}
# Tighter than the default cap, and above the default limits of a new run but for steps.
CAP = Limits(max_steps=6, max_spend_usd=2.0, max_tool_calls=50, max_elapsed_ms=900_000)
DEFAULT_CAP: dict[str, Any] = {
    "max_steps": 200,
    "max_spend_usd": 50.0,
    "max_tool_calls": 400,
    "max_elapsed_ms": 86_400_000,
}


async def stored(engine: Engine) -> list[tuple[Any, ...]]:
    """Everything a refused request could have changed."""
    return [
        (
            r.id,
            r.state.value,
            r.updated_at,
            r.message_count,
            r.limits,
            len(await engine.events(r.id)),
        )
        for r in await engine.list_runs(None, limit=1000)
    ]


@asynccontextmanager
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    await engine.operator.add_user("dana", "key-of-dana")
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
        yield c


def over_the_cap(response: httpx.Response, limit: str, cap: dict[str, Any]) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"ok", "error", "message", "limit", "cap"}, body
    assert body["error"] == "invalid_input" and body["limit"] == limit and body["cap"] == cap
    assert limit in body["message"] and "TETHER_MAX_LIMITS" in body["message"], body


async def test_a_start_over_the_default_cap_is_refused_naming_the_limit_and_creates_nothing(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url)
    try:
        async with client(engine) as c:
            response = await c.post(
                "/v1/runs",
                json={"question": "q", "limits": {"max_spend_usd": 1_000_000}},
                headers=DANA,
            )
            over_the_cap(response, "max_spend_usd", DEFAULT_CAP)
            assert "1000000" in response.json()["message"] and "50" in response.json()["message"]
        with pytest.raises(InvalidInput) as refused:
            await engine.start_run("dana", "q", limits={"max_tool_calls": 401})
        assert refused.value.details == {"limit": "max_tool_calls", "cap": DEFAULT_CAP}
        assert await stored(engine) == []
        # At the cap is within it.
        at_cap = await engine.start_run("dana", "q", limits=DEFAULT_CAP)
        assert at_cap.limits == Limits(**DEFAULT_CAP)
    finally:
        engine.close()


async def test_a_configured_cap_bounds_starts_and_lowers_the_default_limits(db_url: str) -> None:
    engine = inprocess.engine(db_url, max_limits=CAP)
    try:
        async with client(engine) as c:
            response = await c.post(
                "/v1/runs", json={"question": "q", "limits": {"max_steps": 7}}, headers=DANA
            )
            over_the_cap(response, "max_steps", CAP.to_json())
        assert await stored(engine) == []
        # The default 20 steps are over a cap of 6: a new run gets 6; the rest are defaults.
        run = await engine.start_run("dana", "q")
        assert run.limits == Limits(max_steps=6)
    finally:
        engine.close()


async def test_a_continuation_over_the_cap_is_refused_by_default_grant_or_named_limits(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, max_limits=CAP)
    try:
        run = await engine.start_run("dana", "do the thing", limits={"max_steps": 1})
        assert (await engine.run_until_stop(run.id)).kind is StopKind.HALTED
        async with client(engine) as c:
            before = await stored(engine)
            response = await c.post(
                f"/v1/runs/{run.id}/continue",
                json={"limits": {"max_tool_calls": 51}},
                headers=DANA,
            )
            over_the_cap(response, "max_tool_calls", CAP.to_json())
            assert await stored(engine) == before
            # 6 steps are within the cap; the default grant would then be 10.
            response = await c.post(
                f"/v1/runs/{run.id}/continue", json={"limits": {"max_steps": 6}}, headers=DANA
            )
            assert response.status_code == 200, response.text
        await engine.cancel_run(run.id, "dana")

        tight = {"max_steps": 1, "max_tool_calls": 47}
        halted = await engine.start_run("dana", "do the thing", limits=tight)
        assert (await engine.run_until_stop(halted.id)).kind is StopKind.HALTED
        before = await stored(engine)
        with pytest.raises(InvalidInput) as refused:  # the default grant: 47 + 4 calls > 50
            await engine.continue_run(halted.id, "dana")
        assert refused.value.details == {"limit": "max_tool_calls", "cap": CAP.to_json()}
        assert await stored(engine) == before
    finally:
        engine.close()


async def test_a_fork_of_a_run_whose_limits_are_over_the_cap_is_refused_and_creates_nothing(
    db_url: str,
) -> None:
    generous = inprocess.engine(db_url)
    try:
        parent = await generous.start_run("dana", "do the thing", limits={"max_steps": 100})
        outcome = await generous.run_until_stop(parent.id)
        assert outcome.kind is StopKind.SUSPENDED
    finally:
        generous.close()
    engine = inprocess.engine(db_url, max_limits=CAP)  # the cap was lowered since
    try:
        before = await stored(engine)
        async with client(engine) as c:
            response = await c.post(f"/v1/runs/{parent.id}/fork", json={"at_step": 1}, headers=DANA)
            over_the_cap(response, "max_steps", CAP.to_json())
        with pytest.raises(InvalidInput):
            await engine.fork_run(parent.id, "dana", at_step=1)
        assert await stored(engine) == before
    finally:
        engine.close()
