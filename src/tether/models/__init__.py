"""Model adapters behind one abstract call, and the ``TETHER_MODEL`` factory."""

from __future__ import annotations

from tether.errors import ConfigError
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.models.fallback import Entry, ModelList, parse_list
from tether.models.scripted import ScriptedModel

__all__ = [
    "Entry",
    "Message",
    "Model",
    "ModelList",
    "ModelResponse",
    "ScriptedModel",
    "ToolSpec",
    "Usage",
    "from_spec",
]


# What a model spec may be; said by every refusal of one.
_SPECS = "scripted:PATH.json, openai:MODEL, anthropic:MODEL or gemini:MODEL"


def from_spec(spec: str) -> Model:
    """A model from ``scripted:PATH.json``, ``openai:MODEL``, ``anthropic:MODEL`` or
    ``gemini:MODEL``, or a list of them to fall back on joined by ``|`` (a ``ModelList``,
    reference §21): the one parser of ``TETHER_MODEL``, for Python as for the CLI
    (``Engine(agent=..., model=from_spec("openai:gpt-4.1"))``). The SDK adapters find their
    credentials and base URL (``OPENAI_BASE_URL``, ...) themselves, in
    ``models.sdk.sdk_credentials``. A malformed spec is a ``ConfigError`` that says the
    forms a spec may take."""
    if not isinstance(spec, str):
        raise ConfigError(f"a model spec (TETHER_MODEL) must be {_SPECS}, got {spec!r}")
    return parse_list(spec, _one)


def _one(spec: str) -> Model:
    """The model of one entry of a spec."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(f"a model spec (TETHER_MODEL) must be {_SPECS}, got {spec!r}")
    if kind == "scripted":
        return ScriptedModel.from_file(rest)
    if kind == "openai":
        from tether.models.openai import OpenAIChatModel

        return OpenAIChatModel(rest)
    if kind == "anthropic":
        from tether.models.anthropic import AnthropicModel

        return AnthropicModel(rest)
    if kind == "gemini":
        from tether.models.gemini import GeminiModel

        return GeminiModel(rest)
    raise ConfigError(f"unknown model kind {kind!r} in {spec!r}: a model spec must be {_SPECS}")
