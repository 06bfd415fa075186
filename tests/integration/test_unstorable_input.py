"""NUL characters anywhere in input (reference §6, "Malformed input") on both backends: in
any string or key of any JSON body at any depth, in a URL or a header, in any field of the
inbox's forms, and in any argument of the engine's methods, a NUL is ``invalid_input``,
never a 500, and changes nothing. PostgreSQL cannot store one (so it was a 500 there);
SQLite could, and an edit holding one was approved and carried out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import downstream
import pytest
from inbox_web import csrf_of, session_csrf, sign_in, web
from json_api import DANA, fingerprint, refused, serving

from tether import Engine
from tether.errors import InvalidInput

NUL = "\x00"


def with_nul(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[str, Any]]:
    """``value`` with a NUL added to each of its strings, and to each key, one at a time,
    at every depth; each copy named by where the NUL went."""
    if isinstance(value, str):
        yield ".".join(map(str, path)) or "the value", value + NUL
    elif isinstance(value, dict):
        for key, inner in value.items():
            for where, changed in with_nul(inner, (*path, key)):
                yield where, {**value, key: changed}
            others = {k: v for k, v in value.items() if k != key}
            yield ".".join(map(str, (*path, f"key {key}"))), {**others, key + NUL: inner}
    elif isinstance(value, list):
        for n, inner in enumerate(value):
            for where, changed in with_nul(inner, (*path, n)):
                yield where, [*value[:n], changed, *value[n + 1 :]]


async def everything(engine: Engine) -> list[Any]:
    """What any request here could change: the runs (state, messages, events, lease), the
    schedules, the threads, and the test tools' effects downstream."""
    schedules = [(s.id, s.next_at) for s in await engine.list_schedules()]
    threads = [(t.id, len(t.runs)) for t in await engine.list_threads()]
    return [await fingerprint(engine), schedules, threads, downstream.effects()]


async def test_a_nul_in_any_string_of_any_json_body_is_invalid_input_and_changes_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        run_id, token = await api.suspended()
        run = await api.run(run_id)
        call, thread = run["pending"]["tool_call_id"], run["thread_id"]
        halted = await api.start(limits={"max_steps": 1})
        await api.engine.run_until_stop(halted)
        edit = {"item": "c", "note": {"deep": ["x", {"deeper": "y"}]}}
        bodies = [
            (
                "/v1/runs",
                {
                    "question": "q",
                    "thread_id": thread,
                    "if_busy": "enqueue",
                    "start_at": "2030-01-01T00:00:00Z",
                    "limits": {"max_steps": 3},
                },
            ),
            (f"/v1/approvals/{token}", {"decision": "approve", "arguments": {"item": "c"}}),
            (f"/v1/approvals/{token}", {"decision": "approve", "arguments": edit}),
            (f"/v1/approvals/{token}", {"decision": "decline", "reason": "no"}),
            (f"/v1/approvals/{token}/preview", {"arguments": {"item": "c"}}),
            (
                f"/v1/runs/{run_id}/decisions",
                {"decisions": [{"tool_call_id": call, "decision": "approve", "arguments": edit}]},
            ),
            (
                f"/v1/runs/{run_id}/decisions",
                {"decisions": [{"tool_call_id": call, "decision": "decline", "reason": "r"}]},
            ),
            (f"/v1/runs/{halted}/continue", {"limits": {"max_steps": 9}, "why": "w"}),
            (
                "/v1/schedules",
                {"cron": "0 9 * * 1", "question": "q", "timezone": "Europe/Paris"},
            ),
        ]
        before = await everything(api.engine)
        for path, body in bodies:
            for where, changed in with_nul(body):
                response = await api.client.post(path, json=changed, headers=DANA)
                assert response.status_code == 422, (path, where, response.text)
                assert refused(response, 422, "invalid_input")["message"], (path, where)
                assert await everything(api.engine) == before, (path, where)
        decided = await api.decide(token)  # the token was never used
        assert decided.status_code == 200 and decided.json()["outcome"] == "executed"
        assert [item for _, _, item in downstream.effects()] == ["b"]


