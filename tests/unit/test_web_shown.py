"""What the inbox's pages say, without a server (``tether.api.web``): stored values with
every hidden character escaped and marked (and none left anywhere in a template's
output), the edit form's hidden characters read back as shown or as typed, a run's state
in words, the timeline's sentences, and the API's documentation page's types."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import agents
import pytest
from markupsafe import Markup

from tether.api.web import templates
from tether.api.web.apidocs import type_of
from tether.api.web.forms import edit_fields, read_edits
from tether.api.web.shown import finalize, json_text, ticks, visible
from tether.api.web.status import state_note
from tether.api.web.timeline import SAYINGS, line
from tether.budget import Budget, Limits
from tether.results import LiveEvent
from tether.runs import Run, RunState
from tether.visible import has_hidden

SPOOF = "acct-1234\u202e9876-tcca"


def test_visible_escapes_markup_and_marks_each_hidden_character() -> None:
    shown = visible(f"<b>{SPOOF}</b>")
    assert shown == Markup(
        "&lt;b&gt;acct-1234"
        '<span class="hidden-char" title="hidden character U+202E RIGHT-TO-LEFT OVERRIDE, '
        'shown escaped">\\u202e</span>9876-tcca&lt;/b&gt;'
    )
    assert visible(None) == "—" and visible({"k": 1}) == "{&#34;k&#34;: 1}"
    assert "\\U000e0041" in visible("tag\U000e0041") and not has_hidden(str(visible("\u200b")))
    assert visible("a \\u202e typed") == "a \\u202e typed"  # a literal backslash is not marked


def test_no_template_output_holds_a_hidden_character_even_in_an_attribute() -> None:
    assert finalize(SPOOF) == "acct-1234\\u202e9876-tcca"
    assert finalize(Markup("<i>x</i>")) == Markup("<i>x</i>") and finalize(3) == 3
    rendered = templates.env.from_string(
        '<input value="{{ v }}"><p>{{ v | truncate(50) }}</p>{{ v | visible }}'
    ).render(v=SPOOF)
    assert not has_hidden(rendered)
    assert rendered.count('class="hidden-char"') == 1  # only where the filter marks it


def test_json_text_escapes_hidden_characters_and_reads_back_exactly() -> None:
    value = {"account": SPOOF, "tag": "x\U000e0041", "plain": "é"}
    text = json_text(value, indent=2)
    assert not has_hidden(text) and "é" in text and "\\udb40\\udc41" in text
    assert json.loads(text) == value


def test_ticks_writes_code_spans_and_still_marks_hidden_characters() -> None:
    assert ticks("use `GET /v1/runs` <now>") == Markup("use <code>GET /v1/runs</code> &lt;now&gt;")
    assert ticks("odd ` tick") == "odd ` tick"
    assert 'class="hidden-char"' in ticks(f"`{SPOOF}`")


def test_an_edit_field_with_hidden_characters_is_shown_escaped_and_kept_only_as_shown() -> None:
    parameters = agents.ship.spec().parameters
    asked = {"sku": SPOOF, "quantity": 3, "labels": [SPOOF]}
    fields = {f.name: f for f in edit_fields(parameters, asked)}
    assert fields["sku"].hidden and fields["sku"].value == "acct-1234\\u202e9876-tcca"
    assert fields["labels"].hidden and not has_hidden(fields["labels"].value)
    assert not fields["quantity"].hidden
    posted = {"arg.sku": fields["sku"].value, "arg.quantity": "4"}
    posted["arg.labels"] = fields["labels"].value
    # Left as shown: the value as asked (the JSON field's escape is the very character).
    assert read_edits(parameters, posted, asked)["sku"] == SPOOF
    assert read_edits(parameters, posted, asked)["labels"] == [SPOOF]
    # Typed over: as typed, the escape is text; without the asked value, also as typed.
    typed = {**posted, "arg.sku": "acct-1234\\u202e9876"}
    assert read_edits(parameters, typed, asked)["sku"] == "acct-1234\\u202e9876"
    assert read_edits(parameters, posted)["sku"] == "acct-1234\\u202e9876-tcca"
    # Text pasted with a hidden character is shown escaped when the form comes back.
    again = {f.name: f for f in edit_fields(parameters, {}, submitted={"arg.sku": SPOOF})}
    assert again["sku"].hidden and not has_hidden(again["sku"].value)


def _run(state: RunState, **fields: Any) -> Run:
    row = {
        "id": "r1",
        "user_id": "dana",
        "question": "q",
        "route": {},
        "state": state,
        "step": 1,
        "limits": Limits(),
        "budget": Budget(),
        "scope_snapshot": {},
        "scope_resolved_at": 0.0,
        "pending": None,
        "pending_token_hash": None,
        "suspended_at": None,
        "expires_at": None,
        "halt_reason": None,
        "fail_reason": None,
        "recovery_attempts": 0,
        "model_failures": 0,
        "owner": None,
        "lease_epoch": 0,
        "heartbeat_at": None,
        "versions": {},
        "message_count": 0,
        "started_at": 0.0,
        "updated_at": 0.0,
    }
    return Run(**{**row, **fields})


def test_a_run_s_state_reads_as_what_it_is() -> None:
    now = 1_000.0
    later = _run(RunState.QUEUED, start_at=now + 60)
    assert state_note(later, now) == "starts at 1970-01-01 00:17:40 UTC"
    behind = _run(RunState.QUEUED, thread_pos=2)
    assert state_note(behind, now) == "after the runs before it in its thread have stopped"
    assert state_note(_run(RunState.QUEUED, start_at=now - 1), now) == "waits for a worker"
    halted = _run(RunState.HALTED, halt_reason="max_steps")
    assert state_note(halted, now) == "it reached its step limit (max_steps)"
    # Cancelled after a halt: by whom, never the halt's reason.
    cancelled = replace(halted, state=RunState.CANCELLED)
    assert state_note(cancelled, now, by="dana") == "by dana"
    assert state_note(cancelled, now) == ""
    assert state_note(_run(RunState.FAILED, fail_reason="error"), now).endswith("(error)")
    assert state_note(_run(RunState.RUNNING, owner="w1"), now) == "a worker carries it"


def _event(kind: str, data: dict[str, Any]) -> LiveEvent:
    return LiveEvent(id=1, seq=1, run_id="r1", at=0.0, kind=kind, data=data)


@pytest.mark.parametrize("kind", sorted(SAYINGS))
def test_every_known_event_reads_as_a_sentence_with_its_raw_data_kept(kind: str) -> None:
    data = {"by": "boss", "step": 2, "tool": "send", "reason": "max_steps", "user_id": "dana"}
    said = line(_event(kind, data))
    assert said.what and "{" not in said.what and "_" not in said.what.split(" ")[0]
    assert json.loads(said.raw) == data


def test_the_timeline_names_who_and_how_much() -> None:
    created = line(_event("created", {"user_id": "dana", "limits": Limits().to_json()}))
    assert created.what == "Asked by dana" and created.figures[0].startswith("limits: 20 steps")
    turn = line(
        _event(
            "model_turn",
            {
                "step": 1,
                "text": "hi",
                "tool_calls": ["send"],
                "input_tokens": 1000,
                "output_tokens": 100,
                "spend_usd": 0.0014,
            },
        )
    )
    assert turn.what == "Model turn 1: asked for send" and turn.text == "hi"
    assert turn.figures == ("1,000 tokens in, 100 tokens out", "$0.0014")
    # The model of a list that wrote the turn (reference §21).
    named = line(_event("model_turn", {"step": 2, "model": "gemini:gemini-2.5-flash"}))
    assert named.what == "Model turn 2: answered"
    assert named.figures[0] == "by gemini:gemini-2.5-flash"
    assert line(_event("approved", {"by": "boss", "reason": "ok"})).what == "Approved by boss"
    counted = line(_event("approval_recorded", {"by": "ann", "approvals": 1, "quorum": 2}))
    assert counted.what == "Approval recorded by ann" and counted.figures == ("1 of 2 approvals",)
    sent = line(_event("escalated", {"tool": "page", "escalate_to": ["group:oncall", "lead"]}))
    assert sent.what == "Escalated page to group oncall, lead"
    odd = line(_event("something_new", {"count": 3, "nested": {"a": 1}}))
    assert odd.what == "Something new" and odd.figures == ("count: 3",)


def test_the_docs_page_writes_schema_types_briefly() -> None:
    assert type_of({"$ref": "#/components/schemas/RunOut"}) == "RunOut"
    assert type_of({"anyOf": [{"type": "integer"}, {"type": "null"}]}) == "integer | null"
    assert type_of({"type": "array", "items": {"type": "string"}}) == "[string]"
    assert type_of({"enum": ["a", "b"]}) == '"a" | "b"'
