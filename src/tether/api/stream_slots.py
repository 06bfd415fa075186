"""Open event streams per user in this process (``TETHER_MAX_STREAMS_PER_USER``, default
100): the API's ``GET /v1/runs/{id}/events/stream`` and the inbox's live streams
(``/runs/{id}/live``, ``/live``) alike. Each open stream holds a connection and a file
descriptor for as long as it lasts, so one key holding streams without end would take
the process's descriptors from everyone (EMFILE: other clients' 500s, workers unable to
open the database). The next stream past the bound is refused (``429 too_many_streams``)
before it starts.

A stream's slot is taken as its answer starts and given back as it ends, in the same
frame, however it ends: the run reached a terminal state, the client went away, the
server shut down (its task cancelled)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tether.api.statuses import status_for
from tether.errors import TooManyStreams


class StreamSlots:
    """The open streams of each user in one process, at most ``per_user`` each."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._open: Counter[str] = Counter()

    def open_for(self, user: str) -> int:
        """How many streams ``user`` holds open now."""
        return self._open[user]

    def held(
        self, user: str, stream: Response, refused: Callable[[TooManyStreams], Response]
    ) -> Response:
        """``stream`` as ``user``'s, counted while it is open; answered ``refused(...)``
        instead when ``user`` already holds ``per_user`` streams."""
        return _Held(self, user, stream, refused)

    def _take(self, user: str) -> bool:
        if self._open[user] >= self.per_user:
            return False
        self._open[user] += 1
        return True

    def _give_back(self, user: str) -> None:
        self._open[user] -= 1
        if self._open[user] <= 0:
            del self._open[user]  # the table holds only users with streams open


def as_json(refusal: TooManyStreams) -> Response:
    """The refusal as the JSON API answers every refusal."""
    return JSONResponse(refusal.to_dict(), status_code=status_for(refusal.code))


class _Held(Response):
    """A stream's answer that holds one of its user's slots while it is sent."""

    def __init__(
        self,
        slots: StreamSlots,
        user: str,
        stream: Response,
        refused: Callable[[TooManyStreams], Response],
    ) -> None:
        super().__init__(status_code=stream.status_code)
        self._slots, self._user, self._stream, self._refused = slots, user, stream, refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.background is not None and self._stream.background is None:
            self._stream.background = self.background  # the route's, set on this answer
        if not self._slots._take(self._user):
            bound = self._slots.per_user
            refusal = TooManyStreams(
                f"{self._user} already holds {bound} open event streams in this process "
                "(TETHER_MAX_STREAMS_PER_USER); close one first",
                limit=bound,
            )
            await self._refused(refusal)(scope, receive, send)
            return
        try:
            await self._stream(scope, receive, send)
        finally:  # whatever ended it: the run, the client, a shutdown's cancellation
            self._slots._give_back(self._user)
