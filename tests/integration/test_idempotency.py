"""Idempotent creation (reference §14) on both backends, over HTTP in-process and through
the Python API: a repeat of an ``Idempotency-Key`` answers the first request and creates
nothing, also when the repeats are concurrent or the first answer was lost; another body
is ``idempotency_mismatch``; keys are per user and live as long as their run; a bad key
or a refused creation stores nothing.

No worker runs here: runs are carried with ``engine.run_until_stop``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import agents
import httpx
import inprocess
import psycopg
import pytest
import sqlalchemy as sa

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.errors import DatabaseUnavailable, IdempotencyMismatch, InvalidInput
from tether.runs import RunState

KEYS = {"dana": "key-of-dana", "miguel": "key-of-miguel"}
DANA = {"Authorization": f"Bearer {KEYS['dana']}"}
MIGUEL = {"Authorization": f"Bearer {KEYS['miguel']}"}
BODY = {"question": "send b", "limits": {"max_steps": 7}}


@dataclass
class Api:
    engine: Engine
    client: httpx.AsyncClient

    async def post(
        self,
        key: str | bytes | None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] = DANA,
        content: bytes | None = None,
    ) -> httpx.Response:
        sent: dict[str, Any] = dict(headers)
        if key is not None:
            sent["Idempotency-Key"] = key
        if content is not None:
            sent["Content-Type"] = "application/json"
            return await self.client.post("/v1/runs", content=content, headers=sent)
        return await self.client.post("/v1/runs", json=BODY if body is None else body, headers=sent)

    async def runs(self) -> list[str]:
        return [r.id for r in await self.engine.list_runs(None, limit=1000)]


def build(url: str, script: str = "send", **settings: Any) -> Engine:
    return Engine(
        agent=agents.agent(),
        model=agents.script(script),
        settings=Settings(database_url=url, **settings),
        notifier=MemoryNotifier(),
    )


@asynccontextmanager
async def serving(url: str, script: str = "send") -> AsyncIterator[Api]:
    engine = build(url, script)
    for user, key in KEYS.items():
        await engine.operator.add_user(user, key)
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            yield Api(engine=engine, client=c)
    finally:
        engine.close()


def stored_keys(engine: Engine) -> list[tuple[str, str, str]]:
    """Every stored (user, key, run) of the runs created with a key."""
    with engine.runner.store.engine.connect() as conn:
        query = "SELECT user_id, request_key, id FROM runs WHERE request_key IS NOT NULL"
        rows = conn.execute(sa.text(query)).all()
    return sorted((r.user_id, r.request_key, r.id) for r in rows)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["ok"] is False and body["error"] == code and body["message"], body


# -- over HTTP -----------------------------------------------------------------------------


async def test_a_repeat_with_the_same_key_and_body_answers_the_first_and_creates_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        first = await api.post("k-1")
        assert first.status_code == 202, first.text
        assert set(first.json()) == {"id", "state"} and first.json()["state"] == "running"
        again = await api.post("k-1")
        assert again.status_code == 202
        assert again.json() == first.json()
        assert again.headers["location"] == first.headers["location"]
        assert await api.runs() == [first.json()["id"]]
        assert stored_keys(api.engine) == [("dana", "k-1", first.json()["id"])]


async def test_bodies_are_compared_as_parsed_json_not_as_bytes(db_url: str) -> None:
    async with serving(db_url) as api:
        first = await api.post(
            "k-json", content=b'{"question": "send b", "limits": {"max_steps": 7}}'
        )
        assert first.status_code == 202, first.text
        reordered = await api.post(
            "k-json", content=b'{ "limits":{"max_steps":7},\n"question":"send b" }'
        )
        assert reordered.status_code == 202, reordered.text
        assert reordered.json() == first.json()
        assert len(await api.runs()) == 1


async def test_the_same_key_with_another_body_is_409_mismatch_and_creates_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        first = await api.post("k-2")
        assert first.status_code == 202
        for other in (
            {**BODY, "question": "send c"},
            {**BODY, "limits": {"max_steps": 8}},
            {"question": "send b"},  # the same run by defaults, another body as sent
            {**BODY, "if_busy": "reject"},
        ):
            refused(await api.post("k-2", other), 409, "idempotency_mismatch")
        assert await api.runs() == [first.json()["id"]]
        assert stored_keys(api.engine) == [("dana", "k-2", first.json()["id"])]
        assert (await api.post("k-2")).json() == first.json()  # the key still answers


async def test_twenty_concurrent_repeats_make_one_run_and_get_one_answer(db_url: str) -> None:
    async with serving(db_url) as api:
        answers = await asyncio.gather(*(api.post("k-race") for _ in range(20)))
        assert [a.status_code for a in answers] == [202] * 20, [a.text for a in answers]
        bodies = {tuple(sorted(a.json().items())) for a in answers}
        assert len(bodies) == 1, bodies
        (run_id,) = await api.runs()
        assert answers[0].json() == {"id": run_id, "state": "running"}
        assert stored_keys(api.engine) == [("dana", "k-race", run_id)]


async def test_keys_are_per_user(db_url: str) -> None:
    async with serving(db_url) as api:
        dana = await api.post("shared-key")
        miguel = await api.post("shared-key", headers=MIGUEL)
        assert dana.status_code == miguel.status_code == 202
        assert dana.json()["id"] != miguel.json()["id"]
        # miguel's other body is no mismatch of dana's key, and each repeat gets its own
        other = await api.post("shared-key", {"question": "another"}, headers=MIGUEL)
        refused(other, 409, "idempotency_mismatch")
        assert (await api.post("shared-key")).json() == dana.json()
        assert (await api.post("shared-key", headers=MIGUEL)).json() == miguel.json()
        assert len(await api.runs()) == 2


INVALID_KEYS: list[tuple[str, str | bytes]] = [
    ("empty", ""),
    ("256 characters", "k" * 256),
    ("non-ASCII", "clé".encode()),
    ("latin-1", "cl\xe9".encode("latin-1")),
    ("a tab", "a\tb"),
    ("DEL", "a\x7fb"),
]


async def test_invalid_keys_are_422_and_create_nothing(db_url: str) -> None:
    async with serving(db_url) as api:
        for name, key in INVALID_KEYS:
            response = await api.post(key)
            assert response.status_code == 422, f"{name}: {response.text}"
            assert response.json()["error"] == "invalid_input", name
            assert "Idempotency-Key" in response.json()["message"], name
        assert await api.runs() == []
        assert stored_keys(api.engine) == []
        longest = await api.post("~" * 255)  # the longest key, of the last printable
        assert longest.status_code == 202, longest.text
        spaced = await api.post("a key with spaces")
        assert spaced.status_code == 202, spaced.text


async def test_a_refused_creation_stores_no_key_and_a_retry_is_evaluated_afresh(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        first = await api.post(None)
        thread_id = (await api.engine.get_run(first.json()["id"])).run.thread_id
        follow_up = {"question": "and then?", "thread_id": thread_id}
        busy = await api.post("k-busy", follow_up)
        refused(busy, 409, "thread_busy")
        missing = await api.post("k-busy", {"question": "q", "thread_id": "no-such-thread"})
        refused(missing, 404, "not_found")
        over = await api.post("k-busy", {"question": "q", "limits": {"max_steps": 10**6}})
        refused(over, 422, "invalid_input")
        assert stored_keys(api.engine) == []
        assert len(await api.runs()) == 1
        await api.engine.run_until_stop(first.json()["id"])
        await api.engine.cancel_run(first.json()["id"], "dana")  # the thread is idle now
        created = await api.post("k-busy", follow_up)
        assert created.status_code == 202, created.text
        assert len(await api.runs()) == 2


async def test_a_repeat_answers_the_first_body_even_after_the_run_moved_on(db_url: str) -> None:
    async with serving(db_url) as api:
        first = await api.post("k-moved")
        run_id = first.json()["id"]
        outcome = await api.engine.run_until_stop(run_id)
        assert outcome.kind is StopKind.SUSPENDED
        again = await api.post("k-moved")
        assert again.status_code == 202
        assert again.json() == {"id": run_id, "state": "running"}
        assert len(await api.runs()) == 1


async def test_a_queued_follow_up_is_answered_queued_again(db_url: str) -> None:
    async with serving(db_url) as api:
        first = await api.post(None)
        thread_id = (await api.engine.get_run(first.json()["id"])).run.thread_id
        body = {"question": "later", "thread_id": thread_id, "if_busy": "enqueue"}
        queued = await api.post("k-queued", body)
        assert queued.status_code == 202 and queued.json()["state"] == "queued"
        await api.engine.cancel_run(queued.json()["id"], "dana")
        again = await api.post("k-queued", body)
        assert again.json() == queued.json()


async def test_a_key_is_free_again_once_its_thread_is_deleted(db_url: str) -> None:
    async with serving(db_url, "answer") as api:
        first = await api.post("k-deleted")
        run_id = first.json()["id"]
        assert (await api.engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        thread_id = (await api.engine.get_run(run_id)).run.thread_id
        await api.engine.delete_thread(thread_id, user="dana")
        assert stored_keys(api.engine) == []
        again = await api.post("k-deleted", {"question": "another body is fine now"})
        assert again.status_code == 202, again.text
        assert again.json()["id"] != run_id
        assert await api.runs() == [again.json()["id"]]


# -- through the Python API ----------------------------------------------------------------


async def test_start_run_with_a_key_returns_the_first_run_and_compares_the_arguments(
    db_url: str,
) -> None:
    engine = build(db_url)
    creations = inprocess.count_calls(engine, "create_requested_run")
    try:
        first = await engine.start_run("dana", "q", limits={"max_steps": 3}, idempotency_key="p")
        again = await engine.start_run("dana", "q", limits={"max_steps": 3}, idempotency_key="p")
        assert again.id == first.id
        # The repeat reached the store's creation too, and found the key taken there.
        assert len(creations) == 2 and again.started_at == first.started_at
        for other in (
            {"question": "q2", "limits": {"max_steps": 3}},
            {"question": "q", "limits": {"max_steps": 4}},
            {"question": "q"},
            {"question": "q", "limits": {"max_steps": 3}, "if_busy": "enqueue"},
        ):
            with pytest.raises(IdempotencyMismatch):
                await engine.start_run("dana", idempotency_key="p", **other)
        assert [r.id for r in await engine.list_runs(None)] == [first.id]
        assert (await engine.run_until_stop(first.id)).kind is StopKind.SUSPENDED
        # the first run as it is now; the answer first given, as it was
        now = await engine.start_run("dana", "q", limits={"max_steps": 3}, idempotency_key="p")
        assert (now.id, now.state) == (first.id, RunState.SUSPENDED)
        accepted = await engine.web.accept_run(
            "dana", "q", limits={"max_steps": 3}, idempotency_key="p"
        )
        assert (accepted.status, accepted.body) == (202, {"id": first.id, "state": "running"})
        assert accepted.run.state is RunState.SUSPENDED
    finally:
        engine.close()


async def test_twenty_concurrent_start_runs_with_one_key_make_one_run(db_url: str) -> None:
    engine = build(db_url)
    try:
        await engine.open()
        runs = await asyncio.gather(
            *(engine.start_run("dana", "q", idempotency_key="p-race") for _ in range(20))
        )
        assert {r.id for r in runs} == {runs[0].id}
        assert [r.id for r in await engine.list_runs(None)] == [runs[0].id]
    finally:
        engine.close()


async def test_twenty_concurrent_follow_ups_with_one_key_make_one_run(db_url: str) -> None:
    """Concurrent follow-ups wait on their thread's lock, then find the thread busy with
    the first one's run: each is answered by the key, never ``thread_busy``."""
    engine = build(db_url, "answer")
    try:
        first = await engine.start_run("dana", "q")
        assert (await engine.run_until_stop(first.id)).kind is StopKind.ANSWERED
        runs = await asyncio.gather(
            *(
                engine.start_run("dana", "q2", thread_id=first.thread_id, idempotency_key="f")
                for _ in range(20)
            )
        )
        assert {r.id for r in runs} == {runs[0].id} and runs[0].id != first.id
        assert len(await engine.list_runs(None)) == 2
    finally:
        engine.close()


