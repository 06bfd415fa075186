"""An approval never holds its request for the whole reconcile patience (reference §4), on
both backends: when the approved write's answer is lost and its lookup by key cannot reach
the downstream either, the request answers ``reconciling`` with the decision durable, and
the reapers' recovery carries the reconciliation on, with exactly one send."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import inprocess
import pytest
from agents import call

from tether import (
    Agent,
    MemoryNotifier,
    OutcomeUnknown,
    Reconciled,
    StopKind,
    ToolContext,
    tool,
)
from tether.api.app import create_app
from tether.errors import AlreadyResumed


@dataclass
class Downstream:
    """A send whose first answer is lost after it took effect, and whose lookups by key
    fail while ``down``."""

    sends: dict[str, list[str]] = field(default_factory=dict)
    lookups: int = 0
    down: bool = True

    def find(self, key: str, ctx: ToolContext) -> Reconciled:
        self.lookups += 1
        if self.down:
            return Reconciled.unreachable("the downstream's lookup is down")
        sent = self.sends.get(key)
        return Reconciled.found({"sent": sent[0]}) if sent else Reconciled.absent()


# The lost send, then the answer; a patience the request must not wait out, and its own
# bound, short.
_TURNS: list[dict[str, Any]] = [{"tool_calls": [call("send", to="ana")]}, {"content": "sent"}]
_PATIENCE = {"reconcile_patience_s": 3.0, "approval_reconcile_s": 0.2}


def _lossy(d: Downstream) -> Agent:
    """An agent whose one write, a send a human confirms, loses its answer."""

    def preview(args: Any, scope: Any) -> dict[str, Any]:
        return {"to": args.to}

    @tool(effect="write", needs_confirmation=True, preview=preview, reconcile=d.find)
    def send(ctx: ToolContext, to: str) -> dict[str, Any]:
        """Send a message (not deduplicated downstream): the answer is lost."""
        d.sends.setdefault(ctx.idempotency_key, []).append(to)
        raise OutcomeUnknown("the send's answer was lost")

    return Agent(name="lossy", system_prompt="test", tools=(send,))


async def test_a_lost_send_whose_lookup_fails_answers_reconciling_and_a_reaper_finishes_it(
    db_url: str,
) -> None:
    d = Downstream()
    notifier = MemoryNotifier()
    engine = inprocess.engine_for(db_url, _lossy(d), _TURNS, notifier=notifier, **_PATIENCE)
    try:
        asked = await engine.ask("dana", "send it")
        assert asked.kind is StopKind.SUSPENDED
        run_id = asked.run_id
        token = notifier.last(run_id).token
        result = await engine.resume_after_confirmation(token, "approve", "dana")
        assert result.outcome.value == "reconciling" and result.state.value == "running"
        assert d.lookups >= 1 and [len(sent) for sent in d.sends.values()] == [1]
        kinds = [e.kind for e in await engine.events(run_id)]
        assert kinds[-2:] == ["approved", "reconciling"]
        view = await engine.get_run(run_id)
        assert view.run.state.value == "running" and view.run.fail_reason is None
        with pytest.raises(AlreadyResumed):  # the decision is durable: the token is used
            await engine.resume_after_confirmation(token, "approve", "dana")

        d.down = False  # the lookup comes back: a reaper's recovery asks it by key
        recovered = await engine.runner.recover_orphans()
        assert [o.run_id for o in recovered] == [run_id]
        done = await engine.run_until_stop(run_id)
        assert done.kind is StopKind.ANSWERED
        view = await engine.get_run(run_id)
        (content,) = [m["content"] for m in view.messages if m["role"] == "tool"]
        assert json.loads(content) == {"sent": "ana"}
        kinds = [e.kind for e in await engine.events(run_id)]
        assert kinds.index("reconciling") < kinds.index("recovering") < kinds.index("answered")
        assert [len(sent) for sent in d.sends.values()] == [1]  # sent once, never again
    finally:
        engine.close()


async def test_over_http_and_on_the_approval_page_the_answer_is_reconciling(db_url: str) -> None:
    notifier = MemoryNotifier()
    engine = inprocess.engine_for(
        db_url, _lossy(Downstream()), _TURNS, notifier=notifier, **_PATIENCE
    )
    key = await engine.operator.add_user("dana")
    transport = httpx.ASGITransport(app=create_app(engine, public_url="http://tether.test"))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tether.test") as c:
            first = await engine.ask("dana", "send it")
            decided = await c.post(
                f"/v1/approvals/{notifier.last(first.run_id).token}",
                json={"decision": "approve"},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert decided.status_code == 200, decided.text
            assert decided.json()["outcome"] == "reconciling"
            assert decided.json()["state"] == "running"

            second = await engine.ask("dana", "send it")
            token = notifier.last(second.run_id).token
            form = await c.get("/login", params={"next": "/"})
            await c.post("/login", data={"key": key, "csrf": _csrf(form.text), "next": "/"})
            shown = await c.get(f"/approve/{token}")
            page = await c.post(
                f"/approve/{token}", data={"decision": "approve", "csrf": _csrf(shown.text)}
            )
            assert page.status_code == 200, page.text
            assert "being checked" in page.text and "carried out" not in page.text
    finally:
        engine.close()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "no CSRF field"
    return found.group(1)
