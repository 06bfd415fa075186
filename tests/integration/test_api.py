"""The JSON API (reference §6) in-process, on both backends: auth, the run lifecycle over
HTTP, the §4 refusal codes and their bodies, malformed input that changes nothing, and a
schemathesis pass over the OpenAPI document that finds no 5xx.

No worker runs here: the tests carry runs with ``engine.run_until_stop``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import agents
import downstream
import httpx
import inprocess
import psycopg
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from json_api import (
    BASE,
    BOSS,
    DANA,
    ERROR_KEYS,
    KEYS,
    MIGUEL,
    build_engine,
    fingerprint,
    refused,
    samples,
    serving,
)
from schemathesis.specs.openapi.checks import ignored_auth

from tether import Engine, MemoryNotifier, StopKind
from tether.api.app import create_app
from tether.config import Settings


def parse_iso(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None, text
    return parsed


# -- auth ----------------------------------------------------------------------------------

ENDPOINTS = [
    ("POST", "/v1/runs", {"question": "q"}),
    ("GET", "/v1/runs", None),
    ("GET", "/v1/runs/RUN", None),
    ("GET", "/v1/runs/RUN/events", None),
    ("POST", "/v1/runs/RUN/continue", None),
    ("POST", "/v1/runs/RUN/cancel", None),
    ("POST", "/v1/runs/RUN/fork", {"at_step": 1}),
    ("POST", "/v1/approvals/TOKEN", {"decision": "approve"}),
    ("GET", "/v1/approvals", None),
    (
        "POST",
        "/v1/runs/RUN/decisions",
        {"decisions": [{"tool_call_id": "c", "decision": "approve"}]},
    ),
    ("GET", "/v1/audit", None),
    ("DELETE", "/v1/users/me/data", None),
]


async def test_every_endpoint_refuses_a_missing_or_unknown_key_with_401(db_url: str) -> None:
    # Every endpoint meets the same unknown key: past the default limit that is a 429
    # (test_unknown_keys_past_the_limit_...); this test is about the 401 before it.
    async with serving(db_url, auth_max_failures=1000) as api:
        run_id, token = await api.suspended()
        before = await fingerprint(api.engine)
        for method, template, body in ENDPOINTS:
            path = template.replace("RUN", run_id).replace("TOKEN", token)
            for headers in (
                {},
                {"Authorization": "Bearer not-a-key"},
                {"Authorization": f"Basic {KEYS['dana']}"},
                {"Authorization": "Bearer "},
                {"Authorization": KEYS["dana"]},
            ):
                response = await api.client.request(method, path, json=body, headers=headers)
                refused(response, 401, "unauthenticated")
        assert await fingerprint(api.engine) == before
        assert (await api.decide(token)).status_code == 200  # the token was never used


async def test_failed_keys_slow_down_only_themselves_and_never_a_valid_key_from_their_address(
    db_url: str,
) -> None:
    engine = await build_engine(db_url, "send", MemoryNotifier())
    app = create_app(engine)
    limit = engine.settings.auth_max_failures
    lookups = inprocess.count_calls(engine, "user_for_key")

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 4321))
        return httpx.AsyncClient(transport=transport, base_url=BASE)

    try:
        async with client("10.0.0.1") as shared, client("10.0.0.2") as elsewhere:
            for _ in range(3 * limit):  # successes are never counted
                assert (await shared.get("/v1/runs", headers=DANA)).status_code == 200
            for n in range(limit):  # someone behind the same NAT guesses keys
                bad = {"Authorization": f"Bearer guess-{n}"}
                refused(await shared.get("/v1/runs", headers=bad), 401, "unauthenticated")
            # Past the limit, the address's further failures are 429 (looked up, refused)...
            slowed = await shared.get("/v1/runs", headers={"Authorization": "Bearer guess-x"})
            body = refused(slowed, 429, "too_many_attempts", ("retry_after_s",))
            assert slowed.headers["retry-after"] == str(body["retry_after_s"])
            assert 1 <= body["retry_after_s"] <= engine.settings.auth_window_s
            # ...while a valid key from that very address is never refused for them.
            for _ in range(3):
                assert (await shared.get("/v1/runs", headers=DANA)).status_code == 200

            # One key failing too often is refused before it is looked up, from anywhere.
            revoked = {"Authorization": "Bearer a-revoked-key"}
            for _ in range(limit):
                await elsewhere.get("/v1/runs", headers=revoked)
            looked_up = len(lookups)
            locked = await elsewhere.get("/v1/runs", headers=revoked)
            refused(locked, 429, "too_many_attempts", ("retry_after_s",))
            assert len(lookups) == looked_up  # not looked up
            assert (await elsewhere.get("/v1/runs", headers=DANA)).status_code == 200
    finally:
        engine.close()


# -- the lifecycle -------------------------------------------------------------------------


async def test_a_started_run_is_202_and_waits_for_a_worker_with_its_limits(db_url: str) -> None:
    async with serving(db_url) as api:
        response = await api.client.post(
            "/v1/runs",
            json={"question": "send b", "limits": {"max_steps": 7, "max_spend_usd": 0.5}},
            headers=DANA,
        )
        assert response.status_code == 202
        body = response.json()
        assert set(body) == {"id", "state"} and body["state"] == "running"
        assert response.headers["location"] == f"/v1/runs/{body['id']}"
        run = await api.run(body["id"])
        assert run["user_id"] == "dana" and run["question"] == "send b"
        assert run["state"] == "running" and run["step"] == 0 and run["pending"] is None
        assert run["budget"]["limits"] == {
            "max_steps": 7,
            "max_spend_usd": 0.5,
            "max_tool_calls": 40,
            "max_elapsed_ms": 600_000,
        }
        assert run["budget"]["consumed"] == {
            "steps": 0,
            "spend_usd": 0.0,
            "tool_calls": 0,
            "elapsed_ms": 0,
        }
        assert [m["role"] for m in run["messages"]] == ["system", "user"]
        assert run["messages"][1]["content"] == "send b"
        assert parse_iso(run["created_at"]) <= parse_iso(run["updated_at"])
        stored = (await api.engine.get_run(body["id"])).run
        assert stored is not None and stored.owner is None  # nobody carries it yet


async def test_a_suspended_run_shows_its_pending_request_and_one_approval_executes_it(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        run = await api.run(run_id)
        assert run["state"] == "suspended" and run["step"] == 1
        pending = run["pending"]
        assert set(pending) == {"tool_call_id", "tool", "arguments", "preview", "expires_at"}
        assert pending["tool_call_id"] == run["messages"][-1]["tool_calls"][0]["id"]
        assert pending["tool"] == "send" and pending["arguments"] == {"item": "b"}
        assert pending["preview"] == {"item": "b", "price": "100"}
        assert parse_iso(pending["expires_at"]) > datetime.now(UTC)
        assert run["messages"][-1]["tool_calls"][0]["function"]["name"] == "send"
        assert run["budget"]["consumed"]["spend_usd"] > 0

        response = await api.decide(token)
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["ok"] is True and result["run_id"] == run_id
        assert result["decision"] == "approve" and result["outcome"] == "executed"
        assert result["state"] == "running"  # handed to the workers
        assert [e[1] for e in downstream.effects()] == ["send"]

        for decision in ("approve", "decline"):
            again = refused(
                await api.decide(token, decision), 409, "already_resumed", ("decision",)
            )
            assert again["decision"]["decision"] == "approve"
            assert again["decision"]["by"] == "dana"
            parse_iso(again["decision"]["at"])
        assert [e[1] for e in downstream.effects()] == ["send"]  # still once

        assert (await api.engine.run_until_stop(run_id)).kind is StopKind.ANSWERED
        done = await api.run(run_id)
        assert done["state"] == "answered" and done["pending"] is None
        assert done["messages"][-1] == {"role": "assistant", "content": "done"}
        assert done["budget"]["consumed"]["tool_calls"] == 1


async def test_a_decline_over_http_gives_the_model_a_declined_result_and_no_effect(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        response = await api.decide(token, "decline")
        assert response.status_code == 200, response.text
        assert response.json()["outcome"] == "declined"
        assert downstream.effects() == []
        messages = (await api.run(run_id))["messages"]
        assert json.loads(messages[-1]["content"])["error"] == "declined_by_user"


async def test_an_approver_in_the_owners_scope_may_decide_and_nobody_else(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        refused(await api.decide(token, headers=MIGUEL), 404, "unknown_or_expired")
        response = await api.decide(token, headers=BOSS)
        assert response.status_code == 200, response.text
        used = refused(await api.decide(token), 409, "already_resumed", ("decision",))
        assert used["decision"]["by"] == "boss"
        # The approver still cannot read the run: only its owner can.
        refused(await api.client.get(f"/v1/runs/{run_id}", headers=BOSS), 404, "not_found")


async def test_a_request_is_found_in_the_approvals_list_and_decided_by_run_without_its_token(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        listed = await api.client.get("/v1/approvals", headers=BOSS)
        assert listed.status_code == 200, listed.text
        body = listed.json()
        assert body["more"] == 0 and body["next"] is None and body["after"] is None
        (item,) = body["items"]
        call_id = (await api.run(run_id))["pending"]["tool_call_id"]
        assert item == {
            "run_id": run_id,
            "user_id": "dana",
            "question": "send b",
            "tool": "send",
            "tool_call_id": call_id,
            "arguments": {"item": "b"},
            "preview": {"item": "b", "price": "100"},
            "digest": item["digest"],
            "expires_at": item["expires_at"],
            "pending_calls": 1,
            "root_run_id": run_id,  # a top-level run is its tree's root (reference §18)
            "parent_run_id": None,
            "decide_url": f"{BASE}/v1/runs/{run_id}/decisions",
            # Who decides it so far (reference §19): one person, none yet, not escalated.
            "quorum": 1,
            "approvals": [],
            "suspended_at": item["suspended_at"],
            "escalated_at": None,
            "may_decide": True,
        }
        assert len(item["digest"]) == 64 and parse_iso(item["expires_at"])
        assert parse_iso(item["suspended_at"])
        assert (await api.client.get("/v1/approvals", headers=DANA)).json()["items"] == [item]
        assert (await api.client.get("/v1/approvals", headers=MIGUEL)).json()["items"] == []

        entry = {"tool_call_id": call_id, "decision": "approve", "digest": item["digest"]}
        decided = await api.client.post(
            item["decide_url"].removeprefix(BASE), json={"decisions": [entry]}, headers=BOSS
        )
        assert decided.status_code == 200, decided.text
        assert decided.json() == {
            "ok": True,
            "results": [
                {
                    "tool_call_id": call_id,
                    "ok": True,
                    "run_id": run_id,
                    "decision": "approve",
                    "state": "running",
                    "outcome": "executed",
                }
            ],
        }
        again = await api.client.post(
            f"/v1/runs/{run_id}/decisions", json={"decisions": [entry]}, headers=DANA
        )
        assert again.status_code == 200, again.text
        (result,) = again.json()["results"]
        assert result["ok"] is False and result["outcome"] == result["error"] == "already_resumed"
        assert result["decision"]["by"] == "boss"
        refused(await api.decide(token), 409, "already_resumed", ("decision",))
        assert [e[1] for e in downstream.effects()] == ["send"]
        assert (await api.client.get("/v1/approvals", headers=BOSS)).json()["items"] == []


async def test_decisions_by_run_refuse_bad_entries_and_strangers_and_change_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        call_id = (await api.run(run_id))["pending"]["tool_call_id"]
        ok = {"tool_call_id": call_id, "decision": "approve"}
        before = await fingerprint(api.engine)
        path = f"/v1/runs/{run_id}/decisions"
        bad: dict[str, Any]
        for bad in (
            {"decisions": [ok, ok]},
            {"decisions": [{"tool_call_id": "call_other", "decision": "approve"}]},
            {"decisions": [{**ok, "arguments": {"item": 3}}]},
            {"decisions": [{**ok, "decision": "maybe"}]},
            {"decisions": [{**ok, "extra": True}]},
            {"decisions": []},
            {"decisions": ok},
            {},
        ):
            response = await api.client.post(path, json=bad, headers=DANA)
            refused(response, 422, "invalid_input")
        refused(
            await api.client.post(path, json={"decisions": [ok]}, headers=MIGUEL), 404, "not_found"
        )
        missing = f"/v1/runs/{'0' * 32}/decisions"
        refused(
            await api.client.post(missing, json={"decisions": [ok]}, headers=DANA), 404, "not_found"
        )
        assert await fingerprint(api.engine) == before
        assert downstream.effects() == []
        assert (await api.decide(token)).status_code == 200  # the token still works


async def test_the_approvals_list_pages_and_bad_paging_is_invalid_input(db_url: str) -> None:
    async with serving(db_url) as api:
        runs = [(await api.suspended())[0] for _ in range(3)]
        first = (await api.client.get("/v1/approvals?limit=2", headers=DANA)).json()
        assert [i["run_id"] for i in first["items"]] == runs[:2] and first["more"] == 1
        assert first["after"].endswith(":" + runs[1])
        assert first["next"] == f"/v1/approvals?after={first['after']}&limit=2"
        rest = (await api.client.get(first["next"], headers=DANA)).json()
        assert [i["run_id"] for i in rest["items"]] == runs[2:] and rest["more"] == 0
        assert rest["after"] is None and rest["next"] is None
        for query in ("limit=0", "limit=1001", "after=-1", "after=x", "after=1.5:"):
            response = await api.client.get(f"/v1/approvals?{query}", headers=DANA)
            refused(response, 422, "invalid_input")


async def test_events_are_the_runs_trace_oldest_first_with_iso_times(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        assert (await api.decide(token)).status_code == 200
        response = await api.client.get(f"/v1/runs/{run_id}/events", headers=DANA)
        assert response.status_code == 200
        items = response.json()["items"]
        assert all(set(item) == {"id", "seq", "at", "kind", "data"} for item in items)
        assert [item["seq"] for item in items] == list(range(1, len(items) + 1))
        kinds = [item["kind"] for item in items]
        assert kinds[0] == "created"
        assert kinds.index("suspended") < kinds.index("approved")
        assert [item["id"] for item in items] == sorted(item["id"] for item in items)
        times = [parse_iso(item["at"]) for item in items]
        assert times == sorted(times)


async def test_the_run_list_holds_only_the_callers_runs_newest_first(db_url: str) -> None:
    async with serving(db_url) as api:
        first = await api.start()
        second = await api.start()
        theirs = await api.start(MIGUEL)
        response = await api.client.get("/v1/runs", headers=DANA)
        assert response.status_code == 200
        items = response.json()["items"]
        assert {item["id"] for item in items} == {first, second}
        assert all("messages" not in item and item["user_id"] == "dana" for item in items)
        limited = await api.client.get("/v1/runs", params={"limit": 1}, headers=DANA)
        assert len(limited.json()["items"]) == 1
        mine = (await api.client.get("/v1/runs", headers=MIGUEL)).json()["items"]
        assert [item["id"] for item in mine] == [theirs]


# -- other users' runs -----------------------------------------------------------------------


async def test_another_users_run_is_not_found_on_every_endpoint_and_their_token_unknown(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        before = await fingerprint(api.engine)
        for suffix, method in (("", "GET"), ("/events", "GET"), ("/continue", "POST"),
                               ("/cancel", "POST")):  # fmt: skip
            theirs = await api.client.request(method, f"/v1/runs/{run_id}{suffix}", headers=MIGUEL)
            missing = await api.client.request(
                method, f"/v1/runs/{'f' * 32}{suffix}", headers=MIGUEL
            )
            body = refused(theirs, 404, "not_found")
            assert body == missing.json(), "a foreign run must look exactly like a missing one"
        for decision in ("approve", "decline"):
            refused(await api.decide(token, decision, MIGUEL), 404, "unknown_or_expired")
        refused(await api.decide("no-such-token"), 404, "unknown_or_expired")
        assert await fingerprint(api.engine) == before
        assert (await api.run(run_id))["state"] == "suspended"
        assert (await api.decide(token)).status_code == 200  # untouched for its owner


async def test_ids_that_cannot_name_a_run_are_not_found(db_url: str) -> None:
    async with serving(db_url) as api:
        # (a NUL, "%00", is invalid_input wherever it is: test_unstorable_input.py)
        for run_id in ("x" * 65, "%F0%9F%92%A5", "..", "a b", "a%0Ab"):
            response = await api.client.get(f"/v1/runs/{run_id}", headers=DANA)
            refused(response, 404, "not_found")
            events = await api.client.get(f"/v1/runs/{run_id}/events", headers=DANA)
            refused(events, 404, "not_found")


# -- continue and cancel -------------------------------------------------------------------


async def test_continue_grants_the_default_or_a_named_budget_and_refuses_what_is_not_halted(
    db_url: str,
) -> None:
    async with serving(db_url, "standard") as api:
        default_id = await api.start(limits={"max_steps": 1})
        named_id = await api.start(limits={"max_steps": 1})
        for run_id in (default_id, named_id):
            outcome = await api.engine.run_until_stop(run_id)
            assert outcome.kind is StopKind.HALTED
            run = await api.run(run_id)
            assert run["state"] == "halted" and run["halt_reason"] == "max_steps"

        response = await api.client.post(f"/v1/runs/{default_id}/continue", headers=DANA)
        assert response.status_code == 200, response.text
        continued = response.json()
        assert continued["state"] == "running" and continued["halt_reason"] is None
        assert continued["budget"]["limits"] == {
            "max_steps": 5,
            "max_spend_usd": 1.5,
            "max_tool_calls": 44,
            "max_elapsed_ms": 900_000,
        }
        again = await api.client.post(f"/v1/runs/{default_id}/continue", headers=DANA)
        refused(again, 409, "not_halted")

        before = await fingerprint(api.engine)
        too_much = await api.client.post(
            f"/v1/runs/{named_id}/continue", json={"limits": {"max_steps": 5000}}, headers=DANA
        )
        refused(too_much, 422, "invalid_input", ("cap", "limit"))
        assert await fingerprint(api.engine) == before
        response = await api.client.post(
            f"/v1/runs/{named_id}/continue",
            json={"limits": {"max_steps": 3}, "why": "needs one more look"},
            headers=DANA,
        )
        assert response.status_code == 200, response.text
        assert response.json()["budget"]["limits"]["max_steps"] == 3
        events = (await api.client.get(f"/v1/runs/{named_id}/events", headers=DANA)).json()
        grant = [e["data"] for e in events["items"] if e["kind"] == "continued"]
        assert len(grant) == 1
        assert grant[0]["by"] == "dana" and grant[0]["why"] == "needs one more look"
        assert grant[0]["previous_halt_reason"] == "max_steps"
        assert grant[0]["old_limits"]["max_steps"] == 1 and grant[0]["new_limits"]["max_steps"] == 3


async def test_cancel_stops_a_run_once_and_a_finished_run_is_already_finished(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        response = await api.client.post(f"/v1/runs/{run_id}/cancel", headers=DANA)
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "cancelled" and response.json()["pending"] is None
        refused(
            await api.client.post(f"/v1/runs/{run_id}/cancel", headers=DANA),
            409,
            "already_finished",
        )
        refused(
            await api.client.post(f"/v1/runs/{run_id}/continue", headers=DANA), 409, "not_halted"
        )
        refused(await api.decide(token), 404, "unknown_or_expired")
        assert downstream.effects() == []
        missing = await api.client.post(f"/v1/runs/{'0' * 32}/cancel", headers=DANA)
        refused(missing, 404, "not_found")


# -- the refusals of reference §4 -----------------------------------------------------------------


async def test_a_changed_preview_is_409_with_the_diff_and_a_new_token(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        downstream.set_world("price", "120")
        body = refused(
            await api.decide(token), 409, "changed", ("diff", "token", "preview", "expires_at")
        )
        assert body["diff"] == [{"path": "price", "before": "100", "after": "120"}]
        assert body["token"] != token and body["preview"] == {"item": "b", "price": "120"}
        run = await api.run(run_id)
        assert run["state"] == "suspended" and run["pending"]["preview"]["price"] == "120"
        assert run["pending"]["expires_at"] == body["expires_at"]
        assert api.notifier.last(run_id).token == body["token"]  # a new notice went out
        refused(await api.decide(token), 409, "already_resumed", ("decision",))
        response = await api.decide(body["token"])
        assert response.status_code == 200 and response.json()["outcome"] == "executed"
        assert [e[1] for e in downstream.effects()] == ["send"]


async def test_a_guard_refusal_is_409_guard_failed_and_the_run_goes_on(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        downstream.set_world("hold", "1")
        body = refused(await api.decide(token), 409, "guard_failed", ("reason",))
        assert body["reason"] == "the account is on hold"
        run = await api.run(run_id)
        assert run["state"] == "running"
        assert json.loads(run["messages"][-1]["content"])["error"] == "guard_failed"
        assert downstream.effects() == []


async def test_lost_permission_is_403_no_longer_permitted_and_the_run_halts(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        downstream.set_world("perm:dana", "0")
        body = refused(await api.decide(token), 403, "no_longer_permitted", ("run_id",))
        assert body["run_id"] == run_id
        run = await api.run(run_id)
        assert run["state"] == "halted" and run["halt_reason"] == "no_longer_permitted"
        refused(await api.decide(token), 409, "already_resumed", ("decision",))
        assert downstream.effects() == []


# -- malformed input -------------------------------------------------------------------------

BIG = 300 * 1024

# name, method, path ("RUN"/"TOKEN" filled in), raw body, content type, status, code
MALFORMED: list[tuple[str, str, str, bytes | None, str, int, str]] = [
    ("bad json", "POST", "/v1/runs", b'{"question": ', "application/json", 422, "invalid_input"),
    ("no body", "POST", "/v1/runs", None, "application/json", 422, "invalid_input"),
    ("json array", "POST", "/v1/runs", b"[]", "application/json", 422, "invalid_input"),
    ("question number", "POST", "/v1/runs", b'{"question": 42}', "application/json", 422,
     "invalid_input"),
    ("question empty", "POST", "/v1/runs", b'{"question": ""}', "application/json", 422,
     "invalid_input"),
    ("question blank", "POST", "/v1/runs", b'{"question": "  \\n "}', "application/json", 422,
     "invalid_input"),
    ("question NUL", "POST", "/v1/runs", b'{"question": "a\\u0000b"}', "application/json", 422,
     "invalid_input"),
    ("question surrogate", "POST", "/v1/runs", b'{"question": "a\\ud800b"}',
     "application/json", 422, "invalid_input"),
    ("question too long", "POST", "/v1/runs",
     json.dumps({"question": "q" * 100_001}).encode(), "application/json", 422,
     "invalid_input"),
    ("extra field", "POST", "/v1/runs", b'{"question": "q", "model": "gpt"}',
     "application/json", 422, "invalid_input"),
    ("limits not an object", "POST", "/v1/runs", b'{"question": "q", "limits": "lots"}',
     "application/json", 422, "invalid_input"),
    ("limits negative", "POST", "/v1/runs", b'{"question": "q", "limits": {"max_steps": -1}}',
     "application/json", 422, "invalid_input"),
    ("limits wrong type", "POST", "/v1/runs",
     b'{"question": "q", "limits": {"max_steps": "many"}}', "application/json", 422,
     "invalid_input"),
    ("limits unknown", "POST", "/v1/runs", b'{"question": "q", "limits": {"max_tokens": 5}}',
     "application/json", 422, "invalid_input"),
    ("limits numeric string", "POST", "/v1/runs",
     b'{"question": "q", "limits": {"max_steps": "5"}}', "application/json", 422,
     "invalid_input"),
    ("limits boolean", "POST", "/v1/runs", b'{"question": "q", "limits": {"max_steps": true}}',
     "application/json", 422, "invalid_input"),
    ("limits spend boolean", "POST", "/v1/runs",
     b'{"question": "q", "limits": {"max_spend_usd": true}}', "application/json", 422,
     "invalid_input"),
    ("form body", "POST", "/v1/runs", b"question=q", "application/x-www-form-urlencoded", 422,
     "invalid_input"),
    ("oversized", "POST", "/v1/runs", json.dumps({"question": "q" * BIG}).encode(),
     "application/json", 413, "payload_too_large"),
    ("decision unknown", "POST", "/v1/approvals/TOKEN", b'{"decision": "yes"}',
     "application/json", 422, "invalid_input"),
    ("decision missing", "POST", "/v1/approvals/TOKEN", b"{}", "application/json", 422,
     "invalid_input"),
    ("decision null", "POST", "/v1/approvals/TOKEN", b'{"decision": null}', "application/json",
     422, "invalid_input"),
    ("decision extra", "POST", "/v1/approvals/TOKEN",
     b'{"decision": "approve", "as": "miguel"}', "application/json", 422, "invalid_input"),
    ("decision bad json", "POST", "/v1/approvals/TOKEN", b'{"decision": "approve"',
     "application/json", 422, "invalid_input"),
    ("decision no body", "POST", "/v1/approvals/TOKEN", None, "application/json", 422,
     "invalid_input"),
    ("decision oversized", "POST", "/v1/approvals/TOKEN",
     json.dumps({"decision": "approve", "pad": "x" * BIG}).encode(), "application/json", 413,
     "payload_too_large"),
    ("continue zero limit", "POST", "/v1/runs/RUN/continue", b'{"limits": {"max_steps": 0}}',
     "application/json", 422, "invalid_input"),
    ("continue why number", "POST", "/v1/runs/RUN/continue", b'{"why": 5}',
     "application/json", 422, "invalid_input"),
    ("continue numeric string", "POST", "/v1/runs/RUN/continue",
     b'{"limits": {"max_steps": "4"}}', "application/json", 422, "invalid_input"),
    ("continue boolean", "POST", "/v1/runs/RUN/continue",
     b'{"limits": {"max_tool_calls": true}}', "application/json", 422, "invalid_input"),
    ("continue extra", "POST", "/v1/runs/RUN/continue", b'{"surprise": true}',
     "application/json", 422, "invalid_input"),
    ("continue bad json", "POST", "/v1/runs/RUN/continue", b"{", "application/json", 422,
     "invalid_input"),
    ("list limit zero", "GET", "/v1/runs?limit=0", None, "application/json", 422,
     "invalid_input"),
    ("list limit text", "GET", "/v1/runs?limit=many", None, "application/json", 422,
     "invalid_input"),
]  # fmt: skip


async def test_malformed_input_is_a_4xx_with_the_error_shape_and_changes_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        before = await fingerprint(api.engine)
        for name, method, template, content, content_type, status, code in MALFORMED:
            path = template.replace("RUN", run_id).replace("TOKEN", token)
            response = await api.client.request(
                method, path, content=content, headers={**DANA, "Content-Type": content_type}
            )
            assert response.status_code == status, f"{name}: {response.text[:300]}"
            body = response.json()
            assert set(body) == ERROR_KEYS and body["error"] == code, f"{name}: {body}"
            assert body["ok"] is False and body["message"], name
            assert await fingerprint(api.engine) == before, f"{name} changed the store"
        assert (await api.decide(token)).status_code == 200  # the token is still unused


async def test_an_oversized_streamed_body_is_413_before_the_handler_reads_it(db_url: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"question": "'
        for _ in range(BIG // 4096):
            yield b"q" * 4096
        yield b'"}'

    async with serving(db_url) as api:
        response = await api.client.post(
            "/v1/runs", content=chunks(), headers={**DANA, "Content-Type": "application/json"}
        )
        refused(response, 413, "payload_too_large")
        assert list(await api.engine.list_runs(None, limit=10)) == []


# -- health ---------------------------------------------------------------------------------


async def test_readyz_is_200_with_a_reachable_database(db_url: str) -> None:
    async with serving(db_url) as api:
        ready = await api.client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"ok": True}


async def test_readyz_is_503_not_ready_when_the_database_is_unreachable() -> None:
    engine = Engine(
        agent=agents.agent(),
        model=agents.script("send"),
        settings=Settings(database_url="postgresql://postgres@127.0.0.1:1/nowhere"),
    )
    transport = httpx.ASGITransport(app=create_app(engine))
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            refused(await client.get("/readyz"), 503, "not_ready")
            assert (await client.get("/healthz")).json() == {"ok": True}  # the process is up
    finally:
        engine.close()


# -- metrics and wake-ups --------------------------------------------------------------------


async def test_metrics_count_runs_by_state_and_approvals_by_outcome(db_url: str) -> None:
    async with serving(db_url) as api:
        first = (await api.client.get("/metrics")).text
        executed = (("outcome", "executed"),)
        approvals_before = samples(first, "tether_approvals_total").get(executed, 0.0)
        _, token = await api.suspended()
        await api.start()
        response = await api.client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        by_state = samples(response.text, "tether_runs")
        assert by_state[(("state", "suspended"),)] == 1
        assert by_state[(("state", "running"),)] == 1
        assert by_state[(("state", "answered"),)] == 0
        assert (await api.decide(token)).status_code == 200
        assert (await api.decide(token)).status_code == 409
        after = (await api.client.get("/metrics")).text
        approvals = samples(after, "tether_approvals_total")
        assert approvals[executed] == approvals_before + 1
        assert approvals[(("outcome", "already_resumed"),)] >= 1
        assert "tether_step_seconds_bucket" in after  # the histograms are exposed


async def test_a_started_or_continued_run_wakes_listening_workers_on_postgresql(
    pg_url: str,
) -> None:
    with psycopg.connect(pg_url, autocommit=True) as listener:
        listener.execute("LISTEN tether_runs")
        async with serving(pg_url, "standard") as api:
            run_id = await api.start(limits={"max_steps": 1})
            woken = list(listener.notifies(timeout=5, stop_after=1))
            assert [n.channel for n in woken] == ["tether_runs"]
            assert (await api.engine.run_until_stop(run_id)).kind is StopKind.HALTED
            response = await api.client.post(f"/v1/runs/{run_id}/continue", headers=DANA)
            assert response.status_code == 200
            woken = list(listener.notifies(timeout=5, stop_after=1))
            assert [n.channel for n in woken] == ["tether_runs"]


# -- the OpenAPI document and schemathesis ---------------------------------------------------


async def test_the_openapi_document_describes_auth_and_every_refusal(db_url: str) -> None:
    async with serving(db_url) as api:
        document = (await api.client.get("/openapi.json")).json()
    operations = [
        (path, method, op)
        for path, item in document["paths"].items()
        if path.startswith("/v1/")
        for method, op in item.items()
    ]
    # With the schedules (§13), a run's tree (§18), the audit (§19), erasure (§20).
    assert len(operations) == 21
    for path, method, op in operations:
        assert op["security"] == [{"HTTPBearer": []}], (path, method)
        assert "401" in op["responses"], (path, method)
        for status, response in op["responses"].items():
            schema = json.dumps(response.get("content", {}))
            assert "HTTPValidationError" not in schema, (path, method, status)
            if status.startswith("4"):
                assert "ErrorOut" in schema or "ApprovalRefusedOut" in schema, (path, status)


@pytest.fixture
async def api_app(db_url: str) -> AsyncIterator[FastAPI]:
    engine = await build_engine(db_url, "send", MemoryNotifier())
    try:
        yield create_app(engine, public_url="http://tether.test")
    finally:
        engine.close()


@pytest.fixture
def api_schema(api_app: FastAPI) -> Any:
    """The document `/openapi.json` serves, for the /v1 operations."""
    schemathesis.experimental.OPEN_API_3_1.enable()  # FastAPI writes OpenAPI 3.1
    return schemathesis.from_dict(api_app.openapi(), base_url=BASE).include(path_regex="^/v1/")


@pytest.fixture
def api_session(api_app: FastAPI) -> Any:
    """A requests-style session over the app, as schemathesis sends with. Not entered as a
    context manager (starlette_testclient's lifespan leaves anyio streams unclosed: a
    ResourceWarning, an error here) and not closed (its adapter holds nothing to close)."""
    from starlette_testclient import TestClient

    return TestClient(api_app, base_url=BASE)


# Explicit Nones: schemathesis 3.39 warns about its own NOT_SET defaults otherwise.
schema = schemathesis.from_pytest_fixture(
    "api_schema", method=None, endpoint=None, tag=None, operation_id=None
)


@pytest.mark.slow
@schema.parametrize()
# schemathesis 3.39 and its client use deprecated jsonschema and anyio names.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:schemathesis")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:starlette_testclient")
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_generated_requests_never_get_a_server_error(case: Any, api_session: Any) -> None:
    case.headers = {**(case.headers or {}), **DANA}
    response = case.call(session=api_session)
    assert response.status_code < 500, response.text
    # `ignored_auth` re-sends without our session (through the leaky client above);
    # test_every_endpoint_refuses_a_missing_or_unknown_key_with_401 covers it.
    case.validate_response(response, excluded_checks=(ignored_auth,))


# -- richer decisions (reference §9) ---------------------------------------------------------------


async def test_an_edit_is_previewed_then_approved_on_its_digest_and_a_decline_carries_a_reason(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        _, token = await api.suspended()
        before = await fingerprint(api.engine)
        preview = await api.client.post(
            f"/v1/approvals/{token}/preview", json={"arguments": {"item": "c"}}, headers=DANA
        )
        assert preview.status_code == 200, preview.text
        shown = preview.json()
        assert shown["preview"] == {"item": "c", "price": "100"} and len(shown["digest"]) == 64
        assert shown["arguments"] == {"item": "c"} and shown["tool"] == "send"
        as_pending = await api.client.post(f"/v1/approvals/{token}/preview", headers=DANA)
        assert as_pending.json()["arguments"] == {"item": "b"}
        assert await fingerprint(api.engine) == before  # a preview changes nothing
        body = {"decision": "approve", "arguments": {"item": "c"}, "digest": shown["digest"]}
        decided = await api.client.post(f"/v1/approvals/{token}", json=body, headers=DANA)
        assert decided.status_code == 200, decided.text
        assert decided.json()["outcome"] == "executed"
        again = await api.client.post(
            f"/v1/approvals/{token}", json={"decision": "decline", "reason": "late"}, headers=DANA
        )
        used = refused(again, 409, "already_resumed", ("decision",))
        assert used["decision"]["arguments"] == {"item": "c"}
        assert used["decision"]["reason"] is None
        assert [item for _, _, item in downstream.effects()] == ["c"]

        other, other_token = await api.suspended()
        declined = await api.client.post(
            f"/v1/approvals/{other_token}",
            json={"decision": "decline", "reason": "not this week"},
            headers=DANA,
        )
        assert declined.status_code == 200, declined.text
        await api.engine.run_until_stop(other)
        messages = (await api.run(other))["messages"]
        result = json.loads(next(m for m in reversed(messages) if m["role"] == "tool")["content"])
        assert result["reason"] == "not this week" and result["error"] == "declined_by_user"


async def test_a_stale_digest_is_changed_with_a_diff_and_a_new_token(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        pending = (await api.run(run_id))["pending"]
        shown = await api.client.post(f"/v1/approvals/{token}/preview", headers=DANA)
        body = {"decision": "approve", "arguments": {"item": "d"}, "digest": shown.json()["digest"]}
        response = await api.client.post(f"/v1/approvals/{token}", json=body, headers=DANA)
        changed = refused(response, 409, "changed", ("diff", "token", "preview", "expires_at"))
        assert changed["diff"] == [{"path": "item", "before": "b", "after": "d"}]
        now = await api.run(run_id)
        assert now["state"] == "suspended" and now["pending"]["arguments"] == {"item": "d"}
        assert pending["arguments"] == {"item": "b"}
        assert downstream.effects() == []


async def test_bad_decisions_and_previews_are_clear_4xx_and_change_nothing(db_url: str) -> None:
    async with serving(db_url) as api:
        _, token = await api.suspended()
        before = await fingerprint(api.engine)
        bodies: list[dict[str, Any]] = [
            {"decision": "decline", "reason": "x" * 2001},
            {"decision": "approve", "arguments": ["c"]},
            {"decision": "approve", "arguments": "c"},
            {"decision": "approve", "arguments": {"item": 5}},
            {"decision": "approve", "digest": "xyz"},
            {"decision": "approve", "digest": "0" * 63},
            {"decision": "decline", "arguments": {"item": "c"}},
            {"decision": "approve", "reason": 7},
        ]
        for body in bodies:
            response = await api.client.post(f"/v1/approvals/{token}", json=body, headers=DANA)
            refused(response, 422, "invalid_input")
        for arguments in (["c"], {"item": 5}):
            response = await api.client.post(
                f"/v1/approvals/{token}/preview", json={"arguments": arguments}, headers=DANA
            )
            refused(response, 422, "invalid_input")
        stranger = await api.client.post(f"/v1/approvals/{token}/preview", headers=MIGUEL)
        refused(stranger, 404, "unknown_or_expired")
        assert await fingerprint(api.engine) == before
        assert (await api.decide(token)).status_code == 200  # the token still works


async def test_a_turn_of_two_sends_is_decided_call_by_call_over_http(db_url: str) -> None:
    """Reference §15 over HTTP: the run's JSON lists both pending calls; the first decision
    is recorded (200, ``waiting_for``); the batch decides the other and carries the turn out;
    a repeated or unknown call in a batch is 422 with nothing recorded."""
    async with serving(db_url, "two_sends") as api:
        run_id = await api.start()
        outcome = await api.engine.run_until_stop(run_id)
        assert outcome.kind is StopKind.SUSPENDED
        body = await api.run(run_id)
        first, second = body["pending_calls"]
        assert body["pending"]["tool_call_id"] == first["tool_call_id"]
        assert (first["decided"], second["decided"]) == (None, None)
        tokens = {n.tool_call_id: n.token for n in api.notifier.notices if n.run_id == run_id}
        recorded = await api.decide(tokens[first["tool_call_id"]])
        assert recorded.status_code == 200, recorded.text
        assert recorded.json() | {"run_id": None} == {
            "ok": True,
            "run_id": None,
            "decision": "approve",
            "state": "suspended",
            "outcome": "recorded",
            "waiting_for": 1,
        }
        body = await api.run(run_id)
        assert body["pending_calls"][0]["decided"]["decision"] == "approve"
        path = f"/v1/runs/{run_id}/decisions"
        again = {"tool_call_id": second["tool_call_id"], "decision": "decline"}
        for bad in ([again, again], [again, {"tool_call_id": "nope", "decision": "approve"}]):
            refused(
                await api.client.post(path, json={"decisions": bad}, headers=DANA),
                422,
                "invalid_input",
            )
        assert (await api.run(run_id))["pending_calls"][1]["decided"] is None
        response = await api.client.post(path, json={"decisions": [again]}, headers=DANA)
        assert response.status_code == 200, response.text
        (only,) = response.json()["results"]
        assert (only["tool_call_id"], only["outcome"]) == (second["tool_call_id"], "declined")
        await api.engine.run_until_stop(run_id)
        done = await api.run(run_id)
        assert done["state"] == "answered" and done["pending_calls"] == []
        assert [item for _, _, item in downstream.effects()] == ["b"]
