"""A list of models to fall back on (reference §21): ``TETHER_MODEL="openai:A|anthropic:B"``.

Each call tries the list from its first model, so a model that recovers is used again at
the next call, and goes on to the next model at once when one fails: a transient failure,
or a permanent one while another model remains. The call fails only when every model did;
its error is permanent only when every model's was (reference §10). The conversation is in
tether's one format, which every adapter translates for its provider, so any model of the
list can take any step.

The engine asks a list through ``first_answer``, which gives it each attempt's own hooks
(its text streamed afresh, its failure counted); ``request`` and ``stream`` make a list a
``Model`` like any other for code that calls one directly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tether.errors import ConfigError, ModelError
from tether.models.base import Message, Model, ModelResponse, TextSink, ToolSpec


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A model of the list and its entry as written (``openai:gpt-4.1``), which names it in
    events, metrics and prices."""

    spec: str
    model: Model


@dataclass(frozen=True, kw_only=True)
class Answered:
    """The turn a model of the list gave, and its entry."""

    entry: Entry
    response: ModelResponse


# What the engine does with each attempt of a call: ask it, and hear of its failure (the
# entry, its error, and whether another model remains to be asked).
Ask = Callable[[Entry], Awaitable[ModelResponse]]
Failed = Callable[[Entry, ModelError, bool], None]


class ModelList(Model):
    """Models tried in order at each call (see the module)."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        if not entries:
            raise ConfigError("a list of models needs at least one model")
        specs = [entry.spec for entry in entries]
        twice = sorted({spec for spec in specs if specs.count(spec) > 1})
        if twice:
            raise ConfigError(f"a list of models names {', '.join(map(repr, twice))} twice")
        self.entries = tuple(entries)
        self.name = "|".join(specs)

    @classmethod
    def of(cls, model: Model) -> ModelList:
        """``model`` as a list: itself if it is one, else a list of it alone, named as the
        model names itself."""
        return model if isinstance(model, ModelList) else cls([Entry(spec=model.name, model=model)])

    async def first_answer(self, ask: Ask, failed: Failed | None = None) -> Answered:
        """The first turn a model of the list gives to ``ask``, trying them in order;
        ``failed`` hears of each model that failed. Raises the one ``ModelError`` of the
        call when every model failed (``combined``)."""
        errors: list[tuple[Entry, ModelError]] = []
        for index, entry in enumerate(self.entries):
            try:
                response = await ask(entry)
            except ModelError as exc:
                errors.append((entry, exc))
                if failed is not None:
                    failed(entry, exc, index + 1 < len(self.entries))
                continue
            return Answered(entry=entry, response=response)
        raise combined(errors)

    async def request(self, messages: list[Message], tools: list[ToolSpec]) -> ModelResponse:
        """The first answer of the list, as one model gives it."""
        answered = await self.first_answer(lambda entry: entry.model.request(messages, tools))
        return answered.response

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec], on_text: TextSink
    ) -> ModelResponse:
        """The first answer of the list, its text handed to ``on_text``. A model that
        failed after some text leaves that text handed over already: the engine asks
        through ``first_answer`` instead, restarting the step's text for each model."""
        answered = await self.first_answer(
            lambda entry: entry.model.stream(messages, tools, on_text)
        )
        return answered.response

    async def aclose(self) -> None:
        """Close every model of the list, each even if another fails to close."""
        closed = await asyncio.gather(
            *(entry.model.aclose() for entry in self.entries), return_exceptions=True
        )
        for outcome in closed:
            if isinstance(outcome, BaseException):
                raise outcome


def combined(errors: Sequence[tuple[Entry, ModelError]]) -> ModelError:
    """The error of a call that every model of a list failed: one model's own error; for
    several, each model's message, transient unless every model's error was permanent,
    with the status they share (if they share one)."""
    if len(errors) == 1:
        return errors[0][1]
    statuses = {error.status for _, error in errors}
    return ModelError(
        "every model of the list failed: "
        + "; ".join(f"{entry.spec}: {error.message}" for entry, error in errors),
        status=statuses.pop() if len(statuses) == 1 else None,
        transient=any(error.transient for _, error in errors),
    )


def parse_list(spec: str, one: Callable[[str], Model]) -> Model:
    """The model ``spec`` names: ``one(spec)`` for a single entry, else a ``ModelList`` of
    ``one`` of each ``|``-separated entry (spaces around them ignored). An empty entry is
    a ``ConfigError``."""
    parts = [part.strip() for part in spec.split("|")]
    if len(parts) == 1:
        return one(spec)
    if not all(parts):
        raise ConfigError(
            f"a list of models (TETHER_MODEL) is entries joined by '|', none empty; got {spec!r}"
        )
    return ModelList([Entry(spec=part, model=one(part)) for part in parts])
