"""The inbox's pages without a server (``tether.api.web``): a preview's nested rows render as
a table, and an edit form's fields come from the tool's schema and read back as JSON values.
The pages served are tests/integration/test_web.py."""

from __future__ import annotations

import json
import re

import agents
import pytest

from tether.api.web import templates
from tether.api.web.forms import edit_fields, read_edits
from tether.api.web.turns import read_decisions
from tether.errors import InvalidInput


def test_a_preview_with_lines_renders_them_as_a_nested_table() -> None:
    preview = {
        "quote_id": "Q-1",
        "lines": [
            {"sku": "SKU-4411", "quantity": 200, "unit_price": 12.5},
            {"sku": "<b>x</b>", "quantity": 1},
        ],
        "discount_pct": 5,
        "total": None,
    }
    rendered = templates.env.from_string(
        '{% from "macros.html" import value %}{{ value(p) }}'
    ).render(p=preview)
    compact = re.sub(r">\s+<", "><", rendered)
    assert '<th scope="row">lines</th><td><table class="rows">' in compact
    assert (
        '<thead><tr><th scope="col">sku</th><th scope="col">quantity</th>'
        '<th scope="col">unit_price</th></tr></thead>'
    ) in compact
    assert "<td>SKU-4411</td><td>200</td><td>12.5</td>" in compact
    assert "<td>&lt;b&gt;x&lt;/b&gt;</td><td>1</td><td>—</td>" in compact
    assert '<th scope="row">total</th><td>—</td>' in compact


def test_edit_fields_read_back_as_json_values_and_leave_bad_text_to_validation() -> None:
    parameters = agents.ship.spec().parameters
    fields = {f.name: f for f in edit_fields(parameters, {"sku": "A", "labels": ["x"]})}
    assert {name: f.kind for name, f in fields.items()} == {
        "sku": "text",
        "quantity": "number",
        "rush": "checkbox",
        "speed": "select",
        "weight": "number",
        "labels": "json",
    }
    assert fields["speed"].value == "ground" and fields["weight"].value == "1.5"  # defaults
    assert json.loads(fields["labels"].value) == ["x"] and fields["labels"].nullable
    assert fields["quantity"].required and not fields["rush"].required
    read = read_edits(
        parameters,
        {"arg.sku": "B", "arg.quantity": "7", "arg.speed": "air", "arg.labels": ""},
    )
    assert read == {"sku": "B", "quantity": 7, "rush": False, "speed": "air", "labels": None}
    loose = read_edits(parameters, {"arg.quantity": "seven", "arg.weight": "NaN"})
    assert loose["quantity"] == "seven" and loose["weight"] == "NaN"  # validation refuses
    with pytest.raises(InvalidInput, match="not valid JSON"):
        read_edits(parameters, {"arg.labels": "[NaN]"})


def test_a_decide_all_form_reads_back_as_the_decisions_it_chose() -> None:
    calls = {"call.0": "c0", "digest.0": "d" * 64, "call.1": "c1", "digest.1": "e" * 64}
    assert read_decisions({**calls, "all": "decline", "reason": " no\r\nthanks "}) == [
        {"tool_call_id": "c0", "decision": "decline", "reason": "no\nthanks"},
        {"tool_call_id": "c1", "decision": "decline", "reason": "no\nthanks"},
    ]
    # An approval carries the digest the page showed; a call left empty is left for now.
    chosen = {**calls, "all": "each", "decision.0": "", "decision.1": "approve"}
    assert read_decisions(chosen) == [
        {"tool_call_id": "c1", "decision": "approve", "digest": "e" * 64}
    ]
    # The calls are read in order up to the first gap, never past it.
    gap = {"call.0": "c0", "call.2": "c2", "all": "approve"}
    assert [e["tool_call_id"] for e in read_decisions(gap)] == ["c0"]
    for refused in (
        {**calls, "all": "each"},  # nothing chosen
        {**calls, "all": "maybe"},
        {**calls},
        {"all": "approve"},
    ):
        with pytest.raises(InvalidInput):
            read_decisions(refused)
