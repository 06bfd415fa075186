"""One ``LISTEN`` connection per process (docs/operations.md, "Connections to count"), on
PostgreSQL.

A process that serves (a worker whose only wake-up is ``NOTIFY``, a live event stream, a
stream of the model's text asked for by a watching process elsewhere) holds exactly one
listening backend, named ``tether-listen``, and every channel is heard on it. When that
backend is killed, each user is told once it listens again: a run created, a cancel and an
ask sent meanwhile are caught up without any poll, and all goes on. Then the shared
listener's bookkeeping: each subscriber hears its own channels, is told when they are
listened to, one whose callback fails harms no other, a connection that cannot be opened
is said and tried again, and the connection closes once nobody wants a channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

import gated
import inprocess
import psycopg
import pytest
from served import DEADLINE_S
from waiting import poll_until, until

from conftest import PG_ADMIN_URL
from tether import Engine, Worker
from tether._runtime.live.deltas import DeltaHub, DeltaSubscription
from tether.errors import DatabaseUnavailable
from tether.results import Delta, LiveEvent
from tether.runs import RunState
from tether.store.backend import listening
from tether.store.backend.listen import (
    CONNECTED,
    DELTAS_CHANNEL,
    EVENTS_CHANNEL,
    RUNS_CHANNEL,
    WATCH_CHANNEL,
    listen,
)
from tether.store.backend.listening import APPLICATION_NAME, Listener, Subscriber, listener_for

NO_POLL_S = 600.0  # the live streams read only when a notice (or a reconnection) says
EVERY_CHANNEL = frozenset({RUNS_CHANNEL, EVENTS_CHANNEL, DELTAS_CHANNEL, WATCH_CHANNEL})


def listening_backends(url: str) -> list[tuple[int, str]]:
    """The backends of ``url``'s database that listen (named so, or last ran a
    ``LISTEN``): (pid, application_name)."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = %s"
            " AND (application_name = %s OR query ~* '^\\s*(UN)?LISTEN ')",
            (url.rsplit("/", 1)[1], APPLICATION_NAME),
        ).fetchall()
    return [(int(pid), str(name)) for pid, name in rows]


def kill(pid: int) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)


