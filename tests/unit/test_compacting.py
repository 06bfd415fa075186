"""Compaction's cut and view (reference §14): the cut keeps the last K turns and never falls
between a call and its result; the view is a pure function of the stored messages and the
compaction; nothing stored is changed. And ``Compaction`` is checked when declared."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tether import Agent, Compaction
from tether._runtime.step.compaction import cut, summary_request, to_summarise, view
from tether.errors import ConfigError
from tether.models.base import Message
from tether.store import CompactionRecord

SYSTEM: Message = {"role": "system", "content": "sys"}


def assistant(*calls: str, content: str | None = None) -> Message:
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "t", "arguments": "{}"}}
            for c in calls
        ]
    return message


def result(call: str) -> Message:
    return {"role": "tool", "tool_call_id": call, "content": "{}"}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def record(through: int, summary: str = "S") -> CompactionRecord:
    return CompactionRecord(run_id="r", through_seq=through, summary=summary, summary_tokens=3)


CONVERSATION = [
    SYSTEM,
    user("q1"),
    assistant("a", "b"),
    result("a"),
    result("b"),
    assistant(content="answer 1"),
    user("q2"),
    assistant("c"),
    result("c"),
    assistant(content="answer 2"),
]


def test_the_cut_keeps_from_the_kth_latest_assistant_message_and_the_user_message_before() -> None:
    # K=1: the last turn is the final answer; the message before it is a result, not a user.
    assert cut(CONVERSATION, 1) == 9
    # K=2: the turn asking for c, and the question just before it.
    assert cut(CONVERSATION, 2) == 6
    # K=3: the final answer of the first run; a result before it, so the cut is at it.
    assert cut(CONVERSATION, 3) == 5
    # K=4: the first turn with its question: only the system message is before.
    assert cut(CONVERSATION, 4) == 1
    # More turns than there are: nothing to cut.
    assert cut(CONVERSATION, 5) == 0


def test_the_view_is_the_system_message_the_summary_then_what_follows_the_covered_messages() -> (
    None
):
    assert view(CONVERSATION, None) == CONVERSATION
    assert view(CONVERSATION, record(6, "the gist")) == [
        SYSTEM,
        {"role": "user", "content": "the gist"},
        *CONVERSATION[6:],
    ]


def test_a_second_compaction_summarises_the_previous_summary_and_the_messages_after_it() -> None:
    first = to_summarise(CONVERSATION, None, 5)
    assert first == CONVERSATION[1:5]
    second = to_summarise(CONVERSATION, record(5, "first gist"), 9)
    assert second == [{"role": "user", "content": "first gist"}, *CONVERSATION[5:9]]
    # The model is asked with no tools' messages in its chat: one transcript to summarise.
    request = summary_request(second)
    assert [m["role"] for m in request] == ["system", "user"]
    lines = request[1]["content"].splitlines()
    assert [json.loads(line) for line in lines] == second


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Conversations as tether stores them: a system message, then questions, each
    followed by turns whose calls are answered right after them (in any order), an answer
    sent back with errors now and then, and a last turn that may still wait for results;
    a follow-up's question comes after ``not_executed`` results for what was left."""
    messages: list[Message] = [SYSTEM]
    ids = iter(range(10_000))
    for q in range(draw(st.integers(1, 3))):
        messages.append(user(f"q{q}"))
        for _ in range(draw(st.integers(0, 4))):
            calls = [f"c{next(ids)}" for _ in range(draw(st.integers(0, 3)))]
            messages.append(assistant(*calls, content=None if calls else "answer"))
            messages.extend(result(c) for c in draw(st.permutations(calls)))
            if not calls and draw(st.booleans()):
                messages.append(user("your answer did not validate"))
    calls = [f"c{next(ids)}" for _ in range(draw(st.integers(0, 3)))]
    if calls:
        messages.append(assistant(*calls))
        answered = draw(st.integers(0, len(calls)))
        messages.extend(result(c) for c in calls[:answered])
    return messages


def _split_pairs(messages: list[Message], at: int) -> list[str]:
    """The calls whose call and result are on different sides of ``at``."""
    side = {}
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or []:
            side[call["id"]] = i < at
    return [
        str(m["tool_call_id"])
        for i, m in enumerate(messages)
        if m["role"] == "tool" and m["tool_call_id"] in side and side[m["tool_call_id"]] != (i < at)
    ]


