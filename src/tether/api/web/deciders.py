"""Who decides a pending call, as the inbox's pages show it (reference §19): a call that
waits on a quorum shows how many approvals it needs, who approved its current artefact so
far and when, and who may still approve it; an escalated call shows when it was escalated
and to whom. Read from the stored call, and who may still approve from the owner's scope
now (``Engine.web.still_approving``); a group is shown as "anyone in group NAME", never
resolved into its members."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tether.agent import Agent
from tether.engine import Engine
from tether.errors import TetherError
from tether.runs import PendingCall, Run
from tether.scope import GROUP

log = logging.getLogger(__name__)

# Who may still approve each call (user names and ``group:NAME``), by run id and tool call
# id; None when an owner's scope could not be resolved just now.
Who = Mapping[tuple[str, str], tuple[str, ...]] | None


@dataclass(frozen=True, kw_only=True)
class Approval:
    """One approval of the call's current artefact: by whom, and when (for people)."""

    by: str
    at: str
    you: bool


@dataclass(frozen=True, kw_only=True)
class Deciders:
    """Who decides one pending call that waits on a quorum or was escalated."""

    quorum: int
    approvals: tuple[Approval, ...]
    # Who may still approve it, in words ("boss", "anyone in group finance"); None when
    # it is not known right now (the owner's scope could not be resolved).
    still: tuple[str, ...] | None
    escalated_at: float | None
    # Whom the escalation named, in words (empty unless escalated).
    escalated_to: tuple[str, ...]
    # The viewer approved its current artefact already: each person counts once.
    approved: bool

    @property
    def more(self) -> int:
        """How many more approvals it waits for."""
        return max(self.quorum - len(self.approvals), 0)


async def who_may(engine: Engine, runs: Sequence[Run | None]) -> Who:
    """Who may still approve the quorum and escalated calls of ``runs`` now; None (the
    pages then say it is not known) when a scope cannot be resolved: a page of requests
    still shows them."""
    listed = [run for run in runs if run is not None]
    try:
        return await engine.web.still_approving(listed)
    except TetherError as exc:
        log.warning("who may approve is not known", extra={"action": "inbox", "error": exc.code})
        return None


def person(name: str, viewer: str, owner: str) -> str:
    """A user name or ``group:NAME`` of a scope or an escalation, in words."""
    if name.startswith(GROUP):
        return f"anyone in group {name.removeprefix(GROUP)}"
    if name == viewer:
        return f"{name} (you)"
    return f"{name} (who asked)" if name == owner else name


def deciders_of(
    run: Run, call: PendingCall, viewer: str, who: Who, *, agent: Agent
) -> Deciders | None:
    """``call`` of ``run`` as ``viewer`` sees who decides it; None for a call that one
    person decides and that was not escalated."""
    if call.pending.quorum <= 1 and call.escalated_at is None:
        return None
    approvals = tuple(
        Approval(by=str(a.get("by")), at=_at(a.get("at")), you=a.get("by") == viewer)
        for a in call.approvals
    )
    still = None
    if who is not None:
        names = _people_first(who.get((run.id, call.pending.tool_call_id), ()))
        still = tuple(person(name, viewer, run.user_id) for name in names)
    escalated_to: tuple[str, ...] = ()
    if call.escalated_at is not None:
        tool = agent.agent_of(run.agent_version).tool(call.pending.tool)
        named = _people_first(tool.escalate_to if tool is not None else ())
        escalated_to = tuple(person(name, viewer, run.user_id) for name in named)
    return Deciders(
        quorum=call.pending.quorum,
        approvals=approvals,
        still=still,
        escalated_at=call.escalated_at,
        escalated_to=escalated_to,
        approved=any(a.you for a in approvals),
    )


def _people_first(names: Sequence[str]) -> list[str]:
    """``names`` with the people before the groups, each in the order given."""
    return sorted(names, key=lambda name: name.startswith(GROUP))


def _at(stamp: object) -> str:
    """An approval's ISO time, for people."""
    return str(stamp)[:19].replace("T", " ") + " UTC" if stamp else "—"
