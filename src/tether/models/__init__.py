"""Model adapters behind one abstract call, and the ``TETHER_MODEL`` factory."""

from __future__ import annotations

from tether.errors import ConfigError
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.models.scripted import ScriptedModel

__all__ = ["Message", "Model", "ModelResponse", "ScriptedModel", "ToolSpec", "Usage", "from_spec"]


def from_spec(spec: str) -> Model:
    """A model from ``scripted:PATH.json``, ``openai:MODEL`` or ``anthropic:MODEL``. The
    SDK adapters find their credentials and base URL (``OPENAI_BASE_URL``, ...) themselves,
    in ``models.sdk.sdk_credentials``."""
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ConfigError(
            "TETHER_MODEL must be scripted:PATH.json, openai:MODEL or anthropic:MODEL, "
            f"got {spec!r}"
        )
    if kind == "scripted":
        return ScriptedModel.from_file(rest)
    if kind == "openai":
        from tether.models.openai import OpenAIChatModel

        return OpenAIChatModel(rest)
    if kind == "anthropic":
        from tether.models.anthropic import AnthropicModel

        return AnthropicModel(rest)
    raise ConfigError(f"unknown model kind {kind!r} in TETHER_MODEL={spec!r}")