@given(conversations(), st.integers(1, 6))
def test_the_cut_never_separates_a_call_from_its_result_and_keeps_k_turns(
    messages: list[Message], keep: int
) -> None:
    at = cut(messages, keep)
    assert _split_pairs(messages, at) == []
    if at:
        kept = messages[at:]
        assert sum(1 for m in kept if m["role"] == "assistant") >= keep
        assert kept[0]["role"] in ("user", "assistant")
        assert at >= 1  # the system message is never covered


@given(
    st.lists(
        st.one_of(
            st.sampled_from(["a", "b", "c", "d"]).map(lambda c: assistant(c)),
            st.sampled_from(["a", "b", "c", "d"]).map(result),
            st.just(user("u")),
            st.just(assistant(content="x")),
        ),
        max_size=14,
    ),
    st.integers(1, 4),
)
def test_the_cut_holds_even_for_messages_in_any_order(body: list[Message], keep: int) -> None:
    messages = [SYSTEM, *body]
    at = cut(messages, keep)
    # No kept result answers a call the summary covers.
    covered = {
        c["id"] for m in messages[:at] if m["role"] == "assistant" for c in m.get("tool_calls", [])
    }
    assert not [m for m in messages[at:] if m["role"] == "tool" and m["tool_call_id"] in covered]


@given(conversations(), st.integers(1, 4), st.text(max_size=20))
def test_the_view_is_deterministic_and_changes_nothing_stored(
    messages: list[Message], keep: int, summary: str
) -> None:
    stored = copy.deepcopy(messages)
    at = cut(messages, keep)
    compaction = record(at, summary) if at > 1 else None
    first = view(messages, compaction)
    covered = to_summarise(messages, compaction, len(messages))
    for m in covered:  # a summariser that scribbles on what it is given
        m["content"] = "changed"
    assert view(copy.deepcopy(messages), compaction) == first
    assert messages == stored
    if compaction is not None:
        assert first == [SYSTEM, {"role": "user", "content": summary}, *messages[at:]]


# -- declaring it ----------------------------------------------------------------------------


def _summary(messages: list[dict[str, Any]]) -> str:
    return "gist"


async def _async_summary(messages: list[dict[str, Any]]) -> str:
    return "gist"


def test_a_compaction_is_declared_with_positive_integers_and_a_one_argument_summarize() -> None:
    assert Compaction(max_input_tokens=1000).keep_last_turns == 4
    for fn in (None, _summary, _async_summary, lambda messages: "gist"):
        declared = Compaction(max_input_tokens=10, keep_last_turns=1, summarize=fn)
        agent = Agent(name="a", system_prompt="s", compaction=declared)
        assert agent.compaction is declared
    assert Agent(name="a", system_prompt="s").compaction is None


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"max_input_tokens": 0}, "max_input_tokens must be a positive integer"),
        ({"max_input_tokens": -5}, "max_input_tokens must be a positive integer"),
        ({"max_input_tokens": True}, "max_input_tokens must be a positive integer"),
        ({"max_input_tokens": 10.0}, "max_input_tokens must be a positive integer"),
        ({"max_input_tokens": "10"}, "max_input_tokens must be a positive integer"),
        ({"max_input_tokens": 10, "keep_last_turns": 0}, "keep_last_turns must be a positive"),
        ({"max_input_tokens": 10, "keep_last_turns": False}, "keep_last_turns must be a positive"),
        ({"max_input_tokens": 10, "summarize": "gist"}, "summarize must be a function"),
        ({"max_input_tokens": 10, "summarize": lambda: "gist"}, "summarize must take"),
        ({"max_input_tokens": 10, "summarize": lambda a, b: "gist"}, "summarize must take"),
    ],
)
def test_a_malformed_compaction_is_refused_when_declared(
    arguments: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says) as refused:
        Compaction(**arguments)
    assert refused.value.code == "invalid_config"


def test_an_agent_refuses_a_compaction_that_is_not_one() -> None:
    with pytest.raises(ConfigError, match=r"compaction must be a tether\.Compaction"):
        Agent(name="a", system_prompt="s", compaction={"max_input_tokens": 10})  # type: ignore[arg-type]
