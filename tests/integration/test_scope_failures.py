"""A run owner's scope that cannot be resolved, where tether says who may see or decide
their requests: an error on every surface (the engine, ``GET /v1/approvals``, the inbox),
never a list that quietly leaves the requests out."""

from __future__ import annotations

import dataclasses

import agents
import inbox_web
from inbox_web import sign_in

from tether import Scope
from tether.errors import ScopeUnavailable, TetherError


class Directory:
    """A scope resolver whose users can be taken down: the test agent's scopes, except
    for the users in ``down``, whose resolution raises the error given there."""

    def __init__(self) -> None:
        self.down: dict[str, Exception] = {}

    async def resolve(self, user_id: str) -> Scope:
        if user_id in self.down:
            raise self.down[user_id]
        return await agents.resolve(user_id)


class Outage(TetherError):
    """An error of the agent's own, with a code of its own."""

    code = "sandbox_unavailable"


async def test_a_scope_that_cannot_be_resolved_is_an_error_never_an_empty_list(
    db_url: str,
) -> None:
    directory = Directory()
    agent = dataclasses.replace(agents.agent(), resolve_scope=directory.resolve)
    web = await inbox_web.web(db_url, agent=agent)
    try:
        run_id, _ = await web.suspended()  # dana's, which boss may decide
        assert [run.id for run in await web.engine.pending_approvals("boss")] == [run_id]
        directory.down["dana"] = ConnectionError("the directory is unreachable")

        try:
            await web.engine.pending_approvals("boss")
        except ScopeUnavailable as exc:
            assert isinstance(exc.__cause__, ConnectionError)
        else:
            raise AssertionError("an unresolved scope listed as if nothing waited")
        # The owner's own requests need nobody's scope.
        assert [run.id for run in await web.engine.pending_approvals("dana")] == [run_id]
        async with web.client() as client:
            bearer = {"Authorization": f"Bearer {web.keys['boss']}"}
            listed = await client.get("/v1/approvals", headers=bearer)
            await sign_in(client, web.keys["boss"])
            inbox = await client.get("/")
        assert listed.status_code == 503, listed.text
        assert listed.json()["error"] == "scope_unavailable"
        assert inbox.status_code == 503 and "scope_unavailable" in inbox.text
    finally:
        web.close()


async def test_an_error_of_the_resolvers_own_keeps_its_code(db_url: str) -> None:
    directory = Directory()
    agent = dataclasses.replace(agents.agent(), resolve_scope=directory.resolve)
    web = await inbox_web.web(db_url, agent=agent)
    try:
        await web.suspended()
        directory.down["dana"] = Outage("the business system is unreachable")
        async with web.client() as client:
            bearer = {"Authorization": f"Bearer {web.keys['boss']}"}
            listed = await client.get("/v1/approvals", headers=bearer)
        assert listed.status_code == 503, listed.text
        assert listed.json()["error"] == "sandbox_unavailable"
    finally:
        web.close()
