"""How high a priority a user may ask (reference §13) on both backends: ``TETHER_MAX_PRIORITY``
(default 0) or the user's own bound (``tether users add|set --max-priority``); above it is
``invalid_input`` naming the bound, with nothing stored, wherever a priority enters (a new
run over HTTP or in Python, a follow-up, a creation under an ``Idempotency-Key``); a lower
one is always allowed, and a run that asks none gets 0, or the bound when it is lower."""

from __future__ import annotations

import inprocess
import pytest
from json_api import DANA, MIGUEL, fingerprint, refused, serving

from tether.errors import InvalidInput, NotFound
from tether.store.sql.schema import schedules

YEARLY = "0 0 1 1 *"


async def test_by_default_nobody_may_ask_a_priority_above_0(db_url: str) -> None:
    async with serving(db_url) as api:
        before = await fingerprint(api.engine)
        response = await api.client.post(
            "/v1/runs", json={"question": "q", "priority": 1}, headers=DANA
        )
        body = refused(response, 422, "invalid_input", extras=("max_priority",))
        assert body["max_priority"] == 0 and "bound of 0" in body["message"]
        assert await fingerprint(api.engine) == before
        for allowed in (0, -10):
            run = await api.run(await api.start(priority=allowed))
            assert run["priority"] == allowed


async def test_a_users_own_bound_is_theirs_alone_and_applies_wherever_a_priority_enters(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        await api.engine.operator.set_user("dana", max_priority=7)
        first = await api.run(await api.start(priority=7))
        assert first["priority"] == 7
        before = await fingerprint(api.engine)
        follow_up = {"question": "q", "thread_id": first["thread_id"], "if_busy": "enqueue"}
        keyed = {"Idempotency-Key": "k-1", **DANA}
        for body, headers in [
            ({"question": "q", "priority": 8}, DANA),
            ({**follow_up, "priority": 8}, DANA),
            ({"question": "q", "priority": 8}, keyed),
            ({"question": "q", "priority": 1}, MIGUEL),  # miguel has the default bound, 0
        ]:
            response = await api.client.post("/v1/runs", json=body, headers=headers)
            refused(response, 422, "invalid_input", extras=("max_priority",))
        assert await fingerprint(api.engine) == before
        queued = await api.run(await api.start(**follow_up, priority=6))
        assert (queued["state"], queued["priority"]) == ("queued", 6)
        # The refused request left its key free.
        again = await api.client.post("/v1/runs", json={"question": "q"}, headers=keyed)
        assert again.status_code == 202, again.text
        with pytest.raises(InvalidInput, match="bound of 7"):
            await api.engine.start_run("dana", "q", priority=8)


async def test_a_bound_below_0_lowers_the_runs_that_ask_none(db_url: str) -> None:
    async with serving(db_url) as api:
        await api.engine.operator.set_user("dana", max_priority=-3)
        assert (await api.run(await api.start()))["priority"] == -3
        assert (await api.run(await api.start(priority=-5)))["priority"] == -5
        response = await api.client.post(
            "/v1/runs", json={"question": "q", "priority": 0}, headers=DANA
        )
        refused(response, 422, "invalid_input", extras=("max_priority",))
        scheduled = await api.engine.add_schedule("dana", YEARLY, "report")
        due = api.engine.runner.store.now() - 1
        with api.engine.runner.store.begin() as conn:
            conn.execute(schedules.update().values(next_at=due))
        assert (await api.engine.runner.fire_schedules())[0] == 1
        (fired,) = [r for r in await api.engine.list_runs("dana") if r.schedule_id]
        assert (fired.schedule_id, fired.priority) == (scheduled.id, -3)


async def test_tether_max_priority_is_everyones_bound_unless_they_have_their_own(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, max_priority=3)
    try:
        await engine.operator.add_user("erin", max_priority=9)
        assert (await engine.start_run("dana", "q", priority=3)).priority == 3
        with pytest.raises(InvalidInput, match="bound of 3"):
            await engine.start_run("dana", "q", priority=4)
        assert (await engine.start_run("erin", "q", priority=9)).priority == 9
        await engine.operator.set_user("erin", max_priority=-10)
        with pytest.raises(InvalidInput, match="bound of -10"):
            await engine.start_run("erin", "q", priority=-9)
        for bad in (11, -11, True, "3"):
            with pytest.raises(InvalidInput, match="max priority"):
                await engine.operator.set_user("erin", max_priority=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="setting"):
            await engine.operator.set_user("erin")
        with pytest.raises(NotFound):
            await engine.operator.set_user("nobody", max_priority=1)
        listed = {u["name"]: u["max_priority"] for u in await engine.operator.list_users()}
        assert listed == {"erin": -10}
    finally:
        engine.close()
