"""Suspension notices: who is asked to approve what, with the token to do it, and the
outbox that delivers them off the path of the runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tether._runtime.hop import hop
from tether.telemetry.content import failure, fields
from tether.tokens import hash_token

if TYPE_CHECKING:
    from tether.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Notice:
    """A suspension notice. It holds only what the run's owner may see, rendered from the
    stored tool call and its preview, never from the model's prose."""

    run_id: str
    user_id: str
    token: str
    approve_url: str
    tool: str
    arguments: dict[str, Any]
    preview: dict[str, Any] | None
    expires_at: str
    # The call it asks about and how many calls of its turn the suspension waits on: one
    # notice is sent per pending call (reference §15).
    tool_call_id: str = ""
    pending_calls: int = 1
    # The run's tree (reference §18): its top-level run (None: the run is one) and the run
    # whose sub-agent call started it (None at the top).
    root_run_id: str | None = None
    parent_run_id: str | None = None
    # Who decides (reference §19): how many approve the call, and whether this notice
    # tells of its escalation (its token then is the escalation's, for ``escalate_to``).
    quorum: int = 1
    escalated: bool = False
    escalate_to: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "root_run_id": self.root_run_id or self.run_id,
            "parent_run_id": self.parent_run_id,
            "token": self.token,
            "approve_url": self.approve_url,
            "tool": self.tool,
            "tool_call_id": self.tool_call_id,
            "arguments": self.arguments,
            "preview": self.preview,
            "expires_at": self.expires_at,
            "pending_calls": self.pending_calls,
            "quorum": self.quorum,
            "escalated": self.escalated,
            "escalate_to": list(self.escalate_to),
        }


class Notifier(Protocol):
    """Where suspension notices go. ``send`` returns False (or raises) when the notice
    was not delivered; the reaper then re-issues it with a fresh token. A notifier whose
    ``send`` cannot block (it writes to memory or a log) may say so with a class attribute
    ``immediate = True``: the outbox then calls it inline."""

    async def send(self, notice: Notice) -> bool | None: ...


class LogNotifier:
    """Writes notices to the log (the default when no webhook is configured). A log is read
    by more people than may decide, so it names the run and the tool, not the token: the
    request is found with ``tether approvals list`` or ``GET /v1/approvals``. With
    ``links`` (``TETHER_LOG_APPROVAL_LINKS=1``) it writes the approval link too; with
    ``content`` (``TETHER_LOG_CONTENT=1``) the call's arguments and preview."""

    immediate = True

    def __init__(self, *, links: bool = False, content: bool = False) -> None:
        self.links = links
        self.content = content

    async def send(self, notice: Notice) -> None:
        extra: dict[str, Any] = {
            "action": "suspension_notice",
            "run_id": notice.run_id,
            "root_run_id": notice.root_run_id or notice.run_id,
            "parent_run_id": notice.parent_run_id,
            "user_id": notice.user_id,
            "tool": notice.tool,
            "expires_at": notice.expires_at,
        }
        if self.links:
            extra["approve_url"] = notice.approve_url
        extra |= fields(self.content, arguments=notice.arguments, preview=notice.preview)
        log.info(
            "approval requested: find it with `tether approvals list` or GET /v1/approvals",
            extra=extra,
        )


class MemoryNotifier:
    """Keeps notices in a list; for tests, the demo and scripts."""

    immediate = True

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    async def send(self, notice: Notice) -> None:
        self.notices.append(notice)

    def last(self, run_id: str | None = None) -> Notice:
        """The latest notice (for ``run_id`` if given)."""
        for notice in reversed(self.notices):
            if run_id is None or notice.run_id == run_id:
                return notice
        raise LookupError(f"no notice for run {run_id}")


