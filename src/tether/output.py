"""Typed output (reference §11): an agent's final answer validated against its ``output_type``.

The model learns the shape from the run's system message, which gets one sentence and the
JSON schema of ``output_type`` when the run starts (so it is stored with the messages, and
a resumed run shows the model exactly what it saw). A final answer is its text parsed as
JSON, or the first fenced block of it (models like to wrap JSON in ```json fences). An
answer that does not validate is not final: it is stored with a user message listing each
error (``loc: msg``) in one write, and the model is asked again; that was a step like any
other, so the run's budget bounds a model that keeps answering badly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from tether.errors import ConfigError
from tether.models.base import Message

# A fenced block, with or without a language tag (```json ... ```), anywhere in the text.
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)```", re.DOTALL)
# What the model is shown of a rejection: enough errors to fix it, not a page of them.
MAX_ERRORS = 20
MAX_MESSAGE_CHARS = 500


def check_output_type(output_type: Any, agent: str) -> None:
    """Refuse, when the agent is declared, an ``output_type`` that is not a pydantic model
    class, or whose JSON schema cannot be given to the model."""
    if output_type is None:
        return
    if not (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
        raise ConfigError(
            f"agent {agent}: output_type must be a pydantic BaseModel subclass (a class, "
            f"e.g. output_type=Quote), got {output_type!r}"
        )
    try:
        output_type.model_json_schema()
    except Exception as exc:  # pydantic raises several kinds; each means the same here
        raise ConfigError(
            f"agent {agent}: output_type {output_type.__name__} has no JSON schema to give "
            f"the model: {exc}"
        ) from exc


def instruction(output_type: type[BaseModel]) -> str:
    """What the system message gets appended: how to answer, and the schema."""
    schema = json.dumps(output_type.model_json_schema(), sort_keys=True)
    return (
        "Your final answer (a reply without tool calls) must be only a JSON value that "
        f"validates against this JSON schema, with no text around it:\n{schema}"
    )


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A final answer checked against the output type: the validated value, or the
    errors (``loc`` and ``msg`` each) that the model is sent back."""

    value: BaseModel | None = None
    errors: list[dict[str, str]] = field(default_factory=list)

    @property
    def stored(self) -> Any:
        """The validated value as stored in ``runs.output`` (None when there is none)."""
        return None if self.value is None else self.value.model_dump(mode="json")

    def feedback(self) -> Message:
        """The user message that sends the errors back to the model."""
        shown = [f"- {e['loc']}: {e['msg']}" for e in self.errors[:MAX_ERRORS]]
        if len(self.errors) > MAX_ERRORS:
            shown.append(f"- ... and {len(self.errors) - MAX_ERRORS} more")
        lines = "\n".join(shown)
        return {
            "role": "user",
            "content": (
                "Your final answer does not validate against the output schema given in the "
                f"system message:\n{lines}\nAnswer again with only the corrected JSON."
            ),
        }

    def event(self, step: int) -> dict[str, Any]:
        """The data of the ``output_invalid`` trace event."""
        return {"step": step, "errors": self.errors[:MAX_ERRORS], "count": len(self.errors)}


def check(output_type: type[BaseModel] | None, content: Any) -> Verdict:
    """Validate a final answer's text; without an output type every answer is valid."""
    if output_type is None:
        return Verdict()
    text = content if isinstance(content, str) else ""
    if not text.strip():
        return Verdict(errors=[{"loc": "(answer)", "msg": "the answer is empty"}])
    try:
        return Verdict(value=output_type.model_validate_json(_json_text(text)))
    except ValidationError as exc:
        return Verdict(errors=[_error(e) for e in exc.errors(include_url=False)])


def _json_text(text: str) -> str:
    """The answer's JSON: the whole text when it parses, else its first fenced block."""
    stripped = text.strip()
    try:
        json.loads(stripped)
    except ValueError:
        fenced = _FENCED.search(stripped)
        if fenced is not None:
            return fenced.group(1).strip()
    return stripped


def _error(error: Any) -> dict[str, str]:
    loc = ".".join(str(part) for part in error.get("loc", ())) or "(root)"
    return {"loc": loc, "msg": str(error.get("msg", ""))[:MAX_MESSAGE_CHARS]}
