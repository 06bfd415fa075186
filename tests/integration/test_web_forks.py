"""A run's page and its lineage in the inbox (reference §12), in-process on both backends: the
page shows the run's agent version, the run it was forked from and its forks; a halted or
failed run has a "fork from step K" form that forks only on a signed-in POST with the
session's CSRF token and shows the new run; a refused step says why (422) and forks
nothing; a run that is not the viewer's is not found."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import agents
import downstream
import httpx
import pytest

from tether import Engine, MemoryNotifier, ScriptedModel, StopKind
from tether.api.app import create_app
from tether.config import Settings
from tether.runs import RunState

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
FORK_FORM = re.compile(r'<form method="post" action="/runs/([^"]+)/fork"')
AT_STEP = re.compile(r'name="at_step"[^>]*value="([^"]*)"')


@dataclass
class Web:
    engine: Engine
    keys: dict[str, str]
    app: Any

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://testserver"
        )

    async def halted(self, **limits: Any) -> str:
        """dana's run of the test agent's ``work`` script (a read, a write, an answer), halted."""
        outcome = await self.engine.ask("dana", "go", limits=limits)
        assert outcome.kind is StopKind.HALTED
        return outcome.run_id


@pytest.fixture
async def web(db_url: str) -> AsyncIterator[Web]:
    engine = Engine(
        agent=agents.agent(),
        model=agents.script("work"),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    keys = {name: await engine.add_user(name) for name in ("dana", "eve")}
    yield Web(engine=engine, keys=keys, app=create_app(engine))
    engine.close()


async def signed_in(web: Web, client: httpx.AsyncClient, user: str = "dana") -> str:
    """Sign ``user`` in; the session's CSRF token."""
    form = await client.get("/login", params={"next": "/"})
    found = CSRF.search(form.text)
    assert found
    done = await client.post(
        "/login", data={"key": web.keys[user], "csrf": found.group(1), "next": "/"}
    )
    assert done.status_code == 303
    inbox = await client.get("/")
    token = CSRF.search(inbox.text)
    assert token
    return token.group(1)


async def test_a_halted_runs_page_forks_it_into_a_dry_run_whose_page_shows_its_lineage(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)  # the read of step 1 is done
    async with web.client() as client:
        csrf = await signed_in(web, client)
        shown = await client.get(f"/runs/{parent}")
        assert shown.status_code == 200
        assert web.engine.agent.agent_version in shown.text
        assert FORK_FORM.findall(shown.text) == [parent]
        assert AT_STEP.findall(shown.text) == ["1"]  # the run's step
        assert f'value="{csrf}"' in shown.text
        posted = await client.post(
            f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1", "dry_run": "true"}
        )
        assert posted.status_code == 303
        (fork,) = await web.engine.forks_of(parent)
        assert posted.headers["location"] == f"/runs/{fork.id}"
        assert fork.dry_run is True and fork.forked_from == {"run_id": parent, "step": 1}
        assert fork.state is RunState.HALTED and fork.halt_reason == "forked"
        page = (await client.get(f"/runs/{fork.id}")).text
        assert re.search(
            rf'forked from\s*<a href="/runs/{parent}"><code>{parent}</code></a> at step 1', page
        )
        assert "Dry run" in page and web.engine.agent.agent_version in page
        back = (await client.get(f"/runs/{parent}")).text
        assert f'<a href="/runs/{fork.id}">' in back and "dry run" in back
        # Without the box ticked, a fork that executes its writes.
        await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1"})
        assert [f.dry_run for f in await web.engine.forks_of(parent)] == [True, False]


async def test_a_fork_post_without_the_sessions_csrf_token_or_session_forks_nothing(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)
    form = {"at_step": "1", "dry_run": "true"}
    async with web.client() as anonymous:
        refused = await anonymous.post(f"/runs/{parent}/fork", data=form)
        assert refused.status_code == 303
        assert refused.headers["location"].startswith("/login")
    async with web.client() as client:
        await signed_in(web, client)
        missing = await client.post(f"/runs/{parent}/fork", data=form)
        forged = await client.post(f"/runs/{parent}/fork", data={**form, "csrf": "forged"})
        assert missing.status_code == 403 and forged.status_code == 403
        async with web.client() as other:
            foreign_csrf = await signed_in(web, other, "eve")
        crossed = await client.post(f"/runs/{parent}/fork", data={**form, "csrf": foreign_csrf})
        assert crossed.status_code == 403
    assert await web.engine.forks_of(parent) == []


