"""A request for a human decision and its checks: what an approver sent, checked before
anything is claimed; the run a token or a pending call names; the edited arguments,
validated by the pending tool's schema.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.errors import InvalidInput, UnknownOrExpired
from tether.inputs import DIGEST, MAX_REASON_CHARS
from tether.messages import canonical_json
from tether.reasons import HaltReason
from tether.results import Choice
from tether.runs import Pending, Run, RunState, iso
from tether.store import Decision, TokenMatch
from tether.tools.tool import InvalidToolArguments

log = logging.getLogger(__name__)


MAX_ARGUMENTS_CHARS = 100_000


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A decision as an approver sent it, checked: the choice, who, why, the edited
    arguments (not yet validated against the tool) and the digest of what they saw."""

    choice: Choice
    approver: str
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    digest: str | None = None


def asked(
    decision: Any,
    approver: Any,
    *,
    reason: Any = None,
    arguments: Any = None,
    digest: Any = None,
) -> Asked:
    """Check what an approver sent (``invalid_input`` otherwise; nothing is claimed)."""
    if decision not in (c.value for c in Choice):
        raise InvalidInput("decision must be one of approve, decline")
    choice = Choice(decision)
    inputs.user_id(approver, "approver")
    if reason is not None:
        if not isinstance(reason, str):
            raise InvalidInput("reason must be a string")
        reason = inputs.text(reason, "reason", MAX_REASON_CHARS) if reason.strip() else None
    if arguments is not None:
        if choice is Choice.DECLINE:
            raise InvalidInput("arguments go with an approval only, not with a decline")
        checked_arguments(arguments)
    if digest is not None and (not isinstance(digest, str) or not DIGEST.fullmatch(digest)):
        raise InvalidInput("digest must be the 64 lowercase hex characters of a preview digest")
    return Asked(
        choice=choice, approver=approver, reason=reason, arguments=arguments, digest=digest
    )


def checked_arguments(arguments: Any) -> dict[str, Any]:
    """Edited arguments: a JSON object of bounded size."""
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object")
    try:
        size = len(canonical_json(arguments))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"arguments must be JSON: {exc}") from exc
    if size > MAX_ARGUMENTS_CHARS:
        raise InvalidInput(f"arguments must be at most {MAX_ARGUMENTS_CHARS} characters of JSON")
    return arguments


def decision_json(decision: Decision) -> dict[str, Any]:
    """A recorded decision as ``already_resumed`` answers carry it."""
    return {
        "decision": decision.decision,
        "by": decision.by,
        "at": iso(decision.at),
        "reason": decision.reason,
        "arguments": decision.arguments,
    }


def unknown_or_expired(expired: Run | None = None, approver: str | None = None) -> UnknownOrExpired:
    """The refusal of a token that names nothing the approver may decide. To the owner of
    the run whose suspension on it expired (and only to them: never reveal a run to
    anyone else), it also says the run halts ``suspension_expired`` and how to continue it."""
    if expired is None or approver is None or expired.user_id != approver:
        return UnknownOrExpired("this approval link is unknown or has expired")
    halted = expired.state is RunState.HALTED
    when = "is halted" if halted else "halts at the next expiry sweep"
    return UnknownOrExpired(
        f"this approval expired: run {expired.id} {when} as suspension_expired; you can "
        f"continue it with POST /v1/runs/{expired.id}/continue or tether continue {expired.id}",
        run_id=expired.id,
        state=expired.state.value,
        halt_reason=HaltReason.SUSPENSION_EXPIRED.value,
        tool_call_id=expired.pending.tool_call_id if expired.pending is not None else None,
    )


async def suspended_on(services: Services, run_id: str, tool_call_id: Any) -> TokenMatch:
    """What the call ``tool_call_id`` of the run names, as its token would: the run
    suspended on it (``run``, with the ``call``) while undecided inside the window, the
    decision recorded on it, or the run whose suspension expired."""
    if not isinstance(tool_call_id, str) or not 0 < len(tool_call_id) <= 128:
        raise unknown_or_expired()
    return await hop(services.store.match_call, inputs.run_id(run_id), tool_call_id)


async def find_suspended(services: Services, token_hash: str) -> TokenMatch:
    """What a token names (``Store.match_token``): the run suspended on it inside its
    window by the database's clock, the decision that used it, or the run whose suspension
    on it expired; read once for all the callers of that token in flight here. The one
    expiry check deciding and previewing share before the claim (which checks it again).
    A shared read is as good as a caller's own: a token exists only once its suspension
    is durable, and a read that found it unused started after the first caller had it."""
    found, _ = await services.single_flight.run(
        ("find", token_hash), lambda: hop(services.store.match_token, token_hash)
    )
    return found


def tool_arguments(services: Services, pending: Pending, arguments: dict[str, Any]) -> BaseModel:
    """``arguments`` validated by the pending call's tool (``invalid_input`` if they do not
    fit its schema, or the tool is not served here)."""
    tool = services.agent.tool(pending.tool)
    if tool is None:
        raise InvalidInput(f"the pending tool {pending.tool!r} is not served here")
    try:
        return tool.validate(arguments)
    except InvalidToolArguments as exc:
        raise InvalidInput(exc.message) from exc