def notify(url: str, *notices: tuple[str, str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for channel, payload in notices:
            conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def collect(engine: Engine, run_id: str, deltas: bool = False) -> list[LiveEvent | Delta]:
    return [item async for item in engine.watch(run_id, deltas=deltas)]


@dataclass
class Serving:
    """A process as ``tether serve`` runs one: an engine, its worker (only a ``NOTIFY`` or
    a reconnection wakes it), the gated model of its runs; and a hub of its own, the
    deltas hub of a watching process elsewhere."""

    engine: Engine
    worker: Worker
    model: gated.GatedModel
    listener: Listener
    elsewhere: DeltaHub
    held: str = ""  # the text elsewhere of the run's step, from its deltas

    def text_elsewhere(self, sub: DeltaSubscription) -> str:
        """The text the watching process elsewhere has of the run's step so far (a delta
        at offset 0 starts it again; any other follows what it has, without a gap)."""
        for delta in sub.take():
            held = "" if delta.offset == 0 else self.held
            assert delta.offset == len(held), (delta, held)
            self.held = held + delta.text
        return self.held


@contextlib.asynccontextmanager
async def serving(url: str, concurrency: int) -> AsyncIterator[Serving]:
    model = gated.GatedModel()
    engine = inprocess.engine(url, model=model, watch_poll_s=NO_POLL_S)
    store = engine.runner.store
    dsn = store.listen_dsn()
    assert dsn is not None
    worker = Worker(engine, concurrency=concurrency, poll_s=3600)
    running = asyncio.create_task(worker.run(reap=False))
    served = Serving(
        engine=engine,
        worker=worker,
        model=model,
        listener=listener_for(dsn),
        elsewhere=DeltaHub(dsn, store.notify_dsn()),
    )
    try:
        await until(lambda: RUNS_CHANNEL in served.listener.listening, what="the worker")
        yield served
    finally:
        model.gate.set()
        worker.stop()
        await asyncio.wait_for(running, DEADLINE_S)
        served.elsewhere.quiet()
        engine.close()


async def test_a_serving_process_hears_claims_events_and_deltas_on_one_connection(
    pg_url: str,
) -> None:
    async with serving(pg_url, concurrency=2) as served:
        engine, model = served.engine, served.model
        run = await engine.start_run("dana", "tell me")
        await asyncio.wait_for(model.written.wait(), DEADLINE_S)  # claimed, its step streams
        events = asyncio.create_task(collect(engine, run.id))
        texts = asyncio.create_task(collect(engine, run.id, deltas=True))
        far = served.elsewhere.subscribe(run.id, lambda: None)
        # The ask from elsewhere came in on WATCH, the text went back on DELTAS.
        await until(lambda: served.text_elsewhere(far) == gated.FIRST, what="the text elsewhere")
        await until(lambda: served.listener.listening == EVERY_CHANNEL, what="every channel")
        [(_pid, name)] = listening_backends(pg_url)
        assert name == APPLICATION_NAME
        second = await engine.start_run("dana", "and you?")  # its NOTIFY alone wakes the worker
        await until(lambda: model.calls == 2, what="the second run claimed")
        model.gate.set()
        async with asyncio.timeout(DEADLINE_S):
            seen, with_text = await events, await texts
        assert [e.kind for e in seen if isinstance(e, LiveEvent)][-2:] == ["model_turn", "answered"]
        here = "".join(d.text for d in with_text if isinstance(d, Delta))
        assert here == gated.FIRST + gated.SECOND
        whole = gated.FIRST + gated.SECOND
        await until(lambda: served.text_elsewhere(far) == whole, what="the rest elsewhere")
        far.close()
        await until(lambda: _answered(engine, second.id), what="the second run answered")
        assert len(listening_backends(pg_url)) == 1


async def test_a_killed_listener_tells_every_user_once_it_listens_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconnection is held back until the test has sent, while nothing listened, a
    new run (the worker's wake-up), a cancel (an event of a watched run) and an ask for a
    step's text (from elsewhere): each is caught up once the connection is back, because
    each user is told it listens again (the worker's and the feed's listen anew, their
    old ``listen`` having raised; the hubs are told on their subscriber)."""
    async with serving(pg_url, concurrency=3) as served:
        engine, model, listener = served.engine, served.model, served.listener
        hubs = [engine.runner.services.deltas, served.elsewhere]
        told = [0, 0]
        for i, hub in enumerate(hubs):
            assert hub is not None and hub._subscriber is not None
            told_before = hub._subscriber.on_connect

            def counted(i: int = i, then: object = told_before) -> None:
                told[i] += 1
                assert callable(then)
                then()

            hub._subscriber.on_connect = counted
        hour = datetime.now(UTC) + timedelta(hours=1)  # queued: no worker claims it
        later = await engine.start_run("dana", "later", start_at=hour)
        run = await engine.start_run("dana", "tell me")
        await asyncio.wait_for(model.written.wait(), DEADLINE_S)
        waiting = asyncio.create_task(collect(engine, later.id))
        texts = asyncio.create_task(collect(engine, run.id, deltas=True))
        await until(lambda: listener.listening == EVERY_CHANNEL, what="every channel")
        [(pid, _name)] = listening_backends(pg_url)

        held = threading.Event()
        monkeypatch.setattr(listener, "_pause", lambda: held.wait(DEADLINE_S))
        kill(pid)
        await until(lambda: not listener.listening, what="the loss to be seen")
        new = await engine.start_run("dana", "while nobody listened")
        await engine.cancel_run(later.id, "dana")
        far = served.elsewhere.subscribe(run.id, lambda: None)
        told_now = list(told)
        held.set()

        await until(lambda: model.calls == 2, what="the new run claimed on reconnecting")
        cancelled = await asyncio.wait_for(waiting, DEADLINE_S)
        assert [e.kind for e in cancelled if isinstance(e, LiveEvent)][-1] == "cancelled"
        await until(lambda: served.text_elsewhere(far) == gated.FIRST, what="the ask caught up")
        assert all(after > before for after, before in zip(told, told_now, strict=True)), told
        assert served.worker.restarts["listener"] == 1  # its listen raised, and listens anew
        await until(lambda: listener.listening == EVERY_CHANNEL, what="every channel again")
        [(again, _name)] = listening_backends(pg_url)
        assert again != pid

        third = await engine.start_run("dana", "after")  # heard: no slot freed meanwhile
        await until(lambda: model.calls == 3, what="a run claimed by its notice")
        model.gate.set()
        seen = await asyncio.wait_for(texts, DEADLINE_S)
        assert [e.kind for e in seen if isinstance(e, LiveEvent)][-2:] == ["model_turn", "answered"]
        whole = gated.FIRST + gated.SECOND
        await until(lambda: served.text_elsewhere(far) == whole, what="the rest elsewhere")
        far.close()
        for run_id in (run.id, new.id, third.id):
            await until(partial(_answered, engine, run_id), what=f"{run_id} answered")


async def _answered(engine: Engine, run_id: str) -> bool:
    return (await engine.get_run(run_id)).run.state is RunState.ANSWERED


# -- the shared listener's bookkeeping ----------------------------------------------------------


@dataclass
class Heard:
    """What one subscriber was told, from the listener's thread."""

    notices: list[tuple[str, str]] = field(default_factory=list)
    connects: int = 0
    lost: list[BaseException] = field(default_factory=list)

    def subscriber(self, dsn: str) -> Subscriber:
        return Subscriber(
            dsn,
            on_notice=lambda channel, payload: self.notices.append((channel, payload)),
            on_connect=self.connected,
            on_lost=self.lost.append,
        )

    def connected(self) -> None:
        self.connects += 1


def test_subscribers_hear_their_own_channels_and_one_that_comes_late_is_told(
    pg_url: str,
) -> None:
    a, b, c = Heard(), Heard(), Heard()
    sub_a, sub_b, sub_c = a.subscriber(pg_url), b.subscriber(pg_url), c.subscriber(pg_url)
    try:
        sub_a.want(frozenset({"one"}))
        sub_b.want(frozenset({"one", "two"}))
        poll_until(lambda: a.connects and b.connects, what="both told")
        assert sub_a.connected and sub_b.connected and not sub_c.connected
        notify(pg_url, ("one", "1"), ("two", "2"), ("three", "3"))
        poll_until(lambda: len(b.notices) == 2, what="b's notices")
        assert a.notices == [("one", "1")]
        assert b.notices == [("one", "1"), ("two", "2")]
        sub_c.want(frozenset({"two"}))  # listened to already: told at once, missed nothing
        poll_until(lambda: c.connects, what="c told")
        notify(pg_url, ("two", "22"))
        poll_until(lambda: c.notices, what="c's notice")
        assert c.notices == [("two", "22")] and c.connects == 1
        sub_a.want(frozenset({"one", "three"}))  # more: told again once it is listened to
        poll_until(lambda: a.connects == 2, what="a told of its new channel")
        notify(pg_url, ("three", "3"))
        poll_until(lambda: ("three", "3") in a.notices, what="a's new channel")
        assert len(listening_backends(pg_url)) == 1
        assert (a.connects, b.connects, c.connects) == (2, 1, 1)
    finally:
        for sub in (sub_a, sub_b, sub_c):
            sub.close()


def test_the_connection_closes_once_nobody_wants_a_channel_and_opens_again(pg_url: str) -> None:
    a, b = Heard(), Heard()
    sub_a, sub_b = a.subscriber(pg_url), b.subscriber(pg_url)
    listener = sub_a.listener
    sub_a.want(frozenset({"one"}))
    sub_b.want(frozenset({"two"}))
    poll_until(lambda: listener.listening == {"one", "two"}, what="both channels")
    [(first, _name)] = listening_backends(pg_url)
    sub_a.close()  # its channel is let go of; the connection stays for b
    poll_until(lambda: listener.listening == {"two"}, what="one let go of")
    notify(pg_url, ("one", "1"), ("two", "2"))
    poll_until(lambda: b.notices, what="b's notice")
    assert a.notices == [] and [pid for pid, _ in listening_backends(pg_url)] == [first]
    sub_b.want(frozenset())
    poll_until(lambda: not listener.running, what="the thread to end")
    poll_until(lambda: not listening_backends(pg_url), what="the connection to close")
    sub_a.want(frozenset({"one"}))  # wanted again: a new connection, and a told subscriber
    poll_until(lambda: a.connects == 2, what="a told again")
    [(second, _name)] = listening_backends(pg_url)
    assert second != first
    sub_a.close()


def test_a_subscriber_whose_callback_fails_harms_no_other(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=listening.__name__)
    good = Heard()
    failing: list[str] = []

    def fails(_channel: str, payload: str) -> None:
        failing.append(payload)
        raise ValueError("a subscriber's bug")

    bad = Subscriber(pg_url, on_notice=fails, on_connect=lambda: None)
    sub = good.subscriber(pg_url)
    try:
        bad.want(frozenset({"one"}))
        sub.want(frozenset({"one"}))
        poll_until(lambda: sub.connected and bad.connected, what="both listened to")
        notify(pg_url, ("one", "1"), ("one", "2"))
        poll_until(lambda: len(good.notices) == 2, what="the good one's notices")
        assert failing == ["1", "2"]
        failed = [r for r in caplog.records if getattr(r, "action", "") == "listen_callback_failed"]
        assert [getattr(r, "error_type", "") for r in failed] == ["ValueError", "ValueError"]
        assert "a subscriber's bug" not in caplog.text  # its message may be content
    finally:
        bad.close()
        sub.close()


def test_a_connection_that_cannot_be_opened_is_said_and_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens on this port now
    monkeypatch.setattr(listening, "RELISTEN_S", 0.05)
    caplog.set_level(logging.WARNING, logger=listening.__name__)
    heard = Heard()
    sub = heard.subscriber(f"postgresql://postgres@127.0.0.1:{port}/nowhere?connect_timeout=2")
    sub.want(frozenset({"one"}))
    try:
        poll_until(lambda: len(heard.lost) >= 2, what="two failed attempts")
        assert all(isinstance(exc, psycopg.OperationalError) for exc in heard.lost)
        assert not sub.connected and heard.connects == 0
        said = [r for r in caplog.records if r.name == listening.__name__]
        assert said and {getattr(r, "action", "") for r in said} == {"listen_lost"}
    finally:
        sub.close()
    poll_until(lambda: not sub.listener.running, what="the thread to give up")


async def test_listen_is_told_on_connecting_and_raises_when_its_connection_is_lost(
    pg_url: str,
) -> None:
    heard: list[str] = []
    listening_task = asyncio.create_task(listen(pg_url, heard.append, EVENTS_CHANNEL))
    await until(lambda: heard == [CONNECTED], what="told it listens")
    await asyncio.to_thread(notify, pg_url, (EVENTS_CHANNEL, "run-1"), (RUNS_CHANNEL, ""))
    await until(lambda: heard == [CONNECTED, "run-1"], what="its channel's notice")
    [(pid, _name)] = listening_backends(pg_url)
    await asyncio.to_thread(kill, pid)
    with pytest.raises(DatabaseUnavailable) as raised:
        await asyncio.wait_for(listening_task, DEADLINE_S)
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)
    listener = listener_for(pg_url)
    await until(lambda: not listener.running, what="nobody listens: the thread ends")
    assert heard == [CONNECTED, "run-1"]
