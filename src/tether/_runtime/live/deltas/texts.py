"""What one process holds of the text of the steps in flight (``tether._runtime.live.deltas``):
each model call's text (``Text``), what of a local one went to other processes
(``Local``), each watcher's bounded queue (``DeltaSubscription``), and the payloads of the
notices that carry text between processes."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether.results import Delta

if TYPE_CHECKING:
    from tether._runtime.live.deltas.hub import DeltaHub

MAX_QUEUED_CHARS = 65_536  # a watcher further behind than this is dropped to a catch-up
MAX_QUEUED = 1024  # or this many deltas behind
PAYLOAD_BYTES = 7900  # a notice's payload must stay under PostgreSQL's 8000 bytes


@dataclass(eq=False)
class Text:
    """The text of one model call of a step, as far as this process knows it."""

    step: int
    gen: str
    parts: list[str] = field(default_factory=list)
    length: int = 0  # code points
    ended: bool = False

    def whole(self) -> str:
        return "".join(self.parts)

    def so_far(self, run_id: str, *, dropped: bool = False) -> Delta | None:
        """The text so far as a catch-up at 0 while the call goes on (never an empty one);
        for a watcher that was ``dropped``, also once it ended (its end had not reached it:
        the feed leaves it out if that step's ``model_turn`` was sent already)."""
        if (self.ended and not dropped) or not self.length:
            return None
        return Delta(
            run_id=run_id,
            step=self.step,
            offset=0,
            text=self.whole(),
            catch_up=True,
            dropped=dropped,
        )


@dataclass(eq=False)
class Local:
    """A step this process carries: what of its text went to other processes."""

    text: Text
    sent_parts: int = 0
    sent_length: int = 0
    resend: bool = False  # asked again: send it all from 0
    end_sent: bool = False


class DeltaSubscription:
    """One watcher's queue of deltas. ``wake`` is called (from any thread) when it was
    empty and is no longer; ``take`` empties it."""

    def __init__(self, hub: DeltaHub, run_id: str, wake: Callable[[], None]) -> None:
        self._hub = hub
        self.run_id = run_id
        self._wake = wake
        self._queue: deque[Delta] = deque()
        self._chars = 0
        self._signalled = False
        self.behind = False  # dropped: its next take starts with a catch-up

    def offer(self, delta: Delta) -> None:
        """Queue ``delta`` (under the hub's lock)."""
        if self.behind:
            return  # the catch-up will hold it
        if self._chars + len(delta.text) > MAX_QUEUED_CHARS or len(self._queue) >= MAX_QUEUED:
            self._queue.clear()
            self._chars = 0
            self.behind = True
        else:
            self._queue.append(delta)
            self._chars += len(delta.text)
        if not self._signalled:
            self._signalled = True
            self._wake()

    def take(self) -> list[Delta]:
        """The deltas queued since the last take (a catch-up first if it fell behind)."""
        return self._hub.drain(self)

    def drained(self) -> list[Delta]:
        """Empty the queue (under the hub's lock)."""
        taken = list(self._queue)
        self._queue.clear()
        self._chars = 0
        self._signalled = False
        return taken

    async def caught_up(self, turns: list[tuple[int, str]]) -> None:
        """Return once every delta of the steps of ``turns`` (each step with its stored
        text) sent before now is queued here (``DeltaHub.caught_up``)."""
        await self._hub.caught_up(self, turns)

    def close(self) -> None:
        self._hub.unsubscribe(self)


@dataclass(eq=False)
class RunTexts:
    run_id: str
    text: Text | None = None
    local: Local | None = None
    watchers: set[DeltaSubscription] = field(default_factory=set)


def delta_of(run_id: str, text: Text, offset: int, piece: str) -> Delta:
    return Delta(run_id=run_id, step=text.step, offset=offset, text=piece)


def payloads(run_id: str, text: Text, offset: int, piece: str, *, ends: bool) -> list[str]:
    """``piece`` at ``offset`` as notice payloads, each under ``PAYLOAD_BYTES``; the last
    one with the end marker (``"e": 1``) if the call ``ends``."""
    head: dict[str, Any] = {"r": run_id, "s": text.step, "g": text.gen, "o": offset}
    if not piece:
        return [json.dumps({**head, "e": 1}, separators=(",", ":"))] if ends else []
    body = {**head, "t": piece, **({"e": 1} if ends else {})}
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    if len(payload.encode()) <= PAYLOAD_BYTES or len(piece) == 1:
        return [payload]
    half = len(piece) // 2
    first = payloads(run_id, text, offset, piece[:half], ends=False)
    return first + payloads(run_id, text, offset + half, piece[half:], ends=ends)
