"""``tether approvals``: the pending requests, found without reading a log, and a token's
preview; and ``tether approve --run``, a decision by run and pending call instead of the
token. Operator commands: like ``tether approve``, they act as the run's owner unless
``--as`` names another user. Like the rest of the CLI they use nothing but the ``Engine``,
imported by each command when it runs (``tether.cli.wiring``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tether.cli.shared import (
    DEFAULT_AGENT,
    AgentOpt,
    OwnerOpt,
    as_option,
    emit,
    err,
    out,
    say_error,
)
from tether.errors import (
    DatabaseUnavailable,
    FourEyes,
    InvalidInput,
    TetherError,
    UnknownOrExpired,
)
from tether.telemetry.logs import configure
from tether.visible import has_hidden, segments

if TYPE_CHECKING:
    from tether.engine import Engine
    from tether.runs import PendingCall, Run

approvals_app = typer.Typer(
    help="Find the pending requests and preview them.", no_args_is_help=True
)


@approvals_app.command("list")
def approvals_list(
    as_user: Annotated[
        str | None,
        as_option("(only the requests they may decide; default: every open request)"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many")] = 100,
    after: Annotated[
        str | None, typer.Option(help="the page after this cursor (a page's `after`)")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help='print {"items": [...], "more": N, "after": CURSOR}')
    ] = False,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Pending requests inside their window, soonest expiry first, one per undecided call
    of a run's turn: every open request (the operator's view), or with --as those USER may
    decide, by each owner's scope now (the agent's lifespan runs for it: the demo's starts
    its sandbox). Each shows the run's question, the call's tool and its preview, and is
    decided with tether approve --run RUN_ID --call ID (--limit counts runs; --after
    CURSOR is the next page). A call that waits on several approvals shows how many it
    has and whose; an escalated call says since when."""
    configure("WARNING")
    from tether.cli.wiring import on_engine
    from tether.runs import request_to_json

    def listed(engine: Engine) -> Any:
        if as_user is None:
            return engine.operator.pending_approvals(after=after, limit=limit)
        return engine.pending_approvals(as_user, after=after, limit=limit)

    # Whose requests ``--as`` may see is a question for each owner's scope, which the agent
    # answers inside its lifespan (the demo asks its CRM): as ``approve`` does.
    found = on_engine(agent, listed, serve_agent=as_user is not None)
    # One request per undecided call of each run's turn (reference §15).
    requests = [(run, c) for run in found for c in run.suspension_calls() if c.decided is None]
    if as_json:
        items = [request_to_json(run, call) for run, call in requests]
        emit({"items": items, "more": found.more, "after": found.after})
        return
    if not requests:
        out.print("Nothing is waiting for a decision.")
    for run, call in requests:
        out.print(described(run, call), soft_wrap=True, highlight=False)
    if requests:
        out.print("Decide one with: tether approve --run RUN --call CALL", highlight=False)
    if found.more:
        out.print(f"{found.more} more: --after {found.after}", highlight=False)


def described(run: Run, waiting: PendingCall) -> Text:
    """One request as a person reads it before deciding: whose run and until when, the
    run's question, the tool and what it would do (its preview, else its arguments), who
    decides it so far (reference §19), with the ids to decide it by. Hidden characters are
    shown escaped and flagged (``tether.visible``), so what is read is what is approved."""
    from tether.runs import iso

    call = waiting.pending
    shown = call.preview if call.preview is not None else call.arguments
    label = "preview" if call.preview is not None else "arguments"
    text = Text()
    _visible(text, f"run {run.id}  call {call.tool_call_id}", style="bold")
    _visible(text, f"  {run.user_id}  expires {iso(run.expires_at) or '-'}\n")
    rows = [("question", run.question), ("tool", call.tool)]
    rows.append((label, json.dumps(shown, ensure_ascii=False)))
    rows.extend(deciders_rows(waiting))
    for name, value in rows:
        text.append(f"  {name:<9} ")
        _visible(text, value.replace("\n", "\n            "))
        text.append("\n")
    if has_hidden([run.question, call.tool, call.tool_call_id, run.user_id, shown, rows]):
        text.append("  ! hidden characters are shown escaped, as \\uXXXX\n", style="yellow")
    return text


def deciders_rows(waiting: PendingCall) -> list[tuple[str, str]]:
    """Who decides a call so far (reference §19), as rows of its description: a quorum's
    approvals ("1 of 2 approvals: boss"), and when it was escalated."""
    from tether.runs import iso

    rows = []
    quorum, approvals = waiting.pending.quorum, [str(a["by"]) for a in waiting.approvals]
    if quorum > 1 or approvals:
        named = f": {', '.join(approvals)}" if approvals else ""
        rows.append(("quorum", f"{len(approvals)} of {quorum} approvals{named}"))
    if waiting.escalated_at is not None:
        rows.append(("escalated", f"at {iso(waiting.escalated_at)}"))
    return rows


