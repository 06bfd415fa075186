"""The ``Engine``'s decision methods (reference §4, §9): deciding a suspended run by token
or by run and pending call, previewing an edit, and what an approver may see and decide.
``Engine`` is made of this group and its own methods; each calls into this room."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tether import inputs
from tether._runtime.opening import opens
from tether.approvals import batch, inbox, preview, resume
from tether.approvals.request import asked
from tether.results import ApprovalPreview, ApprovalResult, CallDecision, Inbox, TokenLookup

if TYPE_CHECKING:
    from tether._runtime.shared.services import Services
    from tether.runs import Run


class DecisionMethods:
    """Mixed into ``Engine``: it supplies ``_services``, ``worker_id`` and ``open()``."""

    _services: Services

    @property
    def worker_id(self) -> str:
        raise NotImplementedError

    async def open(self) -> None:
        raise NotImplementedError

    @opens
    async def resume_after_confirmation(
        self,
        token: str,
        decision: str,
        approver: str,
        *,
        reason: str | None = None,
        arguments: dict[str, Any] | None = None,
        digest: str | None = None,
    ) -> ApprovalResult:
        """Carry out a human decision on a suspended run (reference §4, §9): with a reason, and
        for an approval the approver's edited ``arguments`` and the ``digest`` of the
        preview of that edit they saw."""
        ask = asked(decision, approver, reason=reason, arguments=arguments, digest=digest)
        return await resume.by_token(self._services, self.worker_id, token, ask)

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
        """The same decision by run and pending call instead of the token (the token is
        never stored, so an inbox cannot have it): ``shown_digest`` is the digest of the
        pending preview the approver was shown (a request re-suspended on another preview
        since is not decided by that click); ``digest``, as for a token, the digest of the
        preview of their edit. This is the one decision by run: ``decide_calls`` (several
        calls, ``POST /v1/runs/{id}/decisions``) makes each of its decisions through it."""
        ask = asked(decision, approver, reason=reason, arguments=arguments, digest=digest)
        return await resume.by_run(
            self._services, self.worker_id, run_id, tool_call_id, shown_digest, ask
        )

    @opens
    async def preview_approval(
        self, token: str, approver: str, arguments: dict[str, Any] | None = None
    ) -> ApprovalPreview:
        """The pending call's preview with ``arguments`` (default: as pending), and its
        digest; never claims, never changes anything (reference §9)."""
        return await preview.by_token(self._services, token, approver, arguments)

    @opens
    async def preview_by_run(
        self,
        run_id: str,
        approver: str,
        *,
        tool_call_id: str,
        arguments: dict[str, Any] | None = None,
    ) -> ApprovalPreview:
        """``preview_approval`` for the inbox, by run and pending call."""
        return await preview.by_run(
            self._services, run_id, approver, tool_call_id=tool_call_id, arguments=arguments
        )

    async def may_decide(self, owner: str, approver: str, *, tool: str | None = None) -> bool:
        """Whether ``approver`` may decide ``owner``'s pending calls, by the scope now; with
        ``tool``, a call of that tool (whose rule may want someone other than the owner)."""
        return await inbox.may_decide(self._services, owner, approver, tool=tool)

    @opens
    async def decide_calls(
        self, run_id: str, approver: str, decisions: Sequence[Mapping[str, Any]]
    ) -> list[CallDecision]:
        """Decide pending calls of one run by their tool call ids (reference §6, §15): each
        entry ``{"tool_call_id", "decision", "reason"?, "arguments"?, "digest"?}`` as a
        token's decision. All are checked before any is recorded (``invalid_input``);
        ``not_found`` when ``approver`` may neither own nor approve the run. Each call's
        answer is its own: the decision carried out, or its refusal (reference §4)."""
        return await batch.decide_calls(self._services, self.worker_id, run_id, approver, decisions)

    @opens
    async def pending_approvals(self, approver: str, *, limit: int = 100, offset: int = 0) -> Inbox:
        """A page of the suspended runs inside their window that ``approver`` owns or may
        decide, soonest expiry first, after the first ``offset``; ``more`` says how many
        follow (iterate it like a list)."""
        return await inbox.pending_approvals(
            self._services, inputs.user_id(approver, "approver"), limit=limit, offset=offset
        )

    @opens
    async def open_approvals(self, *, limit: int = 100, offset: int = 0) -> Inbox:
        """Every open request, whoever may decide it: the operator's view (``tether
        approvals list``), paged like ``pending_approvals``."""
        return await inbox.pending_approvals(self._services, None, limit=limit, offset=offset)

    @opens
    async def approval_request(self, token: str, approver: str) -> TokenLookup:
        """What an approval token names now, as ``approver`` may see it (a request they may
        not decide shows as nothing). Never changes anything."""
        return await inbox.approval_request(self._services, token, approver)

    @opens
    async def request_of_run(self, run_id: str, tool_call_id: str, approver: str) -> Run | None:
        """The run when it is suspended on ``tool_call_id`` and ``approver`` may decide it."""
        return await inbox.request_of_run(self._services, run_id, tool_call_id, approver)

    @opens
    async def token_owner(self, token: str) -> str | None:
        """The user whose run a token belongs to (pending or used), for the operator CLI."""
        return await inbox.token_owner(self._services, token)