async def test_a_refused_step_shows_why_on_the_runs_page_and_forks_nothing(web: Web) -> None:
    parent = await web.halted(max_steps=1)
    async with web.client() as client:
        csrf = await signed_in(web, client)
        for step, says in (("0", "between 1 and"), ("7", "between 1 and"), ("x", "whole number")):
            refused = await client.post(
                f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": step, "dry_run": "true"}
            )
            assert refused.status_code == 422, step
            assert says in refused.text and FORK_FORM.findall(refused.text) == [parent]
            assert AT_STEP.findall(refused.text) == [step]  # what was posted, to correct
            assert 'name="dry_run" value="true" checked' in refused.text
    assert await web.engine.forks_of(parent) == []


async def test_a_run_halted_inside_a_step_offers_the_last_step_whose_calls_have_results(
    web: Web,
) -> None:
    # Halted on the tool-call budget before step 2's write ran: step 2 is not a boundary.
    parent = await web.halted(max_tool_calls=1)
    async with web.client() as client:
        csrf = await signed_in(web, client)
        shown = (await client.get(f"/runs/{parent}")).text
        assert AT_STEP.findall(shown) == ["1"]
        inside = await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "2"})
        assert inside.status_code == 422 and "without a result" in inside.text
        done = await client.post(f"/runs/{parent}/fork", data={"csrf": csrf, "at_step": "1"})
        assert done.status_code == 303
    assert len(await web.engine.forks_of(parent)) == 1


async def test_someone_elses_or_a_missing_run_is_not_found_and_an_answered_run_has_no_form(
    web: Web,
) -> None:
    parent = await web.halted(max_steps=1)
    answered = (await web.engine.ask("dana", "go")).run_id
    async with web.client() as client:
        eve = await signed_in(web, client, "eve")
        form = {"csrf": eve, "at_step": "1"}
        assert (await client.post(f"/runs/{parent}/fork", data=form)).status_code == 404
        bad_step = await client.post(f"/runs/{parent}/fork", data={**form, "at_step": "x"})
        assert bad_step.status_code == 404  # nothing says the run exists
        for missing in ("nope", "no%20such"):
            assert (await client.post(f"/runs/{missing}/fork", data=form)).status_code == 404
    assert await web.engine.forks_of(parent) == []
    async with web.client() as client:
        await signed_in(web, client)
        page = (await client.get(f"/runs/{answered}")).text
        assert FORK_FORM.findall(page) == [] and "Forks" not in page


async def test_a_failed_runs_page_offers_to_fork_it_before_the_step_it_failed_in(
    db_url: str,
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("lookup", query="x")]},
        {"tool_calls": [agents.call("blind_write", item="z")]},
        {"content": "done"},
    ]
    engine = Engine(
        agent=agents.agent(),
        model=ScriptedModel(turns),
        settings=Settings(database_url=db_url),
        notifier=MemoryNotifier(),
    )
    try:
        web = Web(
            engine=engine, keys={"dana": await engine.add_user("dana")}, app=create_app(engine)
        )
        downstream.inject_failure("blind_write", "after_commit")  # cannot tell whether it ran
        outcome = await engine.ask("dana", "go")
        assert outcome.kind is StopKind.FAILED and outcome.reason == "unreconcilable"
        async with web.client() as client:
            csrf = await signed_in(web, client)
            shown = (await client.get(f"/runs/{outcome.run_id}")).text
            assert FORK_FORM.findall(shown) == [outcome.run_id]
            assert AT_STEP.findall(shown) == ["1"]  # step 2's write has no result
            form = {"csrf": csrf, "at_step": "1", "dry_run": "true"}
            done = await client.post(f"/runs/{outcome.run_id}/fork", data=form)
            assert done.status_code == 303
        (fork,) = await engine.forks_of(outcome.run_id)
        assert fork.dry_run and fork.forked_from == {"run_id": outcome.run_id, "step": 1}
    finally:
        engine.close()
