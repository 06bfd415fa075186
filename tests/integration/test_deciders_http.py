"""Who decides (reference §19) over the JSON API, on both backends: a quorum's approvals
answer ``recorded`` with ``approvals`` and ``quorum`` until the last carries the call out,
by token and by run; the same person again is 409 ``already_decided`` (in the entry's
result on the batch) and changes nothing; a run's JSON, its tree and ``GET /v1/approvals``
show each call's quorum, approvals so far, and when it was suspended and escalated; an
escalated call is listed for the people it names, who may decide it, and its webhook
notice says so.

No worker runs here: the engine carries runs with ``ask``, the reaper's pass escalates.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import downstream
from deciders_api import auth, serving
from waiting import until
from webhooks import receiver

from tether.webhook import WebhookNotifier


def _at(text: str | None) -> datetime:
    assert text is not None
    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None, text
    return parsed


def _deciders(call: dict[str, Any]) -> tuple[int, list[str], bool]:
    """A call's quorum, who approved it so far, and whether it was escalated."""
    return call["quorum"], [a["by"] for a in call["approvals"]], call["escalated_at"] is not None


async def test_a_quorum_by_token_records_then_executes_and_one_person_counts_once(
    db_url: str,
) -> None:
    async with serving(db_url, "pay") as api:
        run_id, [token] = await api.suspended()
        first = await api.decide(token, "boss")
        assert first.status_code == 200, first.text
        assert first.json() == {
            "ok": True,
            "run_id": run_id,
            "decision": "approve",
            "state": "suspended",
            "outcome": "recorded",
            "waiting_for": None,
            "approvals": 1,
            "quorum": 2,
        }
        assert downstream.effects() == []
        shown = await api.get(f"/v1/runs/{run_id}", "dana")

        again = await api.decide(token, "boss")  # the same person counts once
        assert again.status_code == 409, again.text
        body = again.json()
        assert (body["ok"], body["error"], body["approver"]) == (False, "already_decided", "boss")
        assert await api.get(f"/v1/runs/{run_id}", "dana") == shown  # nothing changed

        last = await api.decide(token, "ann")
        assert last.status_code == 200, last.text
        assert last.json()["outcome"] == "executed"
        assert "approvals" not in last.json() and "quorum" not in last.json()
        assert len(downstream.effects()) == 1
        late = await api.decide(token, "bob")
        assert (late.status_code, late.json()["error"]) == (409, "already_resumed")


async def test_a_run_its_tree_and_the_approvals_list_show_who_decides_so_far(
    db_url: str,
) -> None:
    async with serving(db_url, "pay") as api:
        run_id, [token] = await api.suspended()
        assert (await api.decide(token, "boss")).status_code == 200

        (call,) = (await api.get(f"/v1/runs/{run_id}", "dana"))["pending_calls"]
        assert _deciders(call) == (2, ["boss"], False)
        assert _at(call["approvals"][0]["at"]) >= _at(call["suspended_at"])
        (tree_run,) = (await api.get(f"/v1/runs/{run_id}/tree", "dana"))["runs"]
        assert tree_run["pending_calls"] == [call]

        for person in ("dana", "boss", "ann"):  # the owner, her approver, a finance member
            (item,) = (await api.get("/v1/approvals", person))["items"]
            assert (item["run_id"], item["tool_call_id"]) == (run_id, call["tool_call_id"])
            assert _deciders(item) == (2, ["boss"], False)
            assert item["suspended_at"] == call["suspended_at"] and item["may_decide"] is True
        assert (await api.get("/v1/approvals", "eve"))["items"] == []