class Outbox:
    """Delivers suspension notices from tasks of their own, so a webhook that hangs or
    fails delays no run: ``post`` only queues the notice (bounded), and up to ``senders``
    tasks send queued notices, each within ``timeout_s`` of its posting (never later, so
    it cannot race the re-issue that replaces it). A delivered notice is
    recorded; one that was not (refused, timed out, dropped from a full queue, or lost
    with the process) stays unrecorded, and the reaper re-issues it with a fresh token.
    An ``immediate`` notifier is called inline instead. ``content``: a notifier's error
    is logged with its message (``TETHER_LOG_CONTENT``).
    """

    def __init__(
        self,
        notifier: Notifier,
        store: Store,
        *,
        size: int = 1000,
        senders: int = 4,
        timeout_s: float = 60.0,
        content: bool = False,
    ) -> None:
        self.notifier = notifier
        self.content = content  # errors' messages in its log lines (TETHER_LOG_CONTENT)
        self.store = store
        self.size = size
        self.senders = senders
        self.timeout_s = timeout_s
        self._queue: asyncio.Queue[tuple[Notice, float]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # A delivery is recorded in a thread; ``stop`` waits for one in flight, so no
        # record opens a connection after the engine closed its store.
        self._lock = threading.Lock()
        self._stopped = False

    async def post(self, notice: Notice) -> None:
        """Queue ``notice`` for delivery (or deliver it now, for an immediate notifier)."""
        self._stopped = False  # an engine used again after close delivers again
        if getattr(self.notifier, "immediate", False):
            await self.deliver(notice)
            return
        queue = self._queue_here()
        try:
            queue.put_nowait((notice, time.monotonic() + self.timeout_s))
        except asyncio.QueueFull:
            log.warning(
                "notice outbox full; the reaper will re-issue the notice",
                extra={"run_id": notice.run_id, "action": "notify"},
            )
            return
        if len(self._tasks) < self.senders:
            task = asyncio.get_running_loop().create_task(self._send(queue), name="tether-notify")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def deliver(self, notice: Notice, *, deadline: float | None = None) -> None:
        """Send one notice, by ``deadline`` (monotonic; default: ``timeout_s`` from now),
        and record its delivery. A notice past its deadline is never sent: by then the
        reaper may have replaced its token."""
        left = self.timeout_s if deadline is None else deadline - time.monotonic()
        if left <= 0:
            log.warning(
                "notice not sent in time; the reaper will re-issue it",
                extra={"run_id": notice.run_id, "action": "notify"},
            )
            return
        try:
            delivered = await asyncio.wait_for(self.notifier.send(notice), left)
        except Exception as exc:
            told = failure(exc, self.content, run_id=notice.run_id, action="notify")
            log.error("notice failed", **told)
            return
        if delivered is False:
            return
        try:
            await hop(self._record, notice.run_id, hash_token(notice.token))
        except Exception as exc:
            log.error("notice not recorded", **failure(exc, self.content, run_id=notice.run_id))

    def _record(self, run_id: str, token_hash: str) -> None:
        """Record a delivery, in a thread (nothing once the outbox was stopped)."""
        with self._lock:
            if not self._stopped:
                self.store.mark_notified(run_id, token_hash)

    def stop(self) -> None:
        """Stop delivering (the engine is closing): queued notices are dropped, to be
        re-issued by a reaper. Blocks until a record in flight has finished."""
        for task in list(self._tasks):
            task.cancel()
        with self._lock:
            self._stopped = True

    @property
    def pending(self) -> int:
        """Notices queued and not yet sent."""
        return self._queue.qsize() if self._queue is not None else 0

    async def drain(self, timeout_s: float) -> None:
        """Give queued notices up to ``timeout_s`` to go out, then stop the senders."""
        if self._loop is not asyncio.get_running_loop():
            return  # queued in a loop that is gone: the reaper re-issues those notices
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _queue_here(self) -> asyncio.Queue[tuple[Notice, float]]:
        """The queue of the running event loop (a new loop starts a new queue)."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            self._queue, self._loop = asyncio.Queue(self.size), loop
            self._tasks = set()
        return self._queue

    async def _send(self, queue: asyncio.Queue[tuple[Notice, float]]) -> None:
        while True:
            try:
                notice, deadline = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await self.deliver(notice, deadline=deadline)
