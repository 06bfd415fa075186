"""The ``Engine``'s methods that create runs (reference §6, §13, §14): a question for a
user, in a new thread or as a follow-up, with limits, an ``Idempotency-Key``, a priority
and a start time; validated, then created in one transaction (``creation.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from tether._runtime import creation
from tether._runtime.opening import opens
from tether.budget import Limits
from tether.results import Accepted
from tether.runs import Run

if TYPE_CHECKING:
    from tether._runtime.services import Services


class CreationMethods:
    """Mixed into ``Engine``: it supplies ``_services`` and ``open()``."""

    _services: Services

    async def open(self) -> None:
        raise NotImplementedError

    async def start_run(
        self,
        user: str,
        question: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
        thread_id: str | None = None,
        if_busy: str = "reject",
        idempotency_key: str | None = None,
        priority: int | None = None,
        start_at: datetime | str | None = None,
    ) -> Run:
        """Create a run for ``user`` asking ``question``; it waits for a worker (or for
        ``run_until_stop``). Its scope is resolved now and stored as a snapshot.

        Without ``thread_id`` it starts a new thread; with one of ``user``'s threads it is
        a follow-up, and the model sees the thread's conversation, then ``question``
        (reference §14). A follow-up to a busy thread is ``thread_busy`` (naming the run it
        would wait on), or with ``if_busy="enqueue"`` it is ``queued`` and starts once the
        runs before it have stopped. ``not_found`` for a thread that is not ``user``'s.

        With ``idempotency_key`` (1-255 printable ASCII characters) a repeat by ``user``
        with the same arguments, concurrent or not, returns the first call's run (as it
        is now) and creates nothing; other arguments are ``idempotency_mismatch``.

        ``priority`` (-10 to 10, default 0) orders the claims, highest first; ``start_at``
        (an aware ``datetime`` or ISO-8601 with a UTC offset) keeps the run ``queued``
        until then by the database's clock (reference §13)."""
        given: dict[str, Any] = {"limits": limits, "route": route, "thread_id": thread_id}
        given.update(if_busy=if_busy, idempotency_key=idempotency_key)
        given.update(priority=priority, start_at=start_at)
        return (await self.accept_run(user, question, **given)).run

    @opens
    async def accept_run(
        self,
        user: str,
        question: str,
        *,
        limits: Limits | dict[str, Any] | None = None,
        route: dict[str, Any] | None = None,
        thread_id: str | None = None,
        if_busy: str = "reject",
        idempotency_key: str | None = None,
        body: Any = None,
        priority: int | None = None,
        start_at: datetime | str | None = None,
    ) -> Accepted:
        """``start_run`` answered as a creation request (``Accepted``): the run and the
        answer first given for its ``idempotency_key``. ``body`` is the request as its
        caller sent it, compared as parsed JSON between repeats of the key (by default
        the arguments): the HTTP layer passes the request's JSON body."""
        return await creation.start_run(
            self._services,
            user,
            question,
            limits=limits,
            route=route,
            thread_id=thread_id,
            if_busy=if_busy,
            idempotency_key=idempotency_key,
            body=body,
            priority=priority,
            start_at=start_at,
        )
