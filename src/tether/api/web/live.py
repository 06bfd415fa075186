"""The inbox follows runs live (reference §16), through the session's cookie; every page
stays whole without its script (``/static/live.js``), and its forms post as they always do.

- ``GET /runs/{id}/live`` is the run's own stream, the one ``/v1`` serves
  (``tether.api.stream``) with the model's text as it is written, its stored events
  unnamed (``EventSource`` gets each kind as a ``message``), for the run's owner: the
  run page's script writes the text of the step in flight into the page and, on each
  stored event, fetches the page again and swaps in its ``data-live`` parts (state,
  pending calls with their forms, actions, timeline, messages).
- ``GET /live?run=ID&run=ID...`` is the light signal the lists (``/`` and ``/runs``)
  follow: one stream for the viewer's own runs among those named (at most
  ``FOLLOW_LIMIT``, the size of a page of runs) that are not terminal, with an ``event:
  changed`` ``{"run_id", "kind"}`` for each event stored after the stream opened, and
  ``event: done`` once every one of them is terminal. It costs one connection per list,
  and its watches share the engine's one reader of events (``Engine.watch``). On each
  signal the list's script fetches the page again; it also does every
  ``data-live-poll`` seconds while the tab is visible, which brings runs started elsewhere
  and requests of other users' runs (whose streams are not the viewer's).

Without a session both answer as the pages do (303 to sign in: ``EventSource`` gives up on
an answer that is not a stream); a run that is not the viewer's is the page of a missing
run (404), as on ``/runs/{id}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from tether.api.deps import engine_of, stream_slots_of
from tether.api.stream import event_stream
from tether.api.web.inbox import no_such_run
from tether.api.web.pages import ASSETS, message
from tether.api.web.sign_in import SignIn, login_url, sign_in_of
from tether.engine import Engine
from tether.errors import InvalidInput, NotFound, TooManyStreams

# How many runs one list stream follows (the runs of one page of ``/runs``).
FOLLOW_LIMIT = 50

_SEP = "\n"

router = APIRouter(include_in_schema=False)


@router.get("/runs/{run_id}/live")
async def run_live(request: Request, run_id: str, after: str | None = None) -> Response:
    """The owner's run as Server-Sent Events with its deltas (reference §11, §16), after
    ``Last-Event-ID`` (which wins) or ``?after=SEQ``."""
    session = await sign_in_of(request)
    if session is None:
        return RedirectResponse(login_url(f"/runs/{run_id}"), status_code=303)
    last = request.headers.get("last-event-id")
    try:
        stream = await event_stream(
            engine_of(request),
            run_id,
            session.user,
            after=after,
            last_event_id=last,
            deltas=True,
            named=False,
        )
        return _held(request, session, stream)
    except NotFound:
        return no_such_run(request, session)
    except InvalidInput as exc:
        return message(request, session, 422, "Invalid", exc.message, kind="refused")


@router.get("/live")
async def lists_live(request: Request) -> Response:
    """A signal for each event stored from now on of the viewer's runs among those the
    ``run`` parameters name that are not terminal; the others are left out (a list names
    what it shows)."""
    session = await sign_in_of(request)
    if session is None:
        return RedirectResponse(login_url("/"), status_code=303)
    engine = engine_of(request)
    # Where each run is now, read before the answer starts: a page fetched once the
    # stream is open misses nothing the stream does not signal.
    named = request.query_params.getlist("run")[:FOLLOW_LIMIT]
    starts = await _followed(engine, session.user, named)
    stream = EventSourceResponse(
        _signals(engine, session.user, starts),
        ping=engine.settings.keepalive_s,
        ping_message_factory=lambda: ServerSentEvent(comment="keep-alive", sep=_SEP),
        sep=_SEP,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
    return _held(request, session, stream)


def _held(request: Request, session: SignIn, stream: Response) -> Response:
    """``stream`` counted among the viewer's open streams (``tether.api.stream_slots``,
    shared with the API's); past the bound, a page that says so (``EventSource`` stops
    on it, and the page itself still works)."""

    def refused(refusal: TooManyStreams) -> Response:
        text = f"This page is not followed live: {refusal.message}. Reload it to see changes."
        return message(request, session, 429, "Too many live pages", text, kind="refused")

    return stream_slots_of(request).held(session.user, stream, refused)


async def _followed(engine: Engine, user: str, run_ids: list[str]) -> dict[str, int]:
    """The SEQ of the last event of each of ``user``'s runs named that is not terminal."""
    starts: dict[str, int] = {}
    for run_id in dict.fromkeys(run_ids):
        try:
            found = (await engine.get_run(run_id, user=user)).run
        except (NotFound, InvalidInput):
            continue
        if not found.state.terminal:
            starts[found.id] = len(await engine.events(found.id))
    return starts


async def _signals(
    engine: Engine, user: str, starts: dict[str, int]
) -> AsyncIterator[ServerSentEvent]:
    """``changed`` for each new event of the runs of ``starts``, then ``done``."""
    queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()

    async def follow(run_id: str, after: int) -> None:
        try:
            async for event in engine.watch(run_id, after=after, user=user):
                await queue.put((run_id, event.kind))
        except NotFound:  # deleted or purged meanwhile: nothing more to follow
            pass
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(follow(run_id, after)) for run_id, after in starts.items()]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
                continue
            data = json.dumps({"run_id": item[0], "kind": item[1]}, separators=(",", ":"))
            yield ServerSentEvent(data=data, event="changed", sep=_SEP)
        yield ServerSentEvent(data="{}", event="done", sep=_SEP)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@router.get("/static/live.js")
async def script() -> FileResponse:
    return FileResponse(ASSETS / "static" / "live.js", media_type="text/javascript")
