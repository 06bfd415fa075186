"""How the inbox renders: Jinja templates (autoescaped, with the filters of ``shown`` that
show stored values to people), the security headers of every page, and the shared message
pages."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from fastapi import Request
from fastapi.responses import Response
from fastapi.templating import Jinja2Templates

from tether.agent import Agent
from tether.api.headers import CONTENT_SECURITY_POLICY
from tether.api.web import shown
from tether.api.web.deciders import Deciders, Who, deciders_of, who_may
from tether.api.web.forms import EditField, edit_fields
from tether.api.web.shown import time_left
from tether.engine import Engine
from tether.results import TokenLookup
from tether.runs import Pending, PendingCall, Run, RunState

if TYPE_CHECKING:
    from tether.api.web.sign_in import SignIn

# The templates and the stylesheet live beside the API package.
ASSETS = Path(__file__).parent.parent

# The Content-Security-Policy of every answer (``tether.api.headers``), no caching, no
# framing (clickjacking the Approve button), and the token in an approval URL never leaves
# in a Referer.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ASSETS / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=shown.finalize,
    )
    env.filters["show"] = shown.show
    env.filters["visible"] = shown.visible
    env.filters["when"] = shown.when
    env.filters["ticks"] = shown.ticks
    env.globals["columns"] = shown.columns
    env.globals["hides"] = shown.hides
    return env


templates = Jinja2Templates(env=_environment())


# -- a pending request -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where a request's forms post: its approval link, or (from the inbox, which has no
    token) its run, with the call and the preview digest the page showed."""

    decide: str
    preview: str
    hidden: tuple[tuple[str, str], ...]
    # The field that carries the digest of a re-rendered (edited) preview.
    edited_digest: str
    # Prefix of the page element ids of this request's forms (an inbox shows many).
    key: str
    back: str


def token_target(token: str) -> Target:
    return Target(
        decide=f"/approve/{token}",
        preview=f"/approve/{token}/preview",
        hidden=(),
        edited_digest="digest",
        key="request",
        back=f"/approve/{token}",
    )


def run_target(run_id: str, tool_call_id: str, digest: str, position: int = 0) -> Target:
    return Target(
        decide=f"/runs/{run_id}/decision",
        preview=f"/runs/{run_id}/preview",
        hidden=(("tool_call_id", tool_call_id), ("digest", digest)),
        edited_digest="approved_digest",
        key=f"run-{run_id}-{position}",
        back=f"/#run-{run_id}",
    )


def tool_parameters(agent: Agent, name: str) -> dict[str, Any] | None:
    """The JSON schema of the arguments of ``agent``'s tool ``name`` (None if it has no
    such tool), from the specs the agent builds once."""
    spec = next((spec for spec in agent.tool_specs if spec.name == name), None)
    return spec.parameters if spec is not None else None


@dataclass(frozen=True, kw_only=True)
class PendingView:
    """One pending call of a suspended run as a page shows it: the stored call and its
    window, where its forms post, and its arguments as edit-form controls; or, once it is
    decided, its decision (and no form)."""

    run: Run
    call: Pending
    mine: bool
    left: str
    target: Target
    fields: tuple[EditField, ...] = ()
    # False when the viewer is the owner and the call's tool wants someone else to decide
    # it (four eyes): the request is shown waiting, with no form.
    decides: bool = True
    # The call's recorded decision, ``{"decision", "by", "at"}``, while the turn waits for
    # its other calls (reference §15); None while undecided.
    decided: dict[str, Any] | None = None
    # Who decides it, for a call that waits on a quorum or was escalated (reference §19).
    deciders: Deciders | None = None

    @property
    def approves(self) -> bool:
        """Whether the viewer may approve it now: they decide it and have not approved its
        current artefact yet (each person counts once toward a quorum)."""
        return self.decides and not (self.deciders is not None and self.deciders.approved)


def _open(run: Run | None, now: float) -> bool:
    """Whether ``run`` is suspended inside its window (judged by the database's clock)."""
    if run is None or run.state is not RunState.SUSPENDED:
        return False
    return run.expires_at is not None and run.expires_at > now


async def token_view(
    engine: Engine, lookup: TokenLookup, viewer: str, token: str
) -> PendingView | None:
    """The pending call an approval link names (``lookup``: what its token names now) as
    ``viewer`` sees it, with who may still approve it."""
    return pending_view(
        lookup.run,
        viewer,
        lookup.now,
        agent=engine.agent,
        token=token,
        call=lookup.call,
        who=await who_may(engine, [lookup.run]),
    )


def pending_view(
    run: Run | None,
    viewer: str,
    now: float,
    *,
    agent: Agent,
    token: str | None = None,
    call: Pending | None = None,
    who: Who = None,
) -> PendingView | None:
    """The run's pending ``call`` (default: the first of its turn still undecided) as
    ``viewer`` sees it, its forms posting to ``token``'s link if given, else to the run,
    with who may still approve it (``who``); None unless the run is suspended inside its
    window, on such a call."""
    if run is None or not _open(run, now):
        return None
    undecided = run.undecided_calls()
    if call is None:
        call = undecided[0] if undecided else None
    elif run.pending_calls and call.tool_call_id not in {c.tool_call_id for c in undecided}:
        return None  # decided meanwhile (a read without the calls trusts the caller's)
    if call is None:
        return None
    entry = next(
        (c for c in run.suspension_calls() if c.pending.tool_call_id == call.tool_call_id), None
    )
    return _call_view(run, call, viewer, now, agent=agent, token=token, entry=entry, who=who)


