"""One model call of a run: the step's turn, or a compaction's summary (reference §21).

The engine's model is asked as a list (``ModelList``; one model is a list of one): each
model of it in order until one answers. Each attempt streams the step's text afresh, so a
model that failed after some text has it replaced, from offset 0, by the next one's
(reference §16); each model's answers and failures are counted in ``/metrics``. Nothing of
a failed attempt is stored, so a crash between two attempts (failpoint
``before_next_model``) leaves the run as a crash before the call does: its next owner asks
the list again from its first model.
"""

from __future__ import annotations

import logging

from tether._runtime.step.session import RunSession
from tether.errors import ModelError
from tether.failpoints import fail
from tether.models.base import Message, ModelResponse, ToolSpec
from tether.models.fallback import Answered, Entry, ModelList
from tether.telemetry.content import fields
from tether.telemetry.metrics import MODEL_CALLS

log = logging.getLogger(__name__)


async def ask(
    session: RunSession, messages: list[Message], tools: list[ToolSpec], *, streamed: bool
) -> Answered:
    """The first answer of the run's models to ``messages``; with ``streamed``, each
    attempt's text goes to the run's watchers as the step's (``services.deltas``). Raises
    the call's ``ModelError`` when every model failed (``fallback.combined``)."""
    services = session.services
    deltas = services.deltas if streamed else None
    step = session.step + 1

    async def attempt(entry: Entry) -> ModelResponse:
        if deltas is None:
            return await entry.model.request(messages, tools)
        async with deltas.stream(session.run.id, step) as on_text:
            return await entry.model.stream(messages, tools, on_text)

    def failed(entry: Entry, error: ModelError, more: bool) -> None:
        outcome = "transient" if error.transient else "permanent"
        MODEL_CALLS.labels(model=entry.spec, outcome=outcome).inc()
        if not more:
            return
        told = fields(services.settings.log_content, error=error.message)
        extra = {"run_id": session.run.id, "action": "model_fallback", "step": step}
        log.warning(
            "model failed, asking the next",
            extra={**extra, "model": entry.spec, "status": error.status, **told},
        )
        fail("before_next_model")

    answered = await models_of(session).first_answer(attempt, failed)
    MODEL_CALLS.labels(model=answered.entry.spec, outcome="answered").inc()
    return answered


def models_of(session: RunSession) -> ModelList:
    """The run's models as a list (made once per engine: ``Services.models``)."""
    return session.services.models
