"""``tether.mcp`` against a real MCP server (tests/support/mcp_server.py) over stdio and
streamable HTTP: the mapping of annotations, overrides, argument validation, results and
errors, and runs that read, suspend on a destructive write and run it once approved."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import agents
import mcp_agent
import mcp_server
import processes
import pytest
from waiting import until

from tether import Agent, Engine, Scope, ScriptedModel, StopKind, ToolContext
from tether.config import Settings
from tether.errors import ConfigError
from tether.mcp import HttpServer, Override, Server, connect, serving
from tether.notify import MemoryNotifier
from tether.store import idempotency_key
from tether.tools.tool import Effect, InvalidToolArguments, OutcomeUnknown, Tool, ToolUnavailable


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    """The server's data file, seeded with one note."""
    db = tmp_path / "notes.db"
    mcp_server.seed(str(db), {"alpha": "first note"})
    return db


@pytest.fixture
def http_url(notes: Path, tmp_path: Path) -> Iterator[str]:
    with mcp_agent.http_server(notes, tmp_path / "mcp-http.log") as (url, _):
        yield url


def overrides(notes: Path) -> dict[str, Override]:
    return {**mcp_agent.SAFE, "delete_note": mcp_agent.reconcile_delete(notes)}


def by_name(tools: tuple[Tool, ...]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


def context(key: str = "run-1:call-1") -> ToolContext:
    run_id, _, call_id = key.partition(":")
    return ToolContext(
        run_id=run_id,
        user_id="dana",
        tool_call_id=call_id,
        idempotency_key=key,
        scope=Scope(user_id="dana"),
    )


@asynccontextmanager
async def engine_for(
    db_url: str, server: Server, turns: list[dict[str, Any]], notes: Path
) -> AsyncIterator[Engine]:
    """An engine serving an agent whose tools are the server's (its lifespan entered, as
    ``serve`` and ``worker`` enter it)."""
    agent = Agent(
        name="notes",
        system_prompt="You keep notes.",
        lifespan=serving(server, overrides=overrides(notes)),
    )
    async with agent.running() as served:
        engine = Engine(
            agent=served,
            model=ScriptedModel(turns),
            settings=Settings(database_url=db_url),
            notifier=MemoryNotifier(),
        )
        try:
            yield engine
        finally:
            await engine.aclose()


# -- the mapping ----------------------------------------------------------------------------


async def test_annotations_decide_effect_confirmation_and_dedupes(notes: Path) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        t = by_name(tools)
    assert set(t) == {"read_note", "delete_note", "add_note", "plain_write"}
    read, delete, add, plain = t["read_note"], t["delete_note"], t["add_note"], t["plain_write"]
    assert (read.effect, read.needs_confirmation, read.dedupes) == (Effect.READ, False, False)
    # destructiveHint true: a write a human confirms; no idempotentHint: no dedupes.
    assert (delete.effect, delete.needs_confirmation, delete.dedupes) == (Effect.WRITE, True, False)
    # idempotentHint true, destructiveHint false: a deduplicating write, no confirmation.
    assert (add.effect, add.needs_confirmation, add.dedupes) == (Effect.WRITE, False, True)
    # no annotations: MCP's defaults, a destructive write that is not idempotent.
    assert (plain.effect, plain.needs_confirmation, plain.dedupes) == (Effect.WRITE, True, False)
    assert read.description == "Read a note by its title."


async def test_the_model_sees_the_servers_input_schema(notes: Path) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        spec = by_name(tools)["add_note"].spec()
    assert spec.parameters["properties"] == {
        "title": {"title": "Title", "type": "string"},
        "body": {"title": "Body", "type": "string"},
    }
    assert spec.parameters["required"] == ["title", "body"]


async def test_a_write_without_idempotent_hint_is_refused_until_declared(notes: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        async with connect(mcp_agent.stdio(notes)):
            pytest.fail("connect yielded unsafe tools")
    message = refused.value.message
    assert refused.value.code == "unsafe_tool"
    for name in ("delete_note", "plain_write"):
        assert f'{{"{name}": {{"reconcile": FN}}}}' in message
    assert "accept_unreconcilable" in message
    assert "add_note" not in message and "read_note" not in message


async def test_an_override_naming_no_tool_is_a_config_error(notes: Path) -> None:
    bad: dict[str, Override] = {**overrides(notes), "delete_notes": {"accept_unreconcilable": True}}
    with pytest.raises(ConfigError, match=r"do not have: \['delete_notes'\]"):
        async with connect(mcp_agent.stdio(notes), overrides=bad):
            pytest.fail("connect yielded tools")


async def test_an_override_with_an_unknown_field_is_a_config_error(notes: Path) -> None:
    bad: dict[str, Any] = {**overrides(notes), "read_note": {"timeout": 5}}
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['timeout'\]"):
        async with connect(mcp_agent.stdio(notes), overrides=bad):
            pytest.fail("connect yielded tools")


async def test_overrides_replace_what_the_annotations_say(notes: Path) -> None:
    def preview(args: Any, scope: Scope) -> dict[str, Any]:
        return {"adding": args.title}

    chosen: dict[str, Override] = {
        **overrides(notes),
        "read_note": {"timeout_s": 5, "retries": 2, "description": "Look a note up."},
        "add_note": {"needs_confirmation": True, "preview": preview, "version": "7"},
        # Declared a read: it needs no confirmation, as a readOnlyHint would say.
        "delete_note": {"effect": "read"},
    }
    async with connect(mcp_agent.stdio(notes), overrides=chosen) as tools:
        t = by_name(tools)
        shown = await t["add_note"].render_preview(
            t["add_note"].validate({"title": "t", "body": "b"}), Scope(user_id="dana")
        )
    assert (t["read_note"].timeout_s, t["read_note"].retries) == (5, 2)
    assert t["read_note"].description == "Look a note up."
    assert t["add_note"].needs_confirmation is True and t["add_note"].version == "7"
    assert shown == {"adding": "t"}
    assert t["delete_note"].effect is Effect.READ and not t["delete_note"].may_confirm
    # Unless declared, a tool's version follows its definition on the server.
    assert t["plain_write"].version.startswith("mcp-") and len(t["plain_write"].version) == 16


async def test_only_an_idempotent_non_destructive_write_may_be_declared_concurrent(
    notes: Path,
) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        assert not any(t.concurrent for t in tools)  # never by default
    chosen: dict[str, Override] = {**overrides(notes), "add_note": {"concurrent": True}}
    async with connect(mcp_agent.stdio(notes), overrides=chosen) as tools:
        add = by_name(tools)["add_note"]
    assert add.concurrent is True and add.dedupes and not add.may_confirm
    for other in ("delete_note", "plain_write"):  # destructive, not idempotent
        refused: dict[str, Any] = {**overrides(notes)}
        refused[other] = {**refused.get(other, {}), "concurrent": True}
        with pytest.raises(ConfigError) as error:
            async with connect(mcp_agent.stdio(notes), overrides=refused):
                pytest.fail("connect yielded a concurrent destructive write")
        assert f"MCP tool override for {other}: concurrent=True is refused" in error.value.message
        assert "idempotentHint true and destructiveHint false" in error.value.message


async def test_two_servers_need_a_prefix_to_tell_their_tools_apart(
    notes: Path, http_url: str
) -> None:
    with pytest.raises(ConfigError, match="give a server a prefix"):
        async with connect(
            mcp_agent.stdio(notes), mcp_agent.http(http_url), overrides=overrides(notes)
        ):
            pytest.fail("connect yielded clashing tools")
    web = {f"web_{name}": o for name, o in overrides(notes).items()}
    async with connect(
        mcp_agent.stdio(notes),
        mcp_agent.http(http_url, prefix="web_"),
        overrides={**overrides(notes), **web},
    ) as tools:
        t = by_name(tools)
        answer = await t["web_read_note"].call(
            t["web_read_note"].validate({"title": "alpha"}), context()
        )
    assert {"read_note", "web_read_note", "web_delete_note"} <= set(t)
    assert answer == {"title": "alpha", "body": "first note"}
    # The prefix is tether's: the server is called by its own name.
    assert mcp_server.calls(str(notes))[-1][0] == "read_note"


async def test_an_http_server_is_sent_the_headers_it_is_given(notes: Path, http_url: str) -> None:
    server = HttpServer(url=http_url, headers={"Authorization": "Bearer sesame"})
    assert "sesame" not in repr(server)
    async with connect(server, overrides=overrides(notes)) as tools:
        read = by_name(tools)["read_note"]
        await read.call(read.validate({"title": "alpha"}), context())
    assert mcp_server.authorizations(str(notes)) == ["Bearer sesame"]


async def test_a_server_that_cannot_start_is_a_config_error(tmp_path: Path) -> None:
    missing = mcp_agent.stdio(tmp_path / "notes.db")
    broken = type(missing)(command=str(tmp_path / "no-such-server"))
    with pytest.raises(ConfigError, match="cannot connect to the MCP server"):
        async with connect(broken):
            pytest.fail("connect yielded tools")


# -- calls ----------------------------------------------------------------------------------


async def test_arguments_are_checked_against_the_input_schema_before_any_call(
    notes: Path,
) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        add = by_name(tools)["add_note"]
        with pytest.raises(InvalidToolArguments) as invalid:
            add.validate({"title": 3})
    assert "title: 3 is not of type 'string'" in invalid.value.message
    assert "'body' is a required property" in invalid.value.message
    assert mcp_server.calls(str(notes)) == []


async def test_results_errors_and_the_idempotency_key_in_meta(notes: Path) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        t = by_name(tools)
        added = await t["add_note"].call(
            t["add_note"].validate({"title": "beta", "body": "b"}), context("r:1")
        )
        again = await t["add_note"].call(
            t["add_note"].validate({"title": "beta", "body": "b"}), context("r:1")
        )
        text = await t["plain_write"].call(
            t["plain_write"].validate({"text": "hi"}), context("r:2")
        )
        with pytest.raises(Exception) as missing:
            await t["read_note"].call(t["read_note"].validate({"title": "nope"}), context())
    assert added == again == {"title": "beta", "notes": 2}
    assert mcp_server.effects(str(notes), "add_note") == [("add_note", "r:1")]
    assert [k for _, k, _ in mcp_server.calls(str(notes), "add_note")] == ["r:1", "r:1"]
    assert text == {"result": "hi"}  # the server's structured content
    # isError: a definite failure the model sees, not an ambiguous one.
    assert type(missing.value).__name__ == "ToolFailed"
    assert "there is no note 'nope'" in str(missing.value)


async def test_a_lost_connection_makes_a_write_unknown_and_a_read_unavailable(
    notes: Path, tmp_path: Path
) -> None:
    patient: dict[str, Override] = {**overrides(notes), "add_note": {"timeout_s": 0.5}}
    with mcp_agent.http_server(notes, tmp_path / "lost.log") as (url, proc):
        async with connect(mcp_agent.http(url), overrides=patient) as tools:
            t = by_name(tools)
            add, read = t["add_note"], t["read_note"]
            proc.kill()
            proc.wait(timeout=30)
            # Sent when the server died: it may have run.
            with pytest.raises(OutcomeUnknown):
                await add.call(add.validate({"title": "a", "body": "b"}), context("r:1"))
            # A read had no effect: unavailable, to be tried again.
            with pytest.raises(ToolUnavailable):
                await read.call(read.validate({"title": "a"}), context("r:2"))
            # A write waits for the connection as long as its timeout, then is reconciled.
            with pytest.raises(TimeoutError):
                await add.call(add.validate({"title": "a", "body": "b"}), context("r:3"))


async def test_a_stdio_server_that_died_is_started_again(notes: Path) -> None:
    async with connect(mcp_agent.stdio(notes), overrides=overrides(notes)) as tools:
        t = by_name(tools)
        with pytest.raises(OutcomeUnknown):
            await t["plain_write"].call(t["plain_write"].validate({"text": "die"}), context())
        read = t["read_note"]

        async def answered() -> Any:
            # A read waits only a moment for the server: while a loaded machine is still
            # starting it again, the read is refused as unavailable, which is no answer.
            try:
                return await read.call(read.validate({"title": "alpha"}), context())
            except ToolUnavailable:
                return None

        answer = await until(answered, timeout=60, what="a read from the restarted server")
    assert answer == {"title": "alpha", "body": "first note"}


# -- runs -----------------------------------------------------------------------------------


async def test_a_run_reads_suspends_on_the_destructive_write_and_runs_it_once_approved(
    db_url: str, notes: Path
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("read_note", title="alpha")]},
        {"tool_calls": [agents.call("delete_note", title="alpha")]},
        {"content": "deleted"},
    ]
    async with engine_for(db_url, mcp_agent.stdio(notes), turns, notes) as engine:
        outcome = await engine.ask("dana", "delete alpha")
        assert outcome.kind is StopKind.SUSPENDED
        suspended = (await engine.get_run(outcome.run_id)).run
        assert mcp_server.calls(str(notes), "delete_note") == []
        notice = engine.runner.services.notifier.last()  # type: ignore[attr-defined]
        await engine.resume_after_confirmation(notice.token, "approve", "dana")
        final = await engine.run_until_stop(outcome.run_id)
        view = await engine.get_run(outcome.run_id)
    assert final.kind is StopKind.ANSWERED
    assert suspended.pending is not None and suspended.pending.tool == "delete_note"
    call_id = next(m for m in view.messages if m.get("tool_calls"))
    delete_call = [m for m in view.messages if m.get("tool_calls")][1]["tool_calls"][0]
    assert call_id["tool_calls"][0]["function"]["name"] == "read_note"
    key = idempotency_key(outcome.run_id, delete_call["id"])
    assert mcp_server.calls(str(notes), "delete_note") == [("delete_note", key, {"title": "alpha"})]
    assert mcp_server.effects(str(notes), "delete_note") == [("delete_note", key)]
    results = [json.loads(m["content"]) for m in view.messages if m["role"] == "tool"]
    assert results[0] == {"title": "alpha", "body": "first note"}
    assert results[1] == {"result": "deleted 1 note(s) titled alpha"}