async def test_a_nul_in_a_url_or_a_header_is_invalid_input(db_url: str) -> None:
    async with serving(db_url) as api:
        run_id = await api.start()
        thread = (await api.run(run_id))["thread_id"]
        before = await everything(api.engine)
        for method, path in [
            ("GET", f"/v1/runs/{run_id}%00"),
            ("GET", f"/v1/runs/{run_id}%00/events"),
            ("GET", f"/v1/runs/{run_id}/events/stream?after=0%00"),
            ("GET", "/v1/runs?limit=1%00"),
            ("GET", "/v1/approvals?after=1.5:ab%00"),
            ("POST", f"/v1/runs/{run_id}%00/cancel"),
            ("DELETE", f"/v1/threads/{thread}%00"),
            ("GET", f"/runs/{run_id}%00"),  # the inbox's pages too
            ("GET", "/login?next=/%00"),
        ]:
            response = await api.client.request(method, path, headers=DANA)
            refused(response, 422, "invalid_input")
        response = await api.client.post(
            "/v1/runs", json={"question": "q"}, headers={**DANA, "Idempotency-Key": "k\x00"}
        )
        refused(response, 422, "invalid_input")
        assert await everything(api.engine) == before


def engine_calls(
    engine: Engine, run_id: str, token: str, call: str, thread: str, halted: str, schedule: str
) -> list[tuple[str, Callable[[Any], Awaitable[Any]], Any]]:
    """Each engine method that takes text, as ``(name, call, arguments)``: ``call``
    applied to the arguments as given works (or is refused for another reason), and to a
    copy with a NUL anywhere in them is ``invalid_input``."""
    start = {"user": "dana", "question": "q", "thread_id": thread, "if_busy": "enqueue"}
    decisions = [{"tool_call_id": call, "decision": "approve", "arguments": {"item": "c"}}]
    by_run = {"run_id": run_id, "approver": "dana", "tool_call_id": call}
    return [
        ("start_run", lambda a: engine.start_run(**a), {**start, "start_at": "2030-01-01Z"}),
        ("start_run", lambda a: engine.start_run(**a), {**start, "route": {"agent": "kit"}}),
        ("add_schedule", lambda a: engine.add_schedule(**a), {
            "user": "dana", "cron_expression": "@daily", "question": "q", "timezone_name": "UTC"
        }),
        ("resume_after_confirmation", lambda a: engine.resume_after_confirmation(**a), {
            "token": token, "decision": "decline", "approver": "dana", "reason": "r"
        }),
        ("resume_by_run", lambda a: engine.web.resume_by_run(**a), {
            **by_run, "decision": "approve", "shown_digest": None, "arguments": {"item": "c"}
        }),
        ("decide_calls", lambda a: engine.decide_calls(**a), {
            "run_id": run_id, "approver": "dana", "decisions": decisions
        }),
        ("preview_approval", lambda a: engine.preview_approval(**a), {
            "token": token, "approver": "dana", "arguments": {"item": "c"}
        }),
        ("preview_by_run", lambda a: engine.web.preview_by_run(**a), {
            **by_run, "arguments": {"item": "c"}
        }),
        ("request_of_run", lambda a: engine.web.request_of_run(**a), by_run),
        ("continue_run", lambda a: engine.continue_run(**a), {
            "run_id": halted, "user": "dana", "why": "w"
        }),
        ("cancel_run", lambda a: engine.cancel_run(**a), {"run_id": halted, "user": "dana"}),
        ("fork_run", lambda a: engine.fork_run(**a), {
            "run_id": halted, "user": "dana", "at_step": 1
        }),
        ("move_run", lambda a: engine.operator.move_run(**a), {
            "run_id": halted, "to_version": "v9", "user": "dana"
        }),
        ("list_runs", lambda a: engine.list_runs(**a), {"user": "dana"}),
        ("list_threads", lambda a: engine.list_threads(**a), {"user": "dana"}),
        ("list_schedules", lambda a: engine.list_schedules(**a), {"user": "dana"}),
        ("get_thread", lambda a: engine.get_thread(**a), {"thread_id": thread, "user": "dana"}),
        ("delete_thread", lambda a: engine.delete_thread(**a), {
            "thread_id": thread, "user": "miguel"
        }),
        ("delete_schedule", lambda a: engine.delete_schedule(**a), {
            "schedule_id": schedule, "user": "miguel"
        }),
        ("runs_page", lambda a: engine.list_runs(**a), {"user": "dana", "state": "halted"}),
    ]  # fmt: skip