def undecided_call(run: Run | None, tool_call_id: str) -> Pending | None:
    """The undecided call ``tool_call_id`` of ``run``'s suspension, if it has one."""
    calls = run.undecided_calls() if run is not None else ()
    return next((c for c in calls if c.tool_call_id == tool_call_id), None)


def _call_view(
    run: Run,
    pending: Pending,
    viewer: str,
    now: float,
    *,
    agent: Agent,
    token: str | None = None,
    position: int = 0,
    decided: dict[str, Any] | None = None,
    entry: PendingCall | None = None,
    who: Who = None,
) -> PendingView:
    # A child's call is of its sub-agent's tool (reference §18).
    parameters = tool_parameters(agent.agent_of(run.agent_version), pending.tool)
    fields = edit_fields(parameters, pending.arguments) if parameters is not None else ()
    if token is not None:
        target = token_target(token)
    else:
        target = run_target(run.id, pending.tool_call_id, pending.digest or "", position)
    assert run.expires_at is not None
    return PendingView(
        run=run,
        call=pending,
        mine=run.user_id == viewer,
        left=time_left(run.expires_at - now),
        target=target,
        fields=fields,
        decides=agent.may_decide_call(pending.tool, run.user_id, viewer),
        decided=decided,
        deciders=deciders_of(run, entry, viewer, who, agent=agent) if entry else None,
    )


@dataclass(frozen=True, kw_only=True)
class TurnView:
    """A suspended run's turn as a page shows it (reference §15): every call its suspension
    waits on, in call order, each with its own form or its decision; and, when the viewer
    decides two or more of the undecided ones, a form that decides them all at once."""

    run: Run
    calls: tuple[PendingView, ...]
    mine: bool
    left: str

    @property
    def waiting(self) -> int:
        """How many calls of the turn have no decision yet."""
        return sum(1 for view in self.calls if view.decided is None)

    @property
    def first(self) -> PendingView:
        """The first call still undecided (a turn view has one)."""
        return next(view for view in self.calls if view.decided is None)

    @property
    def batch(self) -> tuple[PendingView, ...]:
        """The undecided calls the viewer decides, for the decide-all form (none unless
        there are two or more)."""
        mine = tuple(view for view in self.calls if view.decided is None and view.approves)
        return mine if len(mine) > 1 else ()


def turn_view(
    run: Run | None, viewer: str, now: float, *, agent: Agent, who: Who = None
) -> TurnView | None:
    """Every call of the run's suspension as ``viewer`` sees it, with who may still approve
    each (``who``); None unless the run is suspended inside its window with a call still
    undecided."""
    if run is None or not _open(run, now) or not run.undecided_calls():
        return None
    calls = tuple(
        _call_view(
            run,
            c.pending,
            viewer,
            now,
            agent=agent,
            position=i,
            decided=c.decided,
            entry=c,
            who=who,
        )
        for i, c in enumerate(run.suspension_calls())
    )
    assert run.expires_at is not None
    left = time_left(run.expires_at - now)
    return TurnView(run=run, calls=calls, mine=run.user_id == viewer, left=left)


# -- pages -------------------------------------------------------------------------------


def page(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    session: SignIn | None,
    status: int = 200,
) -> Response:
    """A rendered page with the security headers every page carries."""
    response = templates.TemplateResponse(
        request, name, {"session": session, **context}, status_code=status
    )
    response.headers.update(PAGE_HEADERS)
    return response


def message(
    request: Request,
    session: SignIn | None,
    status: int,
    title: str,
    text: str,
    *,
    kind: str = "info",
    sign_in: str | None = None,
) -> Response:
    """A page that only says something (a refusal, a missing page, a sign-in prompt)."""
    context = {"title": title, "text": text, "kind": kind, "sign_in": sign_in}
    return page(request, "message.html", context, session=session, status=status)


def unknown_or_expired(
    request: Request, session: SignIn | None, expired_run: str | None = None
) -> Response:
    """The one answer for a token that is unknown, expired, or not the viewer's to see: it
    never reveals whether the run exists. Only to the owner of the run whose request
    expired (``expired_run``, which the engine names to its owner alone) it says so, and
    how to continue the run."""
    if expired_run is not None:
        return message(
            request,
            session,
            404,
            "This request expired",
            f"Nobody decided it in time, so run {expired_run} is halted as "
            "suspension_expired. You can continue it (POST /v1/runs/"
            f"{expired_run}/continue, or tether continue {expired_run}).",
            kind="refused",
        )
    return message(
        request,
        session,
        404,
        "Unknown or expired",
        "This approval link is unknown or has expired.",
        kind="refused",
    )


def not_from_this_session(request: Request, session: SignIn) -> Response:
    return message(
        request,
        session,
        403,
        "Refused",
        "Nothing was done: this form was not sent from your own session's page.",
        kind="refused",
    )


def sign_in_first(request: Request, sign_in: str, nothing: str) -> Response:
    """A POST to an approval link without a session: ``nothing`` was done; sign in."""
    return message(
        request,
        None,
        403,
        "Sign in first",
        f"Nothing was {nothing}: sign in, then come back to the request's page.",
        kind="refused",
        sign_in=sign_in,
    )


def outcome(request: Request, session: SignIn, status: int, kind: str, **context: Any) -> Response:
    """The page that reports what became of a decision (or why there was none); ``back``
    (a ``back.RunLink``) leads to its run."""
    context = {"outcome": kind, "back": None, **context}
    return page(request, "outcome.html", context, session=session, status=status)