@pytest.mark.parametrize(
    "key", ["", "k" * 256, "clé", "a\nb", "a\x00b", "a\x1fb", "\u2028", 42, b"bytes"]
)
async def test_start_run_refuses_a_bad_key_and_creates_nothing(db_url: str, key: Any) -> None:
    engine = build(db_url)
    try:
        with pytest.raises(InvalidInput, match=r"(?i)idempotency.key"):
            await engine.start_run("dana", "q", idempotency_key=key)
        assert list(await engine.list_runs(None)) == []
    finally:
        engine.close()


# -- a lost answer, a COMMIT cut off -----------------------------------------------------------


def _commit_lands_then_fails_once(engine: sa.Engine, url: str) -> list[int]:
    """The next COMMIT of ``engine`` lands, then its answer is lost (a transient error),
    once; counts the COMMITs."""
    seen: list[int] = []

    def hook(conn: sa.Connection) -> None:
        seen.append(1)
        if len(seen) > 1:
            return
        dbapi: Any = conn.connection.dbapi_connection
        if url.startswith("sqlite"):
            dbapi.execute("COMMIT")
            raise sqlite3.OperationalError("disk I/O error")
        dbapi.commit()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    sa.event.listen(engine, "commit", hook)
    return seen


async def test_a_creation_whose_commit_landed_but_answer_was_lost_is_answered_once(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="send", db_retry_s=10.0)
    try:
        await engine.open()
        seen = _commit_lands_then_fails_once(engine.runner.store.engine, db_url)
        run = await engine.start_run("dana", "q", idempotency_key="k-cut")
        assert len(seen) >= 1
        assert [r.id for r in await engine.list_runs(None)] == [run.id]
        again = await engine.start_run("dana", "q", idempotency_key="k-cut")
        assert again.id == run.id
    finally:
        engine.close()


