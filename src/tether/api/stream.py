"""The live event stream of a run as Server-Sent Events (reference §11), through sse-starlette.

Each stored event is sent as ``id: SEQ``, ``event: KIND``, ``data: {"seq", "at", "kind",
"data"}`` (the shape of ``GET /v1/runs/{id}/events``' items), in order, from after the
request's ``Last-Event-ID`` (which wins) or ``?after=SEQ``; an idle stream sends a
``: keep-alive`` comment every ``Settings.keepalive_s`` (15 s); the stream ends after the
events of a run in a terminal state. The run and ``after`` are checked before the stream
starts, so a refusal is an ordinary JSON 4xx.

With ``deltas``, the text of the step being generated comes too (reference §16), as
``event: delta`` with ``data: {"step", "offset", "text"}`` and no ``id:`` (deltas are not
stored); a watcher that fell behind gets a ``: deltas dropped`` comment, then the step's
text so far at offset 0.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from tether import inputs
from tether.engine import Engine
from tether.inputs import after_seq
from tether.results import Delta

_SEP = "\n"
_DROPPED = "deltas dropped for a slow reader; the step's text so far follows"


async def event_stream(
    engine: Engine,
    run_id: str,
    user: str,
    *,
    after: str | None,
    last_event_id: str | None,
    deltas: str | bool | None = None,
    named: bool = True,
) -> EventSourceResponse:
    """The stream of ``user``'s run ``run_id``; ``not_found`` / ``invalid_input`` first.
    Without ``named`` a stored event goes without its ``event:`` line (a browser's
    ``EventSource`` then gets every kind as a ``message``, its kind in its data)."""
    raw = last_event_id if last_event_id is not None else after
    start = 0 if raw is None else after_seq(raw)
    with_deltas = False if deltas is None else inputs.flag(deltas, "deltas")
    run = (await engine.get_run(inputs.run_id(run_id), user=user)).run

    async def events() -> AsyncIterator[ServerSentEvent]:
        async for item in engine.watch(run.id, after=start, user=user, deltas=with_deltas):
            data = json.dumps(item.to_json(), separators=(",", ":"))
            if isinstance(item, Delta):
                if item.dropped:
                    yield ServerSentEvent(comment=_DROPPED, sep=_SEP)
                yield ServerSentEvent(data=data, event="delta", sep=_SEP)
            else:
                kind = item.kind if named else None
                yield ServerSentEvent(data=data, event=kind, id=str(item.seq), sep=_SEP)

    return EventSourceResponse(
        events(),
        ping=engine.settings.keepalive_s,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=_SEP),
        sep=_SEP,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