async def test_the_batch_answers_already_decided_inside_the_entry_and_then_executes(
    db_url: str,
) -> None:
    async with serving(db_url, "pay") as api:
        run_id, _ = await api.suspended()
        (call,) = (await api.get(f"/v1/runs/{run_id}", "dana"))["pending_calls"]
        call_id = call["tool_call_id"]

        first = await api.decide_by_run(run_id, call_id, "ann")
        assert first.status_code == 200, first.text
        assert first.json() == {
            "ok": True,
            "results": [
                {
                    "tool_call_id": call_id,
                    "ok": True,
                    "run_id": run_id,
                    "decision": "approve",
                    "state": "suspended",
                    "outcome": "recorded",
                    "approvals": 1,
                    "quorum": 2,
                }
            ],
        }
        again = await api.decide_by_run(run_id, call_id, "ann")
        assert again.status_code == 200, again.text
        (result,) = again.json()["results"]
        assert (result["ok"], result["outcome"], result["error"]) == (
            False,
            "already_decided",
            "already_decided",
        )
        assert result["approver"] == "ann"
        (still,) = (await api.get(f"/v1/runs/{run_id}", "dana"))["pending_calls"]
        assert _deciders(still) == (2, ["ann"], False)

        last = await api.decide_by_run(run_id, call_id, "bob")
        (done,) = last.json()["results"]
        assert (done["ok"], done["outcome"]) == (True, "executed")
        assert "approvals" not in done and len(downstream.effects()) == 1


async def test_an_escalated_call_is_listed_for_its_people_who_may_decide_it(
    db_url: str,
) -> None:
    with receiver() as hook:
        async with serving(db_url, "page", notifier=WebhookNotifier(hook.url)) as api:
            run_id, _ = await api.suspended()
            for person in ("olga", "lead", "eve"):  # not escalated yet: nobody's to decide
                assert (await api.get("/v1/approvals", person))["items"] == []

            async def escalated() -> bool:
                return run_id in (await api.engine.operator.reap()).escalated

            await until(escalated, what="the escalation")
            (call,) = (await api.get(f"/v1/runs/{run_id}", "dana"))["pending_calls"]
            assert _deciders(call) == (1, [], True)
            assert _at(call["escalated_at"]) >= _at(call["suspended_at"])
            for person in ("olga", "lead"):  # the on-call group's member and the lead
                (item,) = (await api.get("/v1/approvals", person))["items"]
                assert item["run_id"] == run_id and item["may_decide"] is True
                assert item["escalated_at"] == call["escalated_at"]
            assert (await api.get("/v1/approvals", "eve"))["items"] == []

            def sent() -> list[dict[str, Any]]:
                return [n for n in hook.notices if n["run_id"] == run_id and n["escalated"]]

            await until(lambda: bool(sent()), what="the escalation's notice")
            (notice,) = sent()
            assert set(notice["escalate_to"]) == {"group:oncall", "lead"}
            assert notice["quorum"] == 1 and notice["tool_call_id"] == call["tool_call_id"]
            first = [n for n in hook.notices if n["run_id"] == run_id and not n["escalated"]]
            assert [n["escalate_to"] for n in first] == [[]]  # the first names nobody more

            decided = await api.decide_by_run(run_id, call["tool_call_id"], "olga")
            (result,) = decided.json()["results"]
            assert (result["ok"], result["outcome"]) == (True, "executed"), result
            assert len(downstream.effects()) == 1


async def test_a_four_eyes_quorum_is_listed_to_its_owner_as_not_hers_to_decide(
    db_url: str,
) -> None:
    async with serving(db_url, "wire") as api:
        run_id, [token] = await api.suspended()
        (mine,) = (await api.get("/v1/approvals", "dana"))["items"]
        assert mine["may_decide"] is False and _deciders(mine) == (2, [], False)
        refused = await api.client.post(
            f"/v1/approvals/{token}", json={"decision": "approve"}, headers=auth("dana")
        )
        assert (refused.status_code, refused.json()["error"]) == (403, "four_eyes")
        (theirs,) = (await api.get("/v1/approvals", "boss"))["items"]
        assert theirs["may_decide"] is True and theirs["run_id"] == run_id