async def test_without_a_key_a_cut_commit_is_unavailable_and_may_have_created_the_run(
    db_url: str,
) -> None:
    """The gap a key closes: the caller hears ``database_unavailable``, yet the run exists,
    so trying again without a key would make a second one."""
    engine = inprocess.engine(db_url, script_name="send", db_retry_s=10.0)
    try:
        await engine.open()
        _commit_lands_then_fails_once(engine.runner.store.engine, db_url)
        with pytest.raises(DatabaseUnavailable, match="outcome is unknown"):
            await engine.start_run("dana", "q")
        assert len(await engine.list_runs(None)) == 1
    finally:
        engine.close()


async def test_a_creation_whose_commit_never_landed_is_tried_again_and_made_once(
    db_url: str,
) -> None:
    engine = inprocess.engine(db_url, script_name="send", db_retry_s=10.0)
    seen: list[int] = []
    error = (
        sqlite3.OperationalError("database is locked")
        if db_url.startswith("sqlite")
        else psycopg.OperationalError("server closed the connection unexpectedly")
    )

    def hook(_conn: sa.Connection) -> None:
        seen.append(1)
        if len(seen) == 1:
            raise error

    try:
        await engine.open()
        sa.event.listen(engine.runner.store.engine, "commit", hook)
        run = await engine.start_run("dana", "q", idempotency_key="k-lost")
        assert len(seen) >= 2  # the first COMMIT failed, the second went through
        assert [r.id for r in await engine.list_runs(None)] == [run.id]
    finally:
        engine.close()
