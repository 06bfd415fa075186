"""docs/models.md's commands, run as written with the page's ``order_desk.py`` in the
working folder: without ``TETHER_MODEL`` the CLI takes the agent's ``default_model`` (a
model of one's own, reference §21), a worker carries the run to the answer the page
gives, in two steps, priced by ``TETHER_PRICES``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "models.md"
TETHER = Path(sys.executable).parent / "tether"  # the script the page's commands name


def page_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The command-line section's one ``sh`` block: what it exports, and the arguments of
    each ``tether`` command, in order."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("### From the command line", 1)[1]
    (block,) = re.findall(r"```sh\n(.*?)```\n", section, re.S)
    exported: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            exported[name] = value
        else:
            assert words[0] == "tether", line
            commands.append(words[1:])
    return exported, commands


def test_the_pages_commands_answer_with_the_agents_own_model(tmp_path: Path) -> None:
    (code,) = re.findall(r"```python\n(.*?)```\n", PAGE.read_text(encoding="utf-8"), re.S)
    (tmp_path / "order_desk.py").write_text(code, encoding="utf-8")
    exported, commands = page_commands()
    assert "TETHER_MODEL" not in exported
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(exported)
    assert [c[0] for c in commands] == ["migrate", "ask", "worker", "runs"]
    run_id = ""
    printed = []
    for args in commands:
        args = [run_id if word == "RUN_ID" else word for word in args]
        done = subprocess.run(
            [str(TETHER), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (args, done.stderr[-3000:])
        printed.append(done.stdout)
        if args[0] == "ask":
            run_id = json.loads(done.stdout)["id"]
    assert run_id
    shown = json.loads(printed[-1])
    assert shown["id"] == run_id and shown["state"] == "answered"
    assert shown["answer"] == "Order A-1001 is shipped with DHL, due 2025-03-14."
    consumed = shown["budget"]["consumed"]
    assert (consumed["steps"], consumed["tool_calls"], consumed["spend_usd"]) == (2, 1, 0.0)
    said = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert f'"answer": "{shown["answer"]}"' in said  # the answer the page says it prints
