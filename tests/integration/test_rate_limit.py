"""The fleet's model rate (reference §13), on both backends: engines on one database share
``TETHER_MODEL_RPM`` / ``TETHER_MODEL_TPM``, through the real ``openai:`` adapter talking
HTTP to a fake server that records when each request arrived.

The window is shortened (``model_rate_window_s``) so a test takes seconds; every wait
polls with a deadline, and no assertion is about how long something took.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import agents
import inprocess
import pytest
import sqlalchemy as sa
from fakellm import OPENAI_PATH, FakeLLMServer, Reply, openai_completion, running
from waiting import until

from tether import Compaction, Engine, MemoryNotifier, StopKind
from tether._runtime.step.compaction import SUMMARY_INSTRUCTION
from tether.config import Settings
from tether.models import from_spec
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.results import LiveEvent
from tether.store import Grant, Store
from tether.store.model_rate_shares import SPREAD
from tether.store.sql.schema import gates, model_usage
from tether.telemetry.metrics import REGISTRY

WINDOW_S = 2.0
VALID_S = 1.0  # rate_limit.VALID_S: how long a leased slot is good for


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLMServer]:
    with running(OPENAI_PATH) as fake:
        yield fake


@pytest.fixture(autouse=True)
def provider_env(server: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.reset()
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


@pytest.fixture
async def opened() -> AsyncIterator[list[Engine]]:
    engines: list[Engine] = []
    yield engines
    for engine in engines:
        await engine.aclose()


def engine_on(engines: list[Engine], url: str, **settings: Any) -> Engine:
    """An engine on ``url`` whose model is ``openai:test-model`` (the fake server)."""
    settings.setdefault("model_rate_window_s", WINDOW_S)
    engine = inprocess.engine(url, model=from_spec("openai:test-model"), **settings)
    engines.append(engine)
    return engine


def answers(count: int, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> list[Reply]:
    return [
        Reply(
            body=openai_completion(
                content=f"answer {i}",
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        )
        for i in range(count)
    ]


def most_in_any_window(arrivals: list[float], window_s: float) -> int:
    """The most arrivals in any ``window_s`` seconds (each arrival opening a window)."""
    times = sorted(arrivals)
    return max((sum(1 for t in times if s <= t < s + window_s) for s in times), default=0)


async def of_kind(engine: Engine, run_id: str, kind: str) -> list[LiveEvent]:
    return [e for e in await engine.events(run_id) if e.kind == kind]


def usage_rows(url: str) -> list[tuple[float, int, int]]:
    store = Store(url)
    try:
        with store.engine.connect() as conn:
            query = sa.select(model_usage.c.at, model_usage.c.requests, model_usage.c.tokens)
            return [(float(a), int(r), int(t)) for a, r, t in conn.execute(query)]
    finally:
        store.close()


def fill(url: str, *, requests: int = 0, tokens: int = 0) -> None:
    """Use up capacity as another worker would have just now."""
    store = Store(url)
    try:
        store.lease_capacity(
            wants={"someone": requests},
            rpm=requests or None,
            tpm=None,
            window_s=WINDOW_S,
            valid_s=VALID_S,
            tokens={"someone": tokens},
        )
    finally:
        store.close()


@pytest.mark.slow
async def test_two_engines_never_start_more_than_rpm_requests_in_any_window(
    db_url: str, server: FakeLLMServer, opened: list[Engine]
) -> None:
    server.script(*answers(7))
    first = engine_on(opened, db_url, model_rpm=3)
    second = engine_on(opened, db_url, model_rpm=3)
    run_ids = [(await first.start_run("dana", f"q{i}")).id for i in range(7)]

    outcomes = await asyncio.gather(
        *((first if i % 2 else second).run_until_stop(rid) for i, rid in enumerate(run_ids))
    )

    assert [o.kind for o in outcomes] == [StopKind.ANSWERED] * 7
    assert server.count() == 7
    assert most_in_any_window(server.arrivals(), WINDOW_S) <= 3
    waited = 0
    for run_id in run_ids:
        events = await of_kind(first, run_id, "rate_limited")
        assert len(events) <= 1  # at most once per step (each run is one step)
        for event in events:
            assert event.data["limit"] == "rpm" and event.data["wait_s"] > 0
            assert event.data["step"] == 1
        waited += len(events)
    assert waited >= 4  # 7 runs, 3 starts per window: at least 4 had to wait
    stored_failures = [first.runner.store.get_run(r) for r in run_ids]
    assert all(r is not None and r.model_failures == 0 for r in stored_failures)


@pytest.mark.slow
async def test_waiting_is_neither_a_model_failure_nor_active_time(
    db_url: str, server: FakeLLMServer, opened: list[Engine]
) -> None:
    server.script(*answers(1))
    fill(db_url, requests=1)  # another worker just took the only slot
    engine = engine_on(opened, db_url, model_rpm=1, heartbeat_timeout_s=0.6)
    run_id = (await engine.start_run("dana", "q")).id
    limiter = engine.runner.services.limiter

    carried = asyncio.create_task(engine.run_until_stop(run_id))
    await until(lambda: limiter.waiting == 1, what="the run to wait for capacity")
    assert REGISTRY.get_sample_value("tether_rate_limited_runs") == 1
    waiting = engine.runner.store.get_run(run_id)
    assert waiting is not None and waiting.owner is not None
    await until(  # its heartbeat goes on while it waits: it keeps its lease
        lambda: (r := engine.runner.store.get_run(run_id)) is not None
        and (r.heartbeat_at or 0) > (waiting.heartbeat_at or 0)
        and limiter.waiting == 1,
        what="a heartbeat during the wait",
    )
    outcome = await carried

    assert outcome.kind is StopKind.ANSWERED
    assert limiter.waiting == 0
    (event,) = await of_kind(engine, run_id, "rate_limited")
    assert event.data["limit"] == "rpm"
    assert event.data["wait_s"] > 0
    # The slot taken just before comes free when it leaves the window and its margin (on
    # the database's clock).
    filled, granted = sorted(at for at, requests, _ in usage_rows(db_url) if requests)
    assert granted - filled >= WINDOW_S + VALID_S
    run = engine.runner.store.get_run(run_id)
    assert run is not None
    assert run.model_failures == 0 and run.recovery_attempts == 0
    assert run.lease_epoch == 1  # the lease was kept the whole time
    assert run.budget.elapsed_ms < event.data["wait_s"] * 1000
    assert await of_kind(engine, run_id, "model_retry") == []


@pytest.mark.slow
async def test_tpm_holds_a_request_while_the_last_windows_tokens_reach_it(
    db_url: str, server: FakeLLMServer, opened: list[Engine]
) -> None:
    server.script(*answers(3, prompt_tokens=10, completion_tokens=5))  # 15 tokens a call
    engine = engine_on(opened, db_url, model_tpm=20)
    run_ids = [(await engine.start_run("dana", f"q{i}")).id for i in range(3)]

    for run_id in run_ids:  # one after the other: the second starts below 20 (once the
        # first's 15 tokens left the tenth of the window the spread counts), the third not
        assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED

    assert await of_kind(engine, run_ids[0], "rate_limited") == []
    assert all(e.data["limit"] == "tpm" for e in await of_kind(engine, run_ids[1], "rate_limited"))
    (event,) = await of_kind(engine, run_ids[2], "rate_limited")
    assert event.data["limit"] == "tpm"
    first, _, third = server.arrivals()
    assert third - first >= WINDOW_S  # the first call's tokens had left the window
    reported = sum(tokens for _, _, tokens in usage_rows(db_url))
    assert reported >= 30  # the first two calls' tokens were recorded (the third's maybe later)


async def test_without_a_limit_nothing_is_stored_and_the_store_is_not_asked(
    db_url: str, server: FakeLLMServer, opened: list[Engine]
) -> None:
    server.script(*answers(2))
    engine = engine_on(opened, db_url)
    leases = inprocess.count_calls(engine, "lease_capacity")
    for i in range(2):
        run_id = (await engine.start_run("dana", f"q{i}")).id
        assert (await engine.run_until_stop(run_id)).kind is StopKind.ANSWERED

    assert leases == []
    assert usage_rows(db_url) == []


# -- the store's leases ----------------------------------------------------------------------


def lease(store: Store, requests: int, user: str = "ana", **kwargs: Any) -> Grant:
    kwargs.setdefault("rpm", 3)
    kwargs.setdefault("tpm", None)
    return store.lease_capacity(
        wants={user: requests}, window_s=WINDOW_S, valid_s=VALID_S, **kwargs
    )


def used(store: Store, at: float, requests: int, user: str = "bo") -> int:
    """A row of ``requests`` leased at ``at`` (database time) for ``user``; its id."""
    with store.engine.begin() as conn:
        values = {"at": at, "requests": requests, "user_id": user}
        return int(conn.execute(model_usage.insert().values(**values)).inserted_primary_key[0])


def test_a_lease_grants_what_the_window_leaves_and_says_when_more_is_due(db_url: str) -> None:
    store = Store(db_url)
    try:
        # Two starts leased 1.5 s ago: in the window (2 s, and 1 s of validity), past the
        # part of it the spread counts (RPM 3: one start per 2/3 s).
        earlier = store.now() - 1.5
        used(store, earlier, 2)
        second = lease(store, 2)
        assert second.granted == {"ana": 1} and second.limit == "rpm"
        # The oldest slots must leave the window and its validity margin.
        assert second.next_at == pytest.approx(earlier + WINDOW_S + VALID_S)
        full = lease(store, 1)
        assert full.total == 0 and full.rows == {} and full.next_at == second.next_at
        # Unused: back to the fleet (and out of the spread's count).
        lease(store, 0, give_back=[(second.rows["ana"], 1)])
        assert lease(store, 3).granted == {"ana": 1}
    finally:
        store.close()


def test_a_lease_spreads_request_starts_over_the_window(db_url: str) -> None:
    store = Store(db_url)
    try:
        # RPM 20 over 2 s: at most 2 starts in any 0.2 s, then the next when they age out.
        first = lease(store, 5, rpm=20)
        assert first.granted == {"ana": 2} and first.limit == "rpm"
        assert first.next_at == pytest.approx(first.at + WINDOW_S / SPREAD)
        assert lease(store, 1, rpm=20).total == 0
    finally:
        store.close()


def test_tokens_are_recorded_with_a_lease_and_old_rows_are_purged(db_url: str) -> None:
    store = Store(db_url)
    try:
        long_ago = store.now() - 1000
        with store.engine.begin() as conn:
            conn.execute(model_usage.insert().values(at=long_ago, requests=5))
        reported = lease(store, 1, rpm=None, tpm=100, tokens={"ana": 100}, purge=True)
        assert reported.total == 0 and reported.limit == "tpm"  # at TPM: none
        assert reported.next_at == pytest.approx(reported.at + WINDOW_S)
        assert [(r, t) for _, r, t in usage_rows(db_url)] == [(0, 100)]
    finally:
        store.close()


@pytest.mark.parametrize("gate", ["kept", "deleted"])
def test_concurrent_leases_of_the_fleet_never_grant_more_than_rpm(db_url: str, gate: str) -> None:
    stores = [Store(db_url) for _ in range(4)]
    if gate == "deleted":  # the migration's row is gone: the first lease puts it back
        with stores[0].engine.begin() as conn:
            conn.execute(gates.delete())
    # RPM 50 over 2 s, 45 of it leased a second ago (past the spread's part, 0.2 s): 5 left.
    used(stores[0], stores[0].now() - 1.0, 45)
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            grants = list(
                pool.map(lambda i: lease(stores[i % 4], 1, f"u{i}", rpm=50).total, range(16))
            )
        assert sum(grants) == 5
    finally:
        for store in stores:
            store.close()


# -- every model request of a step goes through it: a compaction's summary too ---------------


class Summarising(Model):
    """Two turns that call ``lookup``, the second reporting many input tokens (so the
    third step compacts first), the summary when asked for one, then the answer; the
    order of the requests."""

    name = "summarising"

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        if not tools and messages[0].get("content") == SUMMARY_INSTRUCTION:
            self.asked.append("summary")
            summary: Message = {"role": "assistant", "content": "the summary"}
            return ModelResponse(message=summary, usage=Usage(output_tokens=3), model="x")
        self.asked.append("turn")
        turn = self.asked.count("turn")
        if turn <= 2:
            call = {
                "id": f"c{turn}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"query": "x"})},
            }
            message: Message = {"role": "assistant", "content": None, "tool_calls": [call]}
            tokens = 5000 if turn == 2 else 50
            return ModelResponse(message=message, usage=Usage(input_tokens=tokens), model="x")
        done: Message = {"role": "assistant", "content": "done"}
        return ModelResponse(message=done, usage=Usage(), model="x")


@pytest.mark.slow
async def test_a_compactions_summary_waits_too_and_its_step_shows_one_rate_limited_event(
    db_url: str, opened: list[Engine]
) -> None:
    model = Summarising()
    compaction = Compaction(max_input_tokens=1000, keep_last_turns=1)
    agent = dataclasses.replace(agents.agent(), compaction=compaction)
    engine = Engine(
        agent=agent,
        model=model,
        settings=Settings(database_url=db_url, model_rpm=1, model_rate_window_s=WINDOW_S),
        notifier=MemoryNotifier(),
    )
    opened.append(engine)
    run_id = (await engine.start_run("dana", "look it up")).id

    outcome = await engine.run_until_stop(run_id)

    assert outcome.kind is StopKind.ANSWERED
    assert model.asked == ["turn", "turn", "summary", "turn"]  # four requests, a slot each
    assert [e.kind for e in await engine.events(run_id) if e.kind == "compacted"] == ["compacted"]
    # Step 2 waited for its turn; step 3 twice (for its summary, then for its turn): one
    # event each.
    events = await of_kind(engine, run_id, "rate_limited")
    assert [e.data["step"] for e in events] == [2, 3]
    granted = [(at, n) for at, n, _ in sorted(usage_rows(db_url)) if n]
    assert len(granted) == 4
    for (before, _), (after, _) in itertools.pairwise(granted):
        assert after - before >= WINDOW_S + VALID_S  # RPM 1: one start per window and margin
