"""The HTTP and inbox side of an ``Engine`` (``Engine.web``): what a server calls besides
the application's methods. A key's user and the inbox's sign-ins (a server-side row per
sign-in, checked on every use, ended by signing out or when the key goes), creation
answered as a request (``Idempotency-Key``), and the inbox's decisions and previews by run
and pending call, since an inbox never holds the token (reference §4, §6, §9, §14)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tether import inputs
from tether._runtime.control import creation
from tether._runtime.hop import hop
from tether.approvals import inbox, preview, resume
from tether.approvals.request import asked
from tether.budget import Limits
from tether.engine.opening import Side, opens
from tether.errors import InvalidInput
from tether.results import Accepted, ApprovalPreview, ApprovalResult, TokenLookup
from tether.store.users import hash_key

if TYPE_CHECKING:
    from tether.runs import Run

MAX_SID_CHARS = 128
MAX_KEY_CHARS = 512


class WebSide(Side):
    """What the HTTP API and the inbox call on an engine (``Engine.web``)."""

    # -- who is calling ----------------------------------------------------------------------

    async def user_for_key(self, key: str) -> str | None:
        """The user an API key belongs to, or None (for anything that is no key)."""
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            return None
        try:
            inputs.storable(key, "key")
        except InvalidInput:  # no stored key holds one, and a header is not an input error
            return None
        return await self._user_of_key(key)

    @opens
    async def _user_of_key(self, key: str) -> str | None:
        return await hop(self._services.store.user_for_key, key)

    @opens
    async def sign_in(self, key: str, ttl_s: float) -> tuple[str, str] | None:
        """Sign in to the inbox with an API key: ``(user, sign-in id)`` for ``ttl_s``
        seconds, or None for a key that is no key. Only the id's hash is stored."""
        if not isinstance(key, str) or not key:
            return None
        sid = secrets.token_urlsafe(24)
        user = await hop(self._services.store.open_sign_in, key, hash_key(sid), ttl_s)
        return None if user is None else (user, sid)

    @opens
    async def signed_in_user(self, sid: str) -> str | None:
        """The user of a live sign-in; None once it was ended, expired, or its key
        removed."""
        if not isinstance(sid, str) or not sid or len(sid) > MAX_SID_CHARS:
            return None
        return await hop(self._services.store.sign_in_user, hash_key(sid))

    @opens
    async def sign_out(self, sid: str) -> None:
        """End a sign-in: it no longer works, anywhere. Safe twice."""
        if isinstance(sid, str) and sid and len(sid) <= MAX_SID_CHARS:
            await hop(self._services.store.end_sign_in, hash_key(sid))

    # -- creating ----------------------------------------------------------------------------

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
        """``Engine.start_run`` answered as a creation request (``Accepted``): the run and
        the answer first given for its ``idempotency_key``. ``body`` is the request as
        its caller sent it, compared as parsed JSON between repeats of the key (by default
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

    # -- deciding by run ---------------------------------------------------------------------

    @opens
    async def resume_by_run(
        self,
        run_id: str,
        decision: str,
        approver: str,
        *,
        tool_call_id: str,
        shown_digest: str | None,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        digest: str | None = None,
    ) -> ApprovalResult:
        """``Engine.resume_after_confirmation`` by run and pending call instead of the token
        (the token is never stored, so an inbox cannot have it): ``shown_digest`` is the
        digest of the pending preview the approver was shown (a request re-suspended on
        another preview since is not decided by that click); ``digest``, as for a token,
        the digest of the preview of their edit. ``Engine.decide_calls`` makes each of its
        decisions through the same path."""
        ask = asked(decision, approver, reason=reason, arguments=arguments, digest=digest)
        worker = self._engine.runner.worker_id
        return await resume.by_run(self._services, worker, run_id, tool_call_id, shown_digest, ask)

    @opens
    async def preview_by_run(
        self,
        run_id: str,
        approver: str,
        *,
        tool_call_id: str,
        arguments: dict[str, Any] | None = None,
    ) -> ApprovalPreview:
        """``Engine.preview_approval`` by run and pending call."""
        return await preview.by_run(
            self._services, run_id, approver, tool_call_id=tool_call_id, arguments=arguments
        )

    @opens
    async def approval_request(self, token: str, approver: str) -> TokenLookup:
        """What an approval token names now, as ``approver`` may see it (a request they may
        not decide shows as nothing). Never changes anything."""
        return await inbox.approval_request(self._services, token, approver)

    @opens
    async def request_of_run(self, run_id: str, tool_call_id: str, approver: str) -> Run | None:
        """The run when it is suspended on ``tool_call_id`` and ``approver`` may decide it."""
        return await inbox.request_of_run(self._services, run_id, tool_call_id, approver)

    async def still_approving(self, runs: Sequence[Run]) -> dict[tuple[str, str], tuple[str, ...]]:
        """Who may still approve each undecided call of ``runs`` that waits on a quorum or
        was escalated (reference §19), by run id and tool call id: user names and
        ``group:NAME``, the people who approved its current artefact left out; for the
        inbox to show. ``scope_unavailable`` (or the resolver's code) when an owner's
        scope cannot be resolved now."""
        return await inbox.still_approving(self._services, runs)
