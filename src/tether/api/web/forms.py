"""The edit form of a pending call, generated from its tool's JSON schema (reference §9), and its
posted fields read back into arguments. Plain HTML controls, no scripts: a string is a text
input, an integer or number a number input, a boolean a checkbox, an enum a select, and
anything else a JSON textarea. The engine validates what comes back; this module only
turns form text into JSON values, with the one bounded JSON reader of ``tether.inputs``.

A control never holds a hidden character (reference §6): a value holding one is shown with
it escaped (``\u202e``; in a JSON field as a JSON escape, which reads back as the very
character) and flagged. A text field posted back exactly as it was shown keeps the value as
asked, hidden characters included (the approver saw them, escaped); any other text is taken
as typed, so an escape typed or left in edited text is those characters, never a hidden one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether import inputs, visible
from tether.api.web.shown import json_text
from tether.errors import InvalidInput

# Posted edit fields are named ``arg.NAME``, apart from the form's own fields.
PREFIX = "arg."


@dataclass(frozen=True, kw_only=True)
class EditField:
    """One argument as a form control, pre-filled with its value as text."""

    name: str
    label: str
    kind: str  # "text" | "number" | "checkbox" | "select" | "json"
    value: str
    checked: bool = False
    choices: tuple[Any, ...] = ()  # an enum's values
    required: bool = False
    nullable: bool = False
    step: str = "any"
    description: str = ""
    # The value holds hidden characters, shown escaped in ``value``.
    hidden: bool = False

    @property
    def input_name(self) -> str:
        return PREFIX + self.name

    @property
    def options(self) -> tuple[str, ...]:
        """An enum's values as the select's options show and post them."""
        return tuple(_as_text(choice) for choice in self.choices)


def _as_text(value: Any) -> str:
    """A JSON value as a control shows it: strings as they are (hidden characters
    escaped), the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return visible.escape(value)
    return json_text(value)


def _resolve(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """A property's schema with a local ``$ref`` followed and ``X | None`` unwrapped to X;
    and whether null is allowed."""
    resolved = dict(prop)
    ref = resolved.pop("$ref", None)
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved = {**defs.get(ref.removeprefix("#/$defs/"), {}), **resolved}
    choices = resolved.get("anyOf")
    if isinstance(choices, list) and len(choices) == 2:
        others = [c for c in choices if not (isinstance(c, Mapping) and c.get("type") == "null")]
        if len(others) == 1 and isinstance(others[0], Mapping):
            inner, _ = _resolve(others[0], defs)
            rest = {k: v for k, v in resolved.items() if k != "anyOf"}
            return {**inner, **rest}, True
    return resolved, False


def _kind(schema: Mapping[str, Any]) -> str:
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "select"
    return {
        "string": "text",
        "integer": "number",
        "number": "number",
        "boolean": "checkbox",
    }.get(str(schema.get("type")), "json")


def _shown(kind: str, value: Any) -> str:
    if kind == "json":
        return "" if value is None else json_text(value, indent=2)
    return _as_text(value)


def edit_fields(
    parameters: Mapping[str, Any],
    arguments: Mapping[str, Any],
    submitted: Mapping[str, Any] | None = None,
) -> tuple[EditField, ...]:
    """The controls of a tool's ``parameters`` schema, pre-filled with ``arguments`` (or,
    after an edit that did not validate, with the text the user ``submitted``)."""
    props = parameters.get("properties")
    if not isinstance(props, Mapping):
        return ()
    defs = parameters.get("$defs") or {}
    required = set(parameters.get("required") or ())
    fields = []
    for name, prop in props.items():
        schema, nullable = _resolve(prop if isinstance(prop, Mapping) else {}, defs)
        kind = _kind(schema)
        value = arguments.get(name, schema.get("default"))
        text, checked, hidden = _shown(kind, value), value is True, visible.has_hidden(value)
        if submitted is not None:
            raw = submitted.get(PREFIX + name)
            text, checked = (raw if isinstance(raw, str) else ""), raw is not None
            hidden = visible.has_hidden(text)
            text = visible.escape(text)
        fields.append(
            EditField(
                name=str(name),
                label=str(schema.get("title") or name),
                kind=kind,
                value=text,
                checked=checked,
                choices=tuple(schema.get("enum") or ()),
                required=name in required,
                nullable=nullable,
                step="1" if schema.get("type") == "integer" else "any",
                description=str(schema.get("description") or ""),
                hidden=hidden,
            )
        )
    return tuple(fields)


def read_edits(
    parameters: Mapping[str, Any],
    form: Mapping[str, Any],
    asked: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The arguments an edit form posted, as JSON values; text that cannot be read as its
    control's type is passed on as text, so validation says what is wrong with it. A text
    or select field whose ``asked`` value holds hidden characters, posted exactly as it was
    shown, is that value. ``InvalidInput`` for a JSON field that is not JSON."""
    edited: dict[str, Any] = {}
    asked = asked or {}
    shown = {f.name: f for f in edit_fields(parameters, asked)}
    for field in edit_fields(parameters, {}):
        raw = form.get(field.input_name)
        was = shown[field.name]
        if was.hidden and field.name in asked and field.kind in ("text", "select"):
            if raw == was.value:
                edited[field.name] = asked[field.name]  # left as shown: as asked
                continue
        if field.kind == "checkbox":
            edited[field.name] = raw is not None
            continue
        text = raw if isinstance(raw, str) else ""
        if field.kind != "text" and not text.strip():
            if field.nullable:
                edited[field.name] = None
            elif field.required:
                edited[field.name] = text  # refused by validation, with the field's name
            continue
        edited[field.name] = _read(field, text)
    return edited


def _read(field: EditField, text: str) -> Any:
    if field.kind == "text":
        return None if field.nullable and not text else text
    if field.kind == "select":
        return next((c for c in field.choices if _as_text(c) == text), text)
    try:
        value = inputs.json_value(text, field.label)
    except InvalidInput:
        if field.kind == "json":
            raise  # not JSON, or too long or too deep: said with the field's name
        return text
    if field.kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        return text
    return value
