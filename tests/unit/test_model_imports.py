"""The provider SDKs are imported only by the adapter that uses them.

Each case runs in a fresh interpreter, as the test process itself has imported every SDK
long before (the adapter tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import json, sys
def loaded():
    return {sdk: sdk in sys.modules for sdk in ("openai", "anthropic", "google.genai")}
import tether.models
after_import = loaded()
tether.models.from_spec(sys.argv[1])
print(json.dumps([after_import, loaded()]))
"""
NONE = {"openai": False, "anthropic": False, "google.genai": False}


def imported_sdks(spec: str) -> list[dict[str, bool]]:
    """Which SDKs a new interpreter has imported after ``import tether.models``, and after
    ``from_spec(spec)`` too."""
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-test",
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "GEMINI_API_KEY": "gm-test",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, spec],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: list[dict[str, bool]] = json.loads(done.stdout)
    return result


def test_tether_models_and_a_scripted_model_import_no_sdk(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"content": "done"}]}))
    assert imported_sdks(f"scripted:{script}") == [NONE, NONE]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("openai:gpt-4o-mini", {**NONE, "openai": True}),
        ("anthropic:claude-haiku-4-5", {**NONE, "anthropic": True}),
        ("gemini:gemini-2.5-flash", {**NONE, "google.genai": True}),
    ],
)
def test_an_sdk_model_imports_its_own_sdk_only(spec: str, expected: dict[str, bool]) -> None:
    """Also shows the probe does see an SDK once one is imported."""
    assert imported_sdks(spec) == [NONE, expected]
