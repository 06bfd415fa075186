"""``tether.models.from_spec``: the one parser of ``TETHER_MODEL``, public for Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import Agent, Engine
from tether.errors import ConfigError
from tether.models import ScriptedModel, from_spec


@pytest.mark.parametrize("spec", ["gpt-4.1", "openai:", ":gpt-4.1", "foo:bar", "OpenAI:gpt-4.1"])
def test_a_malformed_spec_is_a_config_error_that_says_the_forms_a_spec_takes(spec: str) -> None:
    with pytest.raises(ConfigError) as refused:
        from_spec(spec)
    assert refused.value.code == "invalid_config"
    forms = "scripted:PATH.json, openai:MODEL, anthropic:MODEL or gemini:MODEL"
    assert forms in refused.value.message
    assert repr(spec) in refused.value.message


def test_a_spec_builds_the_model_it_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert from_spec("openai:gpt-4.1").name == "openai:gpt-4.1"
    script = tmp_path / "turns.json"
    script.write_text('{"turns": [{"content": "hello"}]}')
    assert isinstance(from_spec(f"scripted:{script}"), ScriptedModel)


def test_from_spec_is_public_in_tether_models() -> None:
    import tether.models

    assert "from_spec" in tether.models.__all__


def test_engine_from_env_takes_the_model_tether_model_names_else_the_agents(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "turns.json"
    script.write_text('{"model": "from-env", "turns": [{"content": "hello"}]}')
    monkeypatch.setenv("TETHER_DATABASE_URL", f"sqlite:///{tmp_path / 'tether.db'}")
    monkeypatch.setenv("TETHER_MODEL", f"scripted:{script}")
    plain = Agent(name="plain", system_prompt="Answer.")
    engine = Engine.from_env(agent=plain, migrate=True)
    assert engine.sync.ask("dana", "hi").answer == "hello"
    engine.close()

    monkeypatch.delenv("TETHER_MODEL")
    own_turns = [{"content": "its own"}]
    own = Agent(name="own", system_prompt="Answer.", default_model=lambda: ScriptedModel(own_turns))
    engine = Engine.from_env(agent=own, migrate=True)
    assert engine.sync.ask("dana", "hi").answer == "its own"
    engine.close()
    with pytest.raises(ConfigError, match="TETHER_MODEL"):
        Engine.from_env(agent=plain)
