"""The chaos soak (``benchmarks/chaos.py``) in small, as CI runs it: 30 demo runs on
PostgreSQL carried by two ``tether worker`` processes while random workers are SIGKILLed
and every connection to tether's database is terminated; its history checker must find
every invariant kept (exit 0, "PASS")."""

from __future__ import annotations

import importlib.util
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import processes
import pytest

CHAOS = processes.ROOT / "benchmarks" / "chaos.py"
# A guard against a hung soak, not a timing assertion: the soak takes well under this.
GUARD_S = 240


def test_a_small_chaos_soak_with_kills_and_dropped_connections_keeps_every_invariant(
    tmp_path: Path,
) -> None:
    command = [
        processes.PYTHON, str(CHAOS), "--runs", "30", "--workers", "2", "--seed", "20261130",
        "--kill-every-s", "5", "--min-kills", "2",
        "--db-fault-every-s", "3", "--min-db-faults", "2",
        "--deadline-s", "120", "--settle-s", "60", "--logs", str(tmp_path / "logs"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=processes.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the soak stops its processes, drops its database
        out, _ = proc.communicate(timeout=60)
        pytest.fail(f"the chaos soak did not finish within {GUARD_S}s:\n{out[-6000:]}")

    assert proc.returncode == 0, out[-6000:]
    assert out.rstrip().endswith("PASS"), out[-6000:]
    faults = re.search(r"faults: (\d+) worker kills, (\d+) DB-fault rounds", out)
    assert faults is not None, out[-6000:]
    assert int(faults[1]) >= 2 and int(faults[2]) >= 2, faults[0]
    assert "states: answered: 30" in out, out[-6000:]


# -- the checker itself: a soak that can only pass proves nothing ------------------------------


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _sample(chaos: ModuleType, sent: float, state: str, messages: list[str], steps: int) -> Any:
    consumed = {"steps": steps, "tool_calls": 0, "spend_usd": 0.0, "elapsed_ms": 0}
    return chaos.Sample(sent, sent + 1, state, [{"content": m} for m in messages], consumed)


def test_the_history_checker_flags_rewritten_messages_a_falling_budget_and_a_stuck_run() -> None:
    chaos = _chaos()
    track = chaos.Track("r1")
    track.samples = [
        _sample(chaos, 0, "running", ["a", "b"], 2),
        # Asked for before the first was answered, so it may have been served first.
        _sample(chaos, 0.5, "running", ["a"], 1),
        _sample(chaos, 10, "running", ["a", "x", "c"], 1),
    ]
    track.final = {"state": "suspended", "step": 4, "messages": []}
    tracks = {"r1": track}
    assert len(chaos.check_append_only(tracks)) == 1
    assert len(chaos.check_budgets(tracks)) == 1
    assert chaos.check_states(tracks) == ["run r1 left suspended at step 4"]

    track.samples = track.samples[:2]
    track.final = {"state": "answered", "step": 5, "messages": []}
    assert chaos.check_append_only(tracks) == chaos.check_budgets(tracks) == []
    assert chaos.check_states(tracks) == []


def test_the_effects_checker_flags_a_second_send_and_effects_the_ledger_denies() -> None:
    chaos = _chaos()
    made = [  # (key, action, quote): r1 also sends r2's draft; r3's send is denied below
        ("r1:call_2_0", "created", "Q-1"), ("r1:call_3_0", "sent", "Q-1"),
        ("r2:call_2_0", "created", "Q-2"), ("r1:call_9_0", "sent", "Q-2"),
        ("r3:call_2_0", "created", "Q-3"), ("r3:call_3_0", "sent", "Q-3"),
    ]  # fmt: skip
    effects = [chaos.Effect(*m) for m in made]
    quotes = [
        chaos.Quote(quote, "sent", created, sent)
        for (created, _, quote), (sent, _, _) in zip(made[::2], made[1::2], strict=True)
    ]
    tools = {"created": "draft_quote", "sent": "send_quote"}
    entries = [
        chaos.Entry(key, key[:2], tools[action], "write", "error" if key == "r3:call_3_0" else "ok")
        for key, action, _ in made
        if key != "r1:call_9_0"  # no intent was written for it
    ]
    assert chaos.check_sandbox_once(effects, quotes) == ["run r1 sent 2 quotes"]
    assert chaos.check_ledger(effects, entries, []) == [
        "effect r1:call_9_0 (sent) has no ledger entry",
        "r3:call_3_0: the ledger says error, but it took effect",
    ]
    assert chaos.check_sandbox_once(effects[:2], quotes[:1]) == []
    assert chaos.check_ledger(effects[:2], entries[:2], []) == []