async def test_a_model_error_and_an_invalid_call_reach_the_model_and_nothing_runs(
    db_url: str, notes: Path
) -> None:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [agents.call("read_note", title="missing")]},
        {"tool_calls": [agents.call("add_note", title=7)]},
        {"content": "gave up"},
    ]
    async with engine_for(db_url, mcp_agent.stdio(notes), turns, notes) as engine:
        outcome = await engine.ask("dana", "try")
        view = await engine.get_run(outcome.run_id)
    assert outcome.kind is StopKind.ANSWERED
    results = [json.loads(m["content"]) for m in view.messages if m["role"] == "tool"]
    assert results[0]["error"] == "tool_error"
    assert "there is no note 'missing'" in results[0]["message"]
    assert results[1]["error"] == "invalid_arguments"
    assert mcp_server.calls(str(notes), "add_note") == []


async def test_a_run_over_streamable_http_writes_once_with_its_key(
    db_url: str, notes: Path, http_url: str
) -> None:
    turns = mcp_agent.SCRIPTS["add"]
    async with engine_for(db_url, mcp_agent.http(http_url), turns, notes) as engine:
        outcome = await engine.ask("dana", "add beta")
        view = await engine.get_run(outcome.run_id)
    assert outcome.kind is StopKind.ANSWERED
    add_call = [m for m in view.messages if m.get("tool_calls")][1]["tool_calls"][0]
    key = idempotency_key(outcome.run_id, add_call["id"])
    assert mcp_server.effects(str(notes), "add_note") == [("add_note", key)]
    assert [c[0] for c in mcp_server.calls(str(notes))] == ["read_note", "add_note"]


# -- the docs' example ----------------------------------------------------------------------


def test_the_docs_example_runs_as_written(tmp_path: Path) -> None:
    """docs/integrations.md's MCP example, saved as its two files and run."""
    page = (processes.ROOT / "docs" / "integrations.md").read_text()
    section = page.split("## MCP tools", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    files = {block.splitlines()[0].removeprefix("# "): block for block in blocks}
    assert set(files) == {"notes_server.py", "notes_agent.py"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    done = subprocess.run(
        [sys.executable, "notes_agent.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["suspended delete_note", "answered Done."]