async def test_every_engine_method_refuses_a_nul_in_any_argument_and_changes_nothing(
    db_url: str,
) -> None:
    async with serving(db_url) as api:
        engine = api.engine
        run_id, token = await api.suspended()
        run = (await engine.get_run(run_id)).run
        assert run.pending is not None
        halted = await api.start(limits={"max_steps": 1})
        await engine.run_until_stop(halted)
        schedule = (await engine.add_schedule("dana", "@daily", "q")).id
        calls = engine_calls(
            engine, run_id, token, run.pending.tool_call_id, run.thread_id, halted, schedule
        )
        before = await everything(engine)
        for name, method, arguments in calls:
            for argument, value in arguments.items():
                for where, changed in with_nul(value, (argument,)):
                    with pytest.raises(InvalidInput, match="NUL") as refused_:
                        await method({**arguments, argument: changed})
                    assert refused_.value.code == "invalid_input", (name, where)
                    assert await everything(engine) == before, (name, where)
        assert (await api.decide(token)).status_code == 200  # the token was never used


INBOX_FORMS = [
    ("/runs/RUN/decision", {"decision": "decline", "tool_call_id": "CALL", "reason": "r"}),
    ("/runs/RUN/decision", {"decision": "approve", "tool_call_id": "CALL", "digest": "D"}),
    (
        "/runs/RUN/decision",
        {"decision": "approve", "tool_call_id": "CALL", "arguments": '{"item": "c"}'},
    ),
    ("/approve/TOKEN", {"decision": "decline", "reason": "r"}),
    ("/approve/TOKEN/preview", {"arg.item": "c"}),
    ("/runs/RUN/preview", {"tool_call_id": "CALL", "digest": "D", "arg.item": "c"}),
    (
        "/runs/RUN/decisions",
        {"all": "each", "call.0": "CALL", "decision.0": "decline", "digest.0": "D"},
    ),
    ("/runs/HALTED/continue", {"reason": "r"}),
    ("/runs/HALTED/fork", {"at_step": "1"}),
    ("/runs/HALTED/follow-up", {"question": "q"}),
    ("/runs/RUN/cancel", {}),
    ("/logout", {}),
]


async def test_a_nul_in_any_field_of_the_inboxs_forms_is_refused_and_changes_nothing(
    db_url: str,
) -> None:
    inbox = await web(db_url)
    try:
        run_id, token = await inbox.suspended()
        run = await inbox.run(run_id)
        assert run.pending is not None
        call, digest = run.pending.tool_call_id, run.pending.digest or ""
        halted = (await inbox.engine.start_run("dana", "send c", limits={"max_steps": 1})).id
        await inbox.engine.run_until_stop(halted)
        names = {"RUN": run_id, "TOKEN": token, "HALTED": halted, "CALL": call, "D": digest}
        async with inbox.client() as client:
            await sign_in(client, inbox.keys["dana"])
            csrf = await session_csrf(client)
            before = await everything(inbox.engine)
            for template, form in INBOX_FORMS:
                path = "/".join(names.get(part, part) for part in template.split("/"))
                filled = {k: names.get(v, v) for k, v in form.items()}
                for key in [*filled, "csrf"]:
                    posted = {**filled, "csrf": csrf}
                    posted[key] += NUL
                    response = await client.post(path, data=posted)
                    assert response.status_code == 422, (path, key, response.text[:300])
                    assert "must not contain NUL" in response.text, (path, key)
                    assert await everything(inbox.engine) == before, (path, key)
        async with inbox.client() as client:  # signing in
            for key in ("key", "dev_user", "next"):
                form = {"key": inbox.keys["eve"], "next": "/"}
                form["csrf"] = csrf_of((await client.get("/login")).text)
                form[key] = form.get(key, "") + NUL
                response = await client.post("/login", data=form)
                assert response.status_code == 422, (key, response.text[:300])
                assert "tether_session" not in response.cookies
        assert (await inbox.run(run_id)).state.value == "suspended"
    finally:
        inbox.close()


async def test_an_escaped_nul_is_refused_but_its_text_is_kept_as_sent(db_url: str) -> None:
    """``"\\u0000"`` in JSON is a NUL; ``"\\\\u0000"`` is six characters anyone may send."""
    async with serving(db_url) as api:
        raw = b'{"question": "what does \\\\u0000 mean?"}'
        response = await api.client.post(
            "/v1/runs", content=raw, headers={**DANA, "Content-Type": "application/json"}
        )
        assert response.status_code == 202, response.text
        stored = await api.run(response.json()["id"])
        assert stored["question"] == "what does \\u0000 mean?"
        escaped = raw.replace(b"\\\\u0000", b"\\u0000")
        response = await api.client.post(
            "/v1/runs", content=escaped, headers={**DANA, "Content-Type": "application/json"}
        )
        refused(response, 422, "invalid_input")
