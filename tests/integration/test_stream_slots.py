"""Open event streams per user (``TETHER_MAX_STREAMS_PER_USER``, ``tether.api.stream_slots``)
from a real uvicorn on a loopback port, on both backends: one user holds at most the bound,
the API's streams and the inbox's live streams counted together, and the next is ``429
too_many_streams`` while other users' streams and requests go on; a slot comes back when its
stream ends, however it ends (the client gone, the run terminal, the server shut down)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import httpx
from inbox_web import sign_in
from served import DANA, DEADLINE_S, KEYS, Served, serving
from waiting import until

from tether import StopKind
from tether.api.stream_slots import StreamSlots

BOUND = 3
MIGUEL = {"Authorization": f"Bearer {KEYS['miguel']}"}


async def waiting_run(served: Served, user: str = "dana") -> str:
    """A run of ``user`` suspended on its send: its stream stays open."""
    run = await served.engine.start_run(user, "send b")
    assert (await served.engine.run_until_stop(run.id)).kind is StopKind.SUSPENDED
    return run.id


async def open_stream(
    stack: AsyncExitStack, client: httpx.AsyncClient, url: str, headers: dict[str, str]
) -> httpx.Response:
    """A stream's answer, its headers read and the stream held open by ``stack``."""
    return await stack.enter_async_context(client.stream("GET", url, headers=headers))


def slots_of(served: Served) -> StreamSlots:
    slots: StreamSlots = served.app.state.stream_slots
    return slots


async def test_one_user_holds_at_most_the_bound_and_the_next_stream_is_429_for_them_only(
    db_url: str,
) -> None:
    async with (
        serving(db_url, script_name="send", max_streams_per_user=BOUND) as served,
        httpx.AsyncClient(base_url=served.base, timeout=DEADLINE_S) as client,
        AsyncExitStack() as stack,
    ):
        run_id, other = await waiting_run(served), await waiting_run(served, "miguel")
        url = f"/v1/runs/{run_id}/events/stream"
        held = [await open_stream(stack, client, url, DANA) for _ in range(BOUND)]
        assert [r.status_code for r in held] == [200] * BOUND
        refused = await open_stream(stack, client, url, DANA)
        assert refused.status_code == 429
        await refused.aread()
        assert refused.json() == {
            "ok": False,
            "error": "too_many_streams",
            "message": refused.json()["message"],
            "limit": BOUND,
        }
        assert "TETHER_MAX_STREAMS_PER_USER" in refused.json()["message"]
        # Everyone else goes on: another user's stream, and dana's other requests.
        theirs = await open_stream(stack, client, f"/v1/runs/{other}/events/stream", MIGUEL)
        assert theirs.status_code == 200
        assert (await client.get(f"/v1/runs/{run_id}", headers=DANA)).status_code == 200
        assert slots_of(served).open_for("dana") == BOUND

        # The inbox's live streams are counted with them: its page says why it is not live.
        async with httpx.AsyncClient(base_url=served.base, timeout=DEADLINE_S) as browser:
            await sign_in(browser, KEYS["dana"])
            page = await open_stream(stack, browser, f"/runs/{run_id}/live", {})
            assert page.status_code == 429
            assert "Too many live pages" in (await page.aread()).decode()
            signals = await open_stream(stack, browser, f"/live?run={run_id}", {})
            assert signals.status_code == 429


async def test_a_slot_comes_back_when_its_client_goes_or_its_run_ends(db_url: str) -> None:
    async with (
        serving(db_url, script_name="send", max_streams_per_user=BOUND) as served,
        httpx.AsyncClient(base_url=served.base, timeout=DEADLINE_S) as client,
        AsyncExitStack() as stack,
    ):
        slots = slots_of(served)
        run_id, ending = await waiting_run(served), await waiting_run(served)
        url = f"/v1/runs/{run_id}/events/stream"
        await open_stream(stack, client, url, DANA)
        async with AsyncExitStack() as going:
            await open_stream(going, client, url, DANA)  # this client will hang up
            await open_stream(stack, client, f"/v1/runs/{ending}/events/stream", DANA)
            assert (await open_stream(going, client, url, DANA)).status_code == 429
        await until(lambda: slots.open_for("dana") == BOUND - 1, what="the client's slot back")
        await served.engine.cancel_run(ending, "dana")  # its stream closes: terminal
        await until(lambda: slots.open_for("dana") == BOUND - 2, what="the run's slot back")
        again = [await open_stream(stack, client, url, DANA) for _ in range(2)]
        assert [r.status_code for r in again] == [200, 200]
        assert (await open_stream(stack, client, url, DANA)).status_code == 429


async def test_every_slot_comes_back_when_the_server_shuts_down(db_url: str) -> None:
    async with AsyncExitStack() as clients:  # outlives the server: nobody hangs up first
        client = await clients.enter_async_context(httpx.AsyncClient(timeout=DEADLINE_S))
        async with serving(db_url, script_name="send", max_streams_per_user=BOUND) as served:
            run_id = await waiting_run(served)
            url = f"{served.base}/v1/runs/{run_id}/events/stream"
            for _ in range(BOUND):
                assert (await open_stream(clients, client, url, DANA)).status_code == 200
            slots = slots_of(served)
            assert slots.open_for("dana") == BOUND
        # The server shut down under its open streams, their clients still connected.
        assert slots.open_for("dana") == 0
