"""A list of models to fall back on (reference §21), without a server: how a spec is read
into one, the order its models are asked in, and the one error of a call they all failed."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import ConfigError, ModelError
from tether.models import ModelList, ScriptedModel, from_spec
from tether.models.base import Message, Model, ModelResponse, ToolSpec, Usage
from tether.models.fallback import Entry, combined
from tether.models.pricing import spend_usd


class Scripted(Model):
    """Answers ``text``, or raises each error of ``errors`` in turn first; counts calls."""

    def __init__(self, name: str, text: str = "", errors: tuple[ModelError, ...] = ()) -> None:
        self.name = name
        self.text = text or f"from {name}"
        self.errors = list(errors)
        self.calls = 0
        self.closed = False

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        message = {"role": "assistant", "content": self.text}
        return ModelResponse(message=message, usage=Usage(input_tokens=1), model=self.name)

    async def aclose(self) -> None:
        self.closed = True


def listed(*models: Scripted) -> ModelList:
    return ModelList([Entry(spec=m.name, model=m) for m in models])


DOWN = ModelError("HTTP 503: overloaded", status=503, transient=True)
WRONG = ModelError("HTTP 404: no such model", status=404)
DENIED = ModelError("HTTP 401: bad key", status=401)


def test_one_entry_is_that_model_and_several_are_a_list_named_as_written(tmp_path: Any) -> None:
    script, other = tmp_path / "s.json", tmp_path / "t.json"
    for path in (script, other):
        path.write_text('{"turns": []}')
    assert isinstance(from_spec(f"scripted:{script}"), ScriptedModel)
    both = from_spec(f"scripted:{script} | scripted:{other}")
    assert isinstance(both, ModelList)
    assert [e.spec for e in both.entries] == [f"scripted:{script}", f"scripted:{other}"]
    assert both.name == f"scripted:{script}|scripted:{other}"


@pytest.mark.parametrize(
    "spec, says",
    [
        ("openai:a||anthropic:b", "none empty"),
        ("openai:a|", "none empty"),
        ("|openai:a", "none empty"),
        ("openai:a|nope", "must be"),
        ("openai:a|mystery:b", "unknown model kind"),
    ],
)
def test_a_malformed_list_is_a_config_error_that_says_why(
    spec: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(ConfigError) as raised:
        from_spec(spec)
    assert says in raised.value.message and raised.value.code == "invalid_config"


def test_a_list_that_names_a_model_twice_is_refused() -> None:
    one = Scripted("m")
    with pytest.raises(ConfigError, match="'m' twice"):
        ModelList([Entry(spec="m", model=one), Entry(spec="m", model=one)])
    with pytest.raises(ConfigError, match="at least one"):
        ModelList([])


async def test_each_call_starts_at_the_first_model_and_stops_at_the_first_answer() -> None:
    first, second, third = Scripted("a", errors=(DOWN,)), Scripted("b"), Scripted("c")
    models = listed(first, second, third)
    heard: list[tuple[str, bool]] = []
    answered = await models.first_answer(
        lambda e: e.model.request([], []), lambda e, _err, more: heard.append((e.spec, more))
    )
    assert answered.entry.spec == "b" and answered.response.message["content"] == "from b"
    assert heard == [("a", True)] and third.calls == 0
    # The first model recovered: the next call is its again.
    again = await models.first_answer(lambda e: e.model.request([], []))
    assert again.entry.spec == "a" and (first.calls, second.calls) == (2, 1)


async def test_a_permanent_error_passes_to_the_next_model_while_one_remains() -> None:
    models = listed(Scripted("a", errors=(WRONG,)), Scripted("b"))
    assert (await models.request([], [])).message["content"] == "from b"


async def test_every_model_failing_is_one_error_naming_each_transient_unless_all_permanent() -> (
    None
):
    mixed = listed(Scripted("a", errors=(WRONG,)), Scripted("b", errors=(DOWN,)))
    with pytest.raises(ModelError) as raised:
        await mixed.request([], [])
    assert raised.value.transient and raised.value.status is None
    assert "a: HTTP 404: no such model" in raised.value.message
    assert "b: HTTP 503: overloaded" in raised.value.message

    wrong = listed(Scripted("a", errors=(WRONG,)), Scripted("b", errors=(DENIED,)))
    with pytest.raises(ModelError) as raised:
        await wrong.request([], [])
    assert not raised.value.transient


def test_the_error_of_one_model_alone_is_its_own() -> None:
    only = Entry(spec="a", model=Scripted("a"))
    assert combined([(only, DOWN)]) is DOWN
    both = combined([(only, DOWN), (Entry(spec="b", model=Scripted("b")), DOWN)])
    assert both.status == 503 and both.transient


async def test_a_model_is_a_list_of_itself_and_closing_a_list_closes_each() -> None:
    alone = Scripted("solo")
    as_list = ModelList.of(alone)
    assert [(e.spec, e.model) for e in as_list.entries] == [("solo", alone)]
    assert ModelList.of(as_list) is as_list
    a, b = Scripted("a"), Scripted("b")
    await listed(a, b).aclose()
    assert a.closed and b.closed


def test_a_price_may_name_a_model_by_its_entry_before_its_name() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=1_000_000)
    prices = {"gpt-4.1": (1.0, 1.0), "openai:gpt-4.1": (2.0, 2.0)}
    assert spend_usd("gpt-4.1", usage, prices, entry="openai:gpt-4.1") == 4.0
    # Another server's entry for the same name falls back to the name's price.
    assert spend_usd("gpt-4.1", usage, prices, entry="openai:other") == 2.0
    assert spend_usd("gpt-4.1", usage, {}, entry="openai:gpt-4.1") == 10.0  # the table's