def _visible(text: Text, value: str, style: str = "") -> None:
    """``value`` appended to ``text``, each hidden character as its escape in reverse video."""
    for piece, hidden in segments(value):
        text.append(piece, style="reverse yellow" if hidden else style)


@approvals_app.command("preview")
def approvals_preview(
    token: Annotated[str, typer.Argument(help="the token of the notice")],
    arguments: Annotated[
        str | None,
        typer.Option(metavar="JSON", help="preview these edited arguments (a JSON object)"),
    ] = None,
    as_user: OwnerOpt = None,
    agent: AgentOpt = DEFAULT_AGENT,
) -> None:
    """Print the preview a pending request has (with --arguments: would have) and its
    digest, to approve with tether approve TOKEN --digest HEX. Changes nothing. Exit 1
    with the error code when the token is unknown or expired."""
    configure("WARNING")
    from tether.cli.wiring import on_engine

    async def shown(engine: Engine) -> dict[str, Any] | TetherError:
        try:
            edited = None if arguments is None else json_arg(arguments, "--arguments")
            viewer = as_user or await engine.operator.token_owner(token)
            if viewer is None:
                raise UnknownOrExpired("this token is unknown or expired")
            return (await engine.preview_approval(token, viewer, edited)).to_json()
        except TetherError as exc:
            return exc

    finish(on_engine(agent, shown))


async def decide_by_token(
    engine: Engine, *, token: str, entry: dict[str, Any], as_user: str | None
) -> dict[str, Any] | TetherError:
    """``tether approve TOKEN``: the decision ``entry`` on the call the token names, as the
    run's owner unless ``as_user`` names another; its answer, or its refusal."""
    try:
        approver = as_user or await engine.operator.token_owner(token)
        if approver is None:
            raise UnknownOrExpired("this token is unknown or expired")
        result = await engine.resume_after_confirmation(
            token,
            entry["decision"],
            approver,
            reason=entry["reason"],
            arguments=entry.get("arguments"),
            digest=entry["digest"],
        )
    except FourEyes as exc:
        if as_user is None:  # acting as the owner by default
            exc.message += "; name one of them with --as USER"
        return exc
    except TetherError as exc:
        return exc
    return result.to_json()


async def decide_by_run(
    engine: Engine,
    *,
    run_id: str,
    tool_call_id: str | None,
    entry: dict[str, Any],
    as_user: str | None,
) -> dict[str, Any] | TetherError:
    """``tether approve --run``: the decision ``entry`` on ``tool_call_id`` (default: the
    run's only undecided call; a turn waiting on several must name one, reference §15), as
    the run's owner unless ``as_user`` names another; the call's answer, or its refusal."""
    from tether.runs import RunState

    try:
        run = (await engine.get_run(run_id)).run
        if tool_call_id is None:
            tool_call_id = only_undecided(run) if run.state is RunState.SUSPENDED else None
            if tool_call_id is None:
                raise UnknownOrExpired("this run waits on no pending request")
        (answer,) = await engine.decide_calls(
            run_id, as_user or run.user_id, [{**entry, "tool_call_id": tool_call_id}]
        )
    except TetherError as exc:
        return exc
    if answer.refused is not None:
        answer.refused.details.setdefault("tool_call_id", tool_call_id)
        return answer.refused
    return answer.to_json()


def only_undecided(run: Run) -> str | None:
    """The id of the run's one undecided pending call; ``invalid_input`` naming them when
    its turn waits on several."""
    waiting = [call.tool_call_id for call in run.undecided_calls()]
    if len(waiting) > 1:
        named = ", ".join(waiting)
        raise InvalidInput(
            f"this run's turn waits on {len(waiting)} calls ({named}): name one with --call ID"
        )
    return waiting[0] if waiting else None


def finish(answer: dict[str, Any] | TetherError) -> None:
    """Print a decision's or a preview's answer; exit 1 with the code when refused (a
    database that cannot be reached is not a refusal: ``main`` says where it is)."""
    if isinstance(answer, DatabaseUnavailable):
        raise answer
    if isinstance(answer, TetherError):
        say_error("refused", answer.code, answer.message)
        emit(answer.to_dict())
        raise typer.Exit(1)
    emit(answer)
    if answer.get("outcome") == "recorded" and answer.get("approvals") is not None:
        # Counted toward a quorum (reference §19): the call is not carried out yet.
        err.print(
            f"recorded: {answer['approvals']} of {answer['quorum']} approvals; the call "
            "waits for the rest",
            markup=False,
            highlight=False,
        )


def json_arg(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{option} must be JSON: {exc}") from exc
